"""The OpenTelemetry SDK behind :mod:`routerd.tracing`: spans exported over OTLP/HTTP.

Export runs off the request path: the SDK's :class:`BatchSpanProcessor` buffers ended spans in a
bounded queue (:data:`MAX_QUEUE` spans; past it new ones are dropped, so a dead collector costs
bounded memory) and its own thread sends them, each export bounded by :data:`EXPORT_TIMEOUT`.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from routerd.tracing import TRACEPARENT, Attributes, NoSpan, Span, Value

#: Ended spans buffered for export at most (then new ones are dropped, counted by the SDK's log).
MAX_QUEUE = 4096
#: Spans per export request (each request's HTTP round trip through ``requests`` was a tenth of the
#: export thread's CPU at 512), how often the buffer is sent (ms), and an export's bound (s).
MAX_BATCH = 1024
SCHEDULE_DELAY_MS = 1000
EXPORT_TIMEOUT = 5.0

_PROPAGATOR = TraceContextTextMapPropagator()


class OtelSpan:
    """A :class:`~routerd.tracing.Span` over an SDK span (its parent passed explicitly).

    Cheap on the request path: attributes go to the SDK in one mapping (at a child's creation, or
    :meth:`update`), each one a lock and a clean there; the context that names this span as a
    parent is built once, at its first child or header."""

    __slots__ = ("_context", "_span", "_tracer")

    def __init__(self, tracer: trace.Tracer, span: trace.Span) -> None:
        self._tracer = tracer
        self._span = span
        self._context: Context | None = None

    def _as_parent(self) -> Context:
        if self._context is None:
            self._context = trace.set_span_in_context(self._span)
        return self._context

    def child(self, name: str, attributes: Attributes | None = None, start: float | None = None) -> Span:
        started = None if start is None else int(start * 1e9)
        return OtelSpan(self._tracer, self._tracer.start_span(name, context=self._as_parent(),
                                                              attributes=attributes, start_time=started))

    def set(self, key: str, value: Value) -> None:
        self._span.set_attribute(key, value)

    def update(self, attributes: Attributes) -> None:
        self._span.set_attributes(attributes)

    def end(self, error: str = "") -> None:
        if error:
            self._span.set_status(Status(StatusCode.ERROR, error))
        self._span.end()

    def headers(self) -> tuple[tuple[bytes, bytes], ...]:
        return _trace_headers(self._as_parent())


class _UnsampledSpan(NoSpan):
    """A request the sampler did not keep: none of its steps is recorded, so they ask the SDK nothing
    (each child's ``start_span`` was a sampler call, two ids and a non-recording span — at
    ``sampling_ratio: 0.1`` unsampled requests cost on ÷ off 1.20 in ``benchmarks/tracing_ab.py``).
    Its forwards still carry its (unsampled) ``traceparent``, so the next node does not sample the
    trace either."""

    __slots__ = ("_headers", "_span")

    def __init__(self, span: trace.Span) -> None:
        self._span = span
        self._headers: tuple[tuple[bytes, bytes], ...] | None = None

    def headers(self) -> tuple[tuple[bytes, bytes], ...]:
        if self._headers is None:
            self._headers = _trace_headers(trace.set_span_in_context(self._span))
        return self._headers


def _trace_headers(context: Context) -> tuple[tuple[bytes, bytes], ...]:
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=context)
    return tuple((name.encode("latin-1"), value.encode("latin-1")) for name, value in carrier.items())


class _NodeResource(Resource):
    """The node's resource with its hash computed once: the OTLP encoder groups a batch's spans by
    resource, and :class:`Resource` hashes itself as a sorted JSON dump of its attributes each time,
    once a span (a tenth of the export thread's CPU).  A resource never changes."""

    def __init__(self, resource: Resource) -> None:
        super().__init__(resource.attributes, resource.schema_url)
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return super().__eq__(other)


def otlp_provider(*, endpoint: str, service_name: str, node_id: str, sampling_ratio: float,
                  headers: Mapping[str, str]) -> TracerProvider:
    """The node's own SDK provider (the global one is left alone): a new trace is kept with
    ``sampling_ratio``, a caller's follows its ``traceparent``; ended spans are batched to OTLP/HTTP."""
    resource = _NodeResource(Resource.create({"service.name": service_name, "service.instance.id": node_id}))
    provider = TracerProvider(resource=resource, sampler=ParentBased(TraceIdRatioBased(sampling_ratio)))
    exporter = OTLPSpanExporter(endpoint=endpoint, headers=dict(headers), timeout=EXPORT_TIMEOUT)
    provider.add_span_processor(BatchSpanProcessor(
        exporter, max_queue_size=MAX_QUEUE, max_export_batch_size=MAX_BATCH,
        schedule_delay_millis=SCHEDULE_DELAY_MS, export_timeout_millis=int(EXPORT_TIMEOUT * 1000)))
    return provider


class OtelTracer:
    """A :class:`~routerd.tracing.Tracer` over an SDK provider (:func:`otlp_provider`'s)."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("routerd")

    def request(self, name: str, traceparent: str, attributes: Attributes | None = None) -> Span:
        context = _PROPAGATOR.extract({TRACEPARENT: traceparent}) if traceparent else None
        span = self.tracer.start_span(name, context=context, kind=SpanKind.SERVER, attributes=attributes)
        if not span.is_recording():
            return _UnsampledSpan(span)
        return OtelSpan(self.tracer, span)

    def shutdown(self) -> None:
        self.provider.shutdown()
