"""Request traces: the one small interface domain code calls (:class:`Span`, :class:`Tracer`), with
a no-op when tracing is off (:data:`NO_SPAN`, :data:`NO_TRACER`).

The OpenTelemetry SDK behind it lives in :mod:`routerd.tracing.otel`, imported only when the
``tracing`` section enables it.  Spans are passed explicitly (a call carries its own in
``Call.trace``): OpenTelemetry's implicit context rides on contextvars, which Twisted's Deferred
callbacks do not carry across a wait, so nothing here reads or sets the current context.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

#: An attribute's value (OpenTelemetry's scalar types).
Value = str | bool | int | float
Attributes = Mapping[str, Value]
#: The W3C trace-context request header an incoming request may carry, and forwards send.
TRACEPARENT = "traceparent"


class Span(Protocol):
    """One timed step of a request."""

    def child(self, name: str, attributes: Attributes | None = None, start: float | None = None) -> Span:
        """A step inside this one, started now (or at ``start``, epoch seconds)."""

    def set(self, key: str, value: Value) -> None:
        """Record why: one attribute (a model, a reason, the node chosen …)."""

    def update(self, attributes: Attributes) -> None:
        """Record several attributes at once (one call into the SDK, not one a key)."""

    def end(self, error: str = "") -> None:
        """The step is over (``error``: why it failed)."""

    def headers(self) -> tuple[tuple[bytes, bytes], ...]:
        """The trace-context headers a request sent on behalf of this step carries."""


class Tracer(Protocol):
    def request(self, name: str, traceparent: str, attributes: Attributes | None = None) -> Span:
        """The span of one request this node got: a child of the caller's ``traceparent``
        (when it names one), else a new trace's root."""

    def shutdown(self) -> None:
        """Send what is still buffered (bounded by the exporter's timeout) and stop."""


class NoSpan:
    """A span that records nothing, every step of it itself: tracing off (:data:`NO_SPAN`, which sends
    no header either), or a request the sampler dropped (:mod:`routerd.tracing.otel`'s, whose
    headers still say so)."""

    __slots__ = ()

    def child(self, name: str, attributes: Attributes | None = None, start: float | None = None) -> Span:
        return self

    def set(self, key: str, value: Value) -> None:
        pass

    def update(self, attributes: Attributes) -> None:
        pass

    def end(self, error: str = "") -> None:
        pass

    def headers(self) -> tuple[tuple[bytes, bytes], ...]:
        return ()


class _NoTracer:
    __slots__ = ()

    def request(self, name: str, traceparent: str, attributes: Attributes | None = None) -> Span:
        return NO_SPAN

    def shutdown(self) -> None:
        pass


NO_SPAN: Span = NoSpan()
NO_TRACER: Tracer = _NoTracer()


def header_fields(span: Span) -> dict[str, str]:
    """``span``'s trace-context headers as a request's header map (an in-process hand-over)."""
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in span.headers()}
