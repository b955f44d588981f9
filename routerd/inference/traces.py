"""What a request's trace says of it (``routerd.tracing``): its span on this node, opened as it
arrives and closed with why it went where it went, and the span of the routing choice.  The front
calls these only when tracing is on (a call's span is otherwise the no-op)."""

from __future__ import annotations

from collections.abc import Mapping

from routerd.inference.ending import Handling
from routerd.lending.offload import Borrowed
from routerd.routing.call import Call, Incoming
from routerd.routing.choice import Forward, Guardian, Local, Refuse, RoutingView, Target, choose
from routerd.routing.classify import Route
from routerd.tracing import NO_SPAN, TRACEPARENT, Span, Tracer
from routerd.wire.status import RuntimeStatus

#: The span names (contract §2 "Tracing" table).
REQUEST_SPAN = "routerd.request"
CHOICE_SPAN = "routerd.route_choice"


def request_span(tracer: Tracer, incoming: Incoming, route: Route, request_id: str, node_id: str,
                 borrowed: Borrowed | None) -> Span:
    """The span of one request this node got, a child of the caller's ``traceparent`` if it sent one."""
    span = tracer.request(REQUEST_SPAN, incoming.header(TRACEPARENT), {
        "routerd.node_id": node_id, "routerd.request_id": request_id, "routerd.route": route.kind,
        "url.path": incoming.path})
    if incoming.key_name:
        span.set("routerd.key_name", incoming.key_name)  # the key's name, never the key
    if borrowed is not None:
        span.set("routerd.lent_from", f"{borrowed.owner_node_id}/{borrowed.owner_model_id}")
    return span


def end_request_span(handling: Handling, now: float) -> None:
    """Close the request's span (at ``now``) with what happened to it."""
    span, call = handling.trace, handling.call
    if call is not None:
        outcome = call.outcome
        for key, value in (("routerd.model", call.selector or ""),
                           ("routerd.public_model", call.public_model),
                           ("routerd.model_id", call.model_id), ("routerd.forwarded_to", call.forwarded_to),
                           ("routerd.lent_to", call.lent_to), ("routerd.lent_from", call.lent_from)):
            if value:
                span.set(key, value)
        span.set("routerd.class", call.priority)
        span.set("routerd.status", outcome.status)
        span.set("http.response.status_code", outcome.http_status)
        if call.guardian:
            span.set("routerd.guardian", True)
        if call.serving_since is not None and call.outcome.status == "ok":
            span.set("routerd.measured_s", max(0.0, now - call.serving_since))
        span.end("" if outcome.http_status < 500 else outcome.status)
    else:  # refused before it was routed (its body or selector): the answer says why
        span.set("routerd.status", "refused")
        span.end()


def traced_choice(call: Call, view: RoutingView,
                  statuses: Mapping[str, RuntimeStatus] | None = None) -> Target:
    """:func:`~routerd.routing.choice.choose`, inside a span that says what it chose and why."""
    trace = call.trace
    if trace is NO_SPAN:
        return choose(call, view, statuses)
    span = trace.child(CHOICE_SPAN)
    try:
        target = choose(call, view, statuses)
    except Exception as exc:
        span.end(str(exc))
        raise
    span.set("routerd.target", type(target).__name__.lower())
    if isinstance(target, Local):
        span.set("routerd.node_chosen", view.node_id)
        span.set("routerd.model_id", target.model.local_id)
    elif isinstance(target, Forward):
        span.set("routerd.node_chosen", target.record.node_id)
        span.set("routerd.model_id", target.record.local_id)
    elif isinstance(target, Guardian):
        span.set("routerd.reason", target.reason)
        span.set("routerd.guardian", target.setting.label)
    elif isinstance(target, Refuse):
        span.set("routerd.reason", target.error.message)
    seconds = getattr(target, "seconds", 0.0)
    if seconds:
        span.set("routerd.predicted_s", float(seconds))
    span.end()
    return target
