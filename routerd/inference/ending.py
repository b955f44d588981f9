"""The end of one inference request: the record it keeps from arrival to end (:class:`Handling`),
the one answer to a failure, and its bookkeeping (metrics, key limits, analytics).

A request held in a queue keeps its :class:`Handling`, its call and its queue's record, not a
suspended coroutine: the end is the front's callback, carrying that record, on the Deferred of what
served it.
"""

from __future__ import annotations

from twisted.internet.defer import CancelledError
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from routerd.errors import HTTPError, StatusError, error_answer, stream_error
from routerd.inference.analytics import AnalyticsRecorder, request_row
from routerd.inference.timing import FirstWrite
from routerd.metrics import GaugeChild, NodeMetrics
from routerd.routing.call import Call, Reply
from routerd.routing.classify import Route
from routerd.routing.key_limits import KeyLimiter
from routerd.routing.relay import StreamBroken
from routerd.routing.upstream import upstream_gone
from routerd.tracing import NO_SPAN, Span

log = Logger(namespace="routerd.inference.front")

Outcome = bytes | Failure


class Handling:
    """One request from its arrival to its end: what the end reads (the front's end callback on
    the Deferred of what served it carries it)."""

    __slots__ = ("reply", "route", "request_id", "cluster_call", "in_flight", "started", "call",
                 "limited", "timed", "model_label", "trace")

    def __init__(self, reply: Reply, route: Route, request_id: str, cluster_call: bool,
                 in_flight: GaugeChild) -> None:
        self.reply = reply
        self.route = route
        self.request_id = request_id
        self.cluster_call = cluster_call
        self.in_flight = in_flight
        self.started = 0.0
        self.call: Call | None = None
        self.limited = ""  # the key name the limiter counted this request against
        self.timed: FirstWrite | None = None
        self.model_label = "-"
        self.trace: Span = NO_SPAN  # the request's span (routerd.inference.traces)

    def routed(self, answer: bytes, label: str) -> bytes:
        """A master's answer: the model label is the routed record's once it answered."""
        self.model_label = label
        return answer


def answer_outcome(handling: Handling, outcome: Outcome) -> Outcome:
    """The bytes to write for ``outcome``: the answer itself, or the one answer to a failure."""
    if not isinstance(outcome, Failure):
        return outcome
    exc = outcome.value
    if not isinstance(exc, Exception):
        return outcome
    reply, call, request_id = handling.reply, handling.call, handling.request_id
    if isinstance(exc, CancelledError) or reply.gone:
        # A client that leaves is a normal event: everything it held is released by the
        # cancellation (backend call aborted, slot and reservation freed).
        if call is not None:
            call.outcome.status = "client_disconnected"
            call.outcome.http_status = 499
        if reply.gone:
            log.info("client disconnected before the answer to {request_id} was complete",
                     request_id=request_id)
            return b""
        return Failure(CancelledError())
    return _failed(reply, handling.route, call, request_id, exc)


def _failed(reply: Reply, route: Route, call: Call | None, request_id: str, exc: Exception) -> bytes:
    """The one answer to a request that failed (the client is still there)."""
    if isinstance(exc, StatusError):
        if call is not None:
            call.outcome.status = exc.code
            call.outcome.http_status = exc.status
            call.outcome.reason = exc.message
        if reply.started:
            log.warn("error after the answer to {request_id} started: {reason}", request_id=request_id,
                     reason=exc.message)
        return write_error(reply, route, exc)
    if isinstance(exc, StreamBroken):
        # The upstream answer (a backend's, or another node's) ended before it was complete: a
        # stream under way ends with an error event, a whole answer not yet written is a 502.
        if call is not None:
            call.outcome.status = "stream_broken"
            call.outcome.reason = str(exc)
        log.warn("answer to {request_id} broke off mid-stream: {reason}", request_id=request_id,
                 reason=str(exc))
        return write_error(reply, route, HTTPError(502, f"the answer broke off before it was complete: {exc}",
                                                    "backend_error", "backend_error"))
    reason = upstream_gone(exc)
    if reason is not None:
        # An expected network event (the backend or node crashed, refused, reset): one line.
        if call is not None:
            call.outcome.status = "backend_error"
            call.outcome.reason = reason
        log.warn("upstream failed while answering {request_id}: {reason}", request_id=request_id,
                 reason=reason)
        return write_error(reply, route, HTTPError(502, f"the backend failed: {reason}",
                                                    "backend_error", "backend_error"))
    log.failure("request {request_id} failed", failure=Failure(exc), request_id=request_id)
    if call is not None:
        call.outcome.status = "internal_error"
        call.outcome.reason = str(exc)
    return write_error(reply, route, HTTPError(502, f"request failed: {exc}", "backend_error",
                                                "backend_error"))


def write_error(reply: Reply, route: Route, err: StatusError) -> bytes:
    """Status, headers and the error body of ``err`` in the route's style; once the answer has
    started (a stream), the stream's last event says ``err`` instead (:func:`stream_error`) and the
    answer ends as usual: a client is answered once, and never left with a connection that broke."""
    if reply.started:
        return stream_error(route.error_style, err)
    status, headers, body = error_answer(err, route.error_style)  # the one error answer
    reply.set_status(status)
    for name, value in headers:
        reply.set_header(name, value)
    return body


class Books:
    """Metrics, key limits and analytics of the requests that end on this node."""

    def __init__(self, *, node_id: str, clock: IReactorTime, metrics: NodeMetrics, limiter: KeyLimiter,
                 analytics: AnalyticsRecorder | None) -> None:
        self.node_id = node_id
        self.clock = clock
        self.metrics = metrics
        self.limiter = limiter
        self.analytics = analytics

    def close(self, handling: Handling) -> None:
        """Account a request that ended (the in-flight count is the front's)."""
        call, route, started = handling.call, handling.route, handling.started
        model_label, lane, timed = handling.model_label, route.runtime, handling.timed
        metrics = self.metrics
        if call is not None:
            self._count_key(call, handling.cluster_call, started)
        if handling.limited:
            assert call is not None
            self.limiter.done(handling.limited, self.clock.seconds(), _tokens(call))
        handling.in_flight.dec()
        status = call.outcome.status if call is not None else "bad_request"
        requests, duration = metrics.request_children(model_label, lane, route.kind, status)
        requests.inc()
        duration.observe(self.clock.seconds() - started)
        if timed is not None and timed.first_write_at is not None and status == "ok":
            metrics.first_token.child(model_label, lane).observe(timed.first_write_at - started)
        analytics = self.analytics
        if analytics is not None and analytics.enabled:
            row = request_row(call, route, node_id=self.node_id, model_label=model_label, status=status,
                              started=started, finished=self.clock.seconds(),
                              first_write=timed.first_write_at if timed is not None else None)
            if row is not None and call is not None:
                analytics.request(row, call.body, call.content_type)
            elif row is not None:
                analytics.request(row)

    def _count_key(self, call: Call, cluster_call: bool, started: float) -> None:
        """/metrics per key name and class: the requests and tokens of the node the client called,
        the queue wait of the node that served it."""
        since = call.serving_since
        tokens = 0 if cluster_call else _tokens(call)
        wait, requests, used = self.metrics.key_children(
            call.key_name or "-", call.priority, call.outcome.status, waited=since is not None,
            counted=not cluster_call, used_tokens=bool(tokens))
        if wait is not None and since is not None:
            wait.observe(since - started)
        if requests is not None:
            requests.inc()
        if used is not None:
            used.inc(tokens)


def _tokens(call: Call) -> int:
    """The tokens a finished text request used, where this node knows them (0 otherwise)."""
    if call.route.runtime != "text":
        return 0
    return int(sum(call.outcome.work[:2]))
