"""What a request's trace says of it (``routerd.tracing``): its span on this node, opened as it
arrives and closed with why it went where it went, and the span of the routing choice.  The front
calls these only when tracing is on (a call's span is otherwise the no-op)."""

from __future__ import annotations

import time
from collections.abc import Mapping

from routerd.inference.ending import Handling
from routerd.lending.offload import Borrowed
from routerd.routing.call import Call, Incoming
from routerd.routing.choice import Forward, Guardian, Local, Refuse, RoutingView, Target, choose
from routerd.routing.classify import Route
from routerd.tracing import NO_SPAN, TRACEPARENT, Span, Tracer, Value
from routerd.wire.status import RuntimeStatus

#: The span names (contract §2 "Tracing" table).
REQUEST_SPAN = "routerd.request"
CHOICE_SPAN = "routerd.route_choice"


def request_span(tracer: Tracer, incoming: Incoming, route: Route, request_id: str,
                 borrowed: Borrowed | None) -> Span:
    """The span of one request this node got, a child of the caller's ``traceparent`` if it sent one."""
    # the node is the exporter's resource (service.instance.id), not an attribute of each span
    attributes: dict[str, Value] = {"routerd.request_id": request_id, "routerd.route": route.kind,
                                    "url.path": incoming.path}
    if incoming.key_name:
        attributes["routerd.key_name"] = incoming.key_name  # the key's name, never the key
    if borrowed is not None:
        attributes["routerd.lent_from"] = f"{borrowed.owner_node_id}/{borrowed.owner_model_id}"
    return tracer.request(REQUEST_SPAN, incoming.header(TRACEPARENT), attributes)


def end_request_span(handling: Handling, now: float) -> None:
    """Close the request's span (at ``now``) with what happened to it."""
    span, call = handling.trace, handling.call
    if call is not None:
        outcome = call.outcome
        ended: dict[str, Value] = {key: value for key, value in (
            ("routerd.model", call.selector or ""), ("routerd.public_model", call.public_model),
            ("routerd.model_id", call.model_id), ("routerd.forwarded_to", call.forwarded_to),
            ("routerd.lent_to", call.lent_to), ("routerd.lent_from", call.lent_from)) if value}
        ended["routerd.class"] = call.priority
        ended["routerd.status"] = outcome.status
        ended["http.response.status_code"] = outcome.http_status
        if call.guardian:
            ended["routerd.guardian"] = True
        if call.serving_since is not None and outcome.status == "ok":
            ended["routerd.measured_s"] = max(0.0, now - call.serving_since)
        span.update(ended)
        span.end("" if outcome.http_status < 500 else outcome.status)
    else:  # refused before it was routed (its body or selector): the answer says why
        span.set("routerd.status", "refused")
        span.end()


def traced_choice(call: Call, view: RoutingView,
                  statuses: Mapping[str, RuntimeStatus] | None = None) -> Target:
    """:func:`~routerd.routing.choice.choose`, and what it chose and why in the trace.

    The choice has a span of its own when it chose: a master's among its site's nodes and replicas,
    a guardian, a refusal, a model-less pass-through.  A node serving the model the request named
    from its own catalog chose nothing: the request's span says ``routerd.target`` ``local``."""
    trace = call.trace
    if trace is NO_SPAN:
        return choose(call, view, statuses)
    started = time.time()
    try:
        target = choose(call, view, statuses)
    except Exception as exc:
        trace.child(CHOICE_SPAN, start=started).end(str(exc))
        raise
    if not view.routes and isinstance(target, Local) and target.guard is None:
        trace.set("routerd.target", "local")
        return target
    trace.child(CHOICE_SPAN, _why(target, view), start=started).end()
    return target


def _why(target: Target, view: RoutingView) -> dict[str, Value]:
    """The choice span's attributes: the target, and the node and model chosen or the reason."""
    why: dict[str, Value] = {"routerd.target": type(target).__name__.lower()}
    if isinstance(target, Local):
        why["routerd.node_chosen"] = view.node_id
        why["routerd.model_id"] = target.model.local_id
    elif isinstance(target, Forward):
        why["routerd.node_chosen"] = target.record.node_id
        why["routerd.model_id"] = target.record.local_id
    elif isinstance(target, Guardian):
        why["routerd.reason"] = target.reason
        why["routerd.guardian"] = target.setting.label
    elif isinstance(target, Refuse):
        why["routerd.reason"] = target.error.message
    seconds = getattr(target, "seconds", 0.0)
    if seconds:
        why["routerd.predicted_s"] = float(seconds)
    return why
