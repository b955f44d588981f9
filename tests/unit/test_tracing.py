"""Request traces (contract §2 ``tracing``): the section's keys, the no-op when tracing is off, and
the SDK-backed spans: an incoming ``traceparent`` is honoured, a forward is the request's child and
carries its own ``traceparent``.  The SDK's in-memory exporter stands in for the collector."""

from __future__ import annotations

from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from twisted.internet.defer import CancelledError, Deferred
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from routerd.assembly.parts import build_tracer
from routerd.config.load import ConfigError, parse_config
from routerd.config.schema import TracingConfig
from routerd.inference.backend_trace import backend_call, loading
from routerd.lending.lend_trace import lent
from routerd.routing.forward import Forwarder, Outbound
from routerd.tracing import NO_SPAN, NO_TRACER, Span
from routerd.tracing.otel import OtelTracer
from routerd.urls import AllowList
from tests.support import FakeReply
from tests.unit.memory_http import MemoryNetwork

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


def config(tmp_path: Path, tracing: Any) -> Any:
    return parse_config({"models": {"config_dir": str(tmp_path)}, "tracing": tracing},
                        base_dir=str(tmp_path), env={})


def test_tracing_is_off_by_default_and_then_the_node_has_the_no_op_tracer(tmp_path: Path) -> None:
    settings = parse_config({"models": {"config_dir": str(tmp_path)}}, base_dir=str(tmp_path), env={}).tracing
    assert settings == TracingConfig()
    assert settings.enabled is False
    assert build_tracer(settings, "n1") is NO_TRACER


def test_the_tracing_section_reads_endpoint_service_ratio_and_headers(tmp_path: Path) -> None:
    settings = config(tmp_path, {"enabled": True, "endpoint": "https://otel.example:4318/v1/traces",
                                 "service_name": "edge-router", "sampling_ratio": 0.25,
                                 "headers": {"x-api-key": "secret", "x-team": "ops"}}).tracing
    assert settings == TracingConfig(enabled=True, endpoint="https://otel.example:4318/v1/traces",
                                     service_name="edge-router", sampling_ratio=0.25,
                                     headers=(("x-api-key", "secret"), ("x-team", "ops")))
    tracer = build_tracer(settings, "n1")
    try:
        assert isinstance(tracer, OtelTracer)
        assert tracer.provider.resource.attributes["service.name"] == "edge-router"
        assert tracer.provider.resource.attributes["service.instance.id"] == "n1"
    finally:
        tracer.shutdown()  # nothing was traced: nothing is sent


@pytest.mark.parametrize(("tracing", "key"), [
    ({"sampling_ratio": 1.5}, "tracing.sampling_ratio"),
    ({"sampling_ratio": -0.1}, "tracing.sampling_ratio"),
    ({"endpoint": "127.0.0.1:4318"}, "tracing.endpoint"),
    ({"headers": ["x-api-key: secret"]}, "tracing.headers"),
    ({"headers": {"x-api-key": 5}}, "tracing.headers"),
    ({"enabled": "maybe"}, "tracing.enabled"),
    ({"sample_ratio": 0.5}, "tracing.sample_ratio"),
])
def test_a_bad_tracing_value_is_refused_naming_its_key(tmp_path: Path, tracing: dict[str, Any],
                                                       key: str) -> None:
    with pytest.raises(ConfigError) as raised:
        config(tmp_path, tracing)
    assert any(error.startswith(key + ":") for error in raised.value.errors), raised.value.errors


# -- the no-op ------------------------------------------------------------------------------------

def test_the_no_op_span_records_nothing_and_sends_no_header() -> None:
    child = NO_SPAN.child("x", {"a": 1}, start=1.0)
    assert child is NO_SPAN
    child.set("k", "v")
    child.end("failed")
    assert NO_SPAN.headers() == ()
    assert NO_TRACER.request("routerd.request", f"00-{TRACE_ID}-{CALLER_SPAN}-01") is NO_SPAN


def test_with_tracing_off_the_backend_and_lend_steps_are_the_plain_awaitables() -> None:
    """Off, nothing wraps a request's steps: the very awaitable is awaited (no extra frame)."""
    step: Deferred[bytes] = Deferred()
    assert loading(NO_SPAN, step, _model(), None) is step
    assert backend_call(NO_SPAN, step) is step
    sent: list[tuple[Any, ...]] = []

    def lend(*args: Any) -> Awaitable[bytes]:
        sent.append(args)
        return step

    call = _call()
    assert lent(lend, "transport", call, _lease(), "alpha") is step
    assert sent == [("transport", call, _lease(), "alpha")]


# -- forwards ---------------------------------------------------------------------------------------

class Echo(Resource):
    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.headers: dict[bytes, list[bytes]] = {}

    def render_POST(self, request: Request) -> bytes:
        self.headers = {name.lower(): values for name, values in request.requestHeaders.getAllRawHeaders()}
        request.setHeader(b"content-type", b"application/json")
        return b'{"model": "m"}'


def forward(trace: Span) -> Echo:
    network = MemoryNetwork()
    echo = Echo()
    network.serve("peer:80", Site(echo))
    out = Outbound(url="http://peer:80/v1/chat/completions", body=b"{}", content_type="application/json",
                   request_id="r1", trace=trace)
    results: list[object] = []
    forwarder = Forwarder(network, "token", AllowList(["http://peer:80"]))
    Deferred.fromCoroutine(forwarder.send(FakeReply(), out)).addBoth(results.append)
    network.flush()
    assert results == [(200, b'{"model": "m"}')]
    return echo


def memory_tracer(ratio: float = 1.0) -> tuple[OtelTracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return OtelTracer(provider), exporter


def by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {span.name: span for span in exporter.get_finished_spans()}


def test_a_forward_with_tracing_off_carries_no_traceparent() -> None:
    assert b"traceparent" not in forward(NO_SPAN).headers


def test_an_incoming_traceparent_is_the_request_spans_parent_and_a_forward_carries_its_own() -> None:
    tracer, exporter = memory_tracer()
    request = tracer.request("routerd.request", f"00-{TRACE_ID}-{CALLER_SPAN}-01", {"routerd.node_id": "m"})
    echo = forward(request)
    request.end()
    spans = by_name(exporter)
    root, sent = spans["routerd.request"], spans["routerd.forward"]
    assert root.context is not None and sent.context is not None and sent.parent is not None
    assert format(root.context.trace_id, "032x") == TRACE_ID
    assert root.parent is not None and format(root.parent.span_id, "016x") == CALLER_SPAN
    assert sent.parent.span_id == root.context.span_id
    assert sent.attributes is not None and sent.attributes["http.response.status_code"] == 200
    # the peer is told the forward span is its parent, in the same trace
    assert echo.headers[b"traceparent"] == [f"00-{TRACE_ID}-{sent.context.span_id:016x}-01".encode()]


def test_a_callers_sampled_trace_is_kept_even_at_ratio_zero_and_a_new_one_is_not() -> None:
    tracer, exporter = memory_tracer(ratio=0.0)
    tracer.request("routerd.request", "").end()
    assert exporter.get_finished_spans() == ()
    tracer.request("routerd.request", f"00-{TRACE_ID}-{CALLER_SPAN}-01").end()
    assert [span.name for span in exporter.get_finished_spans()] == ["routerd.request"]


def test_an_unsampled_request_asks_the_sdk_nothing_for_its_steps_and_its_forward_says_unsampled() -> None:
    """A request the sampler dropped: its steps are one object that records nothing (no ``start_span``
    per step), and a forward tells the next node the trace is not sampled (its sampled flag off), so it
    drops it too."""
    tracer, exporter = memory_tracer(ratio=0.0)
    request = tracer.request("routerd.request", "", {"routerd.model": "m"})
    started: list[str] = []
    sdk_start = tracer.tracer.start_span

    def counting(name: str, *args: Any, **kwargs: Any) -> Any:
        started.append(name)
        return sdk_start(name, *args, **kwargs)

    tracer.tracer.start_span = counting  # type: ignore[method-assign]
    step = request.child("routerd.backend_request", {"routerd.backend": "b"})
    assert step is request and started == []
    echo = forward(request)
    step.end()
    request.end()
    assert started == [] and exporter.get_finished_spans() == ()
    (sent,) = echo.headers[b"traceparent"]
    assert int(sent.rsplit(b"-", 1)[1], 16) & 1 == 0, sent  # the sampled flag is off
    downstream, seen = memory_tracer(ratio=1.0)
    downstream.request("routerd.request", sent.decode()).end()
    assert seen.get_finished_spans() == ()


def test_a_failed_step_ends_its_span_as_an_error() -> None:
    tracer, exporter = memory_tracer()
    request = tracer.request("routerd.request", "")
    failing: Deferred[bytes] = Deferred()
    results: list[object] = []
    Deferred.fromCoroutine(_await(backend_call(request, failing))).addBoth(results.append)
    failing.errback(ConnectionRefusedError())
    [failure] = results
    assert failure.check(ConnectionRefusedError)  # type: ignore[attr-defined]  # the caller sees it as is
    step = by_name(exporter)["routerd.backend_request"]
    assert not step.status.is_ok and step.status.description == "ConnectionRefusedError"


async def _await(step: Awaitable[bytes]) -> bytes:
    return await step


# -- the slot and load: a span only when they took time (contract §2 "tracing") ----------------------

def _alpha() -> Any:
    from routerd.catalog.model import Capabilities, ModelConfig

    return ModelConfig(local_id="alpha", filename="alpha.kcpps", path="/m/alpha.kcpps", backend_mode="kobold",
                       capabilities=Capabilities(llm=True), config_hash="h")


def _load_steps(acquiring: Deferred[str], loaded: str | None) -> tuple[list[object], list[ReadableSpan], Any]:
    tracer, exporter = memory_tracer()
    request = tracer.request("routerd.request", "")
    results: list[object] = []
    Deferred.fromCoroutine(_await_str(loading(request, acquiring, _alpha(), loaded))).addBoth(results.append)
    return results, [s for s in exporter.get_finished_spans() if s.name == "routerd.backend_load"], exporter


async def _await_str(step: Awaitable[str]) -> str:
    return await step


def test_a_free_slot_with_its_model_loaded_waited_for_nothing_and_has_no_load_span() -> None:
    acquired: Deferred[str] = Deferred()
    acquired.callback("lease")
    results, loads, _ = _load_steps(acquired, "alpha.kcpps")
    assert results == ["lease"]
    assert loads == []


def test_a_slot_wait_has_a_load_span_ended_when_the_slot_is_had() -> None:
    acquiring: Deferred[str] = Deferred()
    results, loads, exporter = _load_steps(acquiring, "alpha.kcpps")
    assert results == [] and loads == []  # still waiting: the span is open
    acquiring.callback("lease")
    assert results == ["lease"]
    [load] = [s for s in exporter.get_finished_spans() if s.name == "routerd.backend_load"]
    assert load.attributes == {"routerd.model_id": "alpha", "routerd.switch": False}


def test_a_model_switch_has_a_load_span_even_when_the_runtime_was_had_at_once() -> None:
    acquired: Deferred[str] = Deferred()
    acquired.callback("lease")
    results, loads, _ = _load_steps(acquired, "beta.kcpps")
    assert results == ["lease"]
    [load] = loads
    assert load.attributes is not None and load.attributes["routerd.switch"] is True


def test_a_slot_refused_at_once_has_a_load_span_saying_why() -> None:
    results, loads, _ = _load_steps(Deferred.fromCoroutine(_refused()), "alpha.kcpps")
    [failure] = results
    assert failure.check(ConnectionRefusedError)  # type: ignore[attr-defined]
    [load] = loads
    assert not load.status.is_ok and load.status.description == "ConnectionRefusedError"


async def _refused() -> str:
    raise ConnectionRefusedError()


def test_a_request_cancelled_while_its_slot_wait_is_traced_cancels_that_wait_and_ends_the_span() -> None:
    """The traced wait is a Deferred over the acquisition: a client going away still cancels the
    runtime's acquisition underneath (a drain or a take-back relies on it), and the span ends."""
    cancelled: list[object] = []
    acquiring: Deferred[str] = Deferred(canceller=cancelled.append)
    tracer, exporter = memory_tracer()

    async def serve() -> str:
        request = tracer.request("routerd.request", "")
        return await loading(request, _acquire(acquiring), _alpha(), "alpha.kcpps")

    results: list[object] = []
    served = Deferred.fromCoroutine(serve())
    served.addBoth(results.append)
    served.cancel()
    [failure] = results
    assert failure.check(CancelledError)  # type: ignore[attr-defined]
    assert cancelled == [acquiring]
    [load] = [s for s in exporter.get_finished_spans() if s.name == "routerd.backend_load"]
    assert load.status.description == "CancelledError"


async def _acquire(acquiring: Deferred[str]) -> str:
    return await acquiring


def _model() -> Any:
    from routerd.catalog.model import ModelConfig

    return ModelConfig.__new__(ModelConfig)


def _call() -> Any:
    return type("C", (), {"trace": NO_SPAN})()


def _lease() -> Any:
    return "lease"
