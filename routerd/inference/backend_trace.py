"""A served request's backend steps in its trace (``routerd.tracing``): the wait for the backend
slot with the model's load, and the backend request.  With tracing off (the call's span is the
no-op) each hands back the awaitable it was given, untouched."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

from routerd.catalog.model import ModelConfig
from routerd.tracing import NO_SPAN, Attributes, Span

T = TypeVar("T")

#: The span names (contract §2 "Tracing" table).
LOAD_SPAN = "routerd.backend_load"
BACKEND_SPAN = "routerd.backend_request"


def loading(trace: Span, acquiring: Awaitable[T], model: ModelConfig, loaded: str | None) -> Awaitable[T]:
    """The slot wait and load (``loaded``: the config its runtime held as the request got there)."""
    if trace is NO_SPAN:
        return acquiring
    return _within(trace, LOAD_SPAN, acquiring, {"routerd.model_id": model.local_id,
                                                "routerd.switch": loaded != model.filename})


def backend_call(trace: Span, proxied: Awaitable[T]) -> Awaitable[T]:
    """The request to the backend (its answer streamed to the client)."""
    if trace is NO_SPAN:
        return proxied
    return _within(trace, BACKEND_SPAN, proxied, {})


async def _within(trace: Span, name: str, step: Awaitable[T], attributes: Attributes) -> T:
    span = trace.child(name, attributes)
    try:
        result = await step
    except BaseException as exc:
        span.end(exc.__class__.__name__)
        raise
    span.end()
    return result
