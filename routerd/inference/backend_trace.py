"""A served request's backend steps in its trace (``routerd.tracing``): the wait for the backend
slot with the model's load, and the backend request.  With tracing off (the call's span is the
no-op) each hands back the awaitable it was given, untouched.

The backend request always has its span; the slot and load only when they took time: the slot was
not free at once, or another config (or none) was loaded.  A request whose model was loaded and
whose slot was free waited for nothing, and its trace has no step for it."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

from twisted.internet.defer import Deferred, ensureDeferred
from twisted.python.failure import Failure

from routerd.catalog.model import ModelConfig
from routerd.tracing import NO_SPAN, Span

T = TypeVar("T")

#: The span names (contract §2 "Tracing" table).
LOAD_SPAN = "routerd.backend_load"
BACKEND_SPAN = "routerd.backend_request"


def loading(trace: Span, acquiring: Coroutine[Any, Any, T] | Deferred[T], model: ModelConfig,
            loaded: str | None) -> Awaitable[T]:
    """The slot wait and load (``loaded``: the config its runtime held as the request got there),
    in a span only when it waited or switched the model (started now, it runs as far as it can)."""
    if trace is NO_SPAN:
        return acquiring
    switch = loaded != model.filename
    started = time.time()
    step: Deferred[T] = ensureDeferred(acquiring)
    if step.called and not switch and not isinstance(step.result, Failure):
        return step  # the slot was free and the model loaded: nothing happened
    return _within(trace.child(LOAD_SPAN, {"routerd.model_id": model.local_id, "routerd.switch": switch},
                               start=started), step)


def backend_call(trace: Span, proxied: Awaitable[T]) -> Awaitable[T]:
    """The request to the backend (its answer streamed to the client)."""
    if trace is NO_SPAN:
        return proxied
    return _within(trace.child(BACKEND_SPAN), proxied)


async def _within(span: Span, step: Awaitable[T]) -> T:
    """``step``'s result, ``span`` ended as it ends (with its exception's name when it fails)."""
    try:
        result = await step
    except BaseException as exc:
        span.end(exc.__class__.__name__)
        raise
    span.end()
    return result
