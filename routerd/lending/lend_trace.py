"""A held request's trace (``routerd.tracing``): its wait in the lane queue, and its lending to a
helper, whose send through the master's relay is the lend span's child (so the helper's spans hang
under it).  With tracing off (the call's span is the no-op) each is the plain step, or nothing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from routerd.lending.offload import RelayRequest
from routerd.routing.call import Call
from routerd.tracing import NO_SPAN, Span, Tracer
from routerd.wire.lending import Lease

#: How a request is lent: ``LentCall.lend`` (``routerd.lending.watch``).
Lend = Callable[[Any, Call, Lease, str], Awaitable[bytes]]
#: The span names (contract §2 "Tracing" table).
QUEUE_SPAN = "routerd.queue_wait"
LEND_SPAN = "routerd.lend"
RELAY_SPAN = "routerd.relay"


def relay_span(tracer: Tracer, traceparent: str, relay: RelayRequest, request_id: str) -> Span:
    """The master's relay of a lent request from its owner to the helper its lease names."""
    return tracer.request(RELAY_SPAN, traceparent, {
        "routerd.request_id": request_id, "routerd.lane": relay.lane,
        "routerd.lent_from": f"{relay.owner_node_id}/{relay.owner_model_id}"})


def queue_span(call: Call, verdict: str, reason: str) -> None:
    """The request's wait in its lane queue, from its arrival to the queue's verdict (``admit``,
    ``lend``, ``returned`` or ``refused``); nothing with tracing off."""
    if call.trace is NO_SPAN:
        return
    span = call.trace.child(QUEUE_SPAN, {"routerd.verdict": verdict, "routerd.class": call.priority,
                                         "routerd.queue_position": call.queue_position}, start=call.started)
    if reason:
        span.set("routerd.reason", reason)
    span.end()


def lent(lend: Lend, transport: Any, call: Call, lease: Lease, model_id: str) -> Awaitable[bytes]:
    """``lend(transport, call, lease, model_id)``: the lending of ``call`` to the lease's helper
    (as it is with tracing off, else inside the lend span)."""
    if call.trace is NO_SPAN:
        return lend(transport, call, lease, model_id)
    return _traced_lend(call, lease, lambda: lend(transport, call, lease, model_id))


async def _traced_lend(call: Call, lease: Lease, lend: Callable[[], Awaitable[bytes]]) -> bytes:
    """``lend()`` inside the lend span: the call carries that span while it is sent (the relay
    send is its child), and its own span again afterwards."""
    request_span = call.trace
    span = call.trace = request_span.child(LEND_SPAN, {
        "routerd.lent_to": f"{lease.helper_node_id}/{lease.helper_model_id}",
        "routerd.owner_model_id": lease.owner_model_id, "routerd.probe": lease.probe,
        "routerd.predicted_owner_ms": lease.owner_job_ms,
        "routerd.predicted_helper_ms": lease.helper_service_ms,
        "routerd.predicted_switch_ms": lease.helper_switch_ms})
    try:
        result = await lend()
    except BaseException as exc:
        span.end(exc.__class__.__name__)
        raise
    finally:
        call.trace = request_span
    span.end()
    return result
