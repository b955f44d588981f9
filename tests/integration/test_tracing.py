"""OpenTelemetry traces across a cluster (contract §2 ``tracing``): a master, an owner and a helper
with simulator backends export their spans over OTLP/HTTP to a receiver in this test, which decodes
the real protobuf (``opentelemetry-proto``).  A request the owner lends is one trace from the
client's ``traceparent`` through the master, the owner, the master's relay and the helper, each span
under the right parent, its attributes saying why, no key material anywhere."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest_twisted
import treq
from klein import Klein
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from twisted.internet import defer, reactor
from twisted.internet.interfaces import IListeningPort
from twisted.web.iweb import IRequest
from twisted.web.server import Site

from tests.integration.lending_support import (
    JOB,
    LENDING,
    Trio,
    chat,
    lend_to_the_master,
    start_trio,
    text_models,
    warm_and_link,
)
from tests.integration.nodes import (
    TOKEN,
    free_port,
    plan_cluster,
    start_node,
    start_standalone,
    wait_until,
    write_models,
)

KEY = "sk-tracing-test-key-0123456789"
COLLECTOR_SECRET = "collector-secret-value"
NODE = "local"  # a standalone node's ID


@attrs.frozen
class Got:
    """One span as the receiver decoded it."""

    node: str  # the exporting node's service.instance.id
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    attributes: dict[str, Any]


def _values(pairs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    kv: KeyValue
    for kv in pairs:
        which = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, which) if which else None
    return out


class Receiver:
    """An OTLP/HTTP traces endpoint: ``POST /v1/traces`` with a protobuf body."""

    app = Klein()

    def __init__(self) -> None:
        self.spans: list[Got] = []
        self.auth: set[bytes] = set()
        self.port: IListeningPort | None = None

    @app.route("/v1/traces", methods=["POST"])
    def traces(self, request: IRequest) -> bytes:
        self.auth.update(request.requestHeaders.getRawHeaders(b"x-collector-auth", []))  # type: ignore[arg-type]
        decoded = ExportTraceServiceRequest()
        decoded.ParseFromString(request.content.read())  # type: ignore[union-attr]
        for resource_spans in decoded.resource_spans:
            resource = _values(resource_spans.resource.attributes)
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    self.spans.append(Got(
                        node=resource.get("service.instance.id", ""),
                        service=resource.get("service.name", ""),
                        name=span.name, trace_id=span.trace_id.hex(), span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex(), kind=span.kind,
                        attributes=_values(span.attributes)))
        request.setHeader(b"content-type", b"application/x-protobuf")
        return ExportTraceServiceResponse().SerializeToString()

    def start(self) -> str:
        self.port = reactor.listenTCP(0, Site(self.app.resource()), interface="127.0.0.1")  # type: ignore[attr-defined]
        return f"http://127.0.0.1:{self.port.getHost().port}/v1/traces"

    def trace(self, trace_id: str) -> list[Got]:
        return [span for span in self.spans if span.trace_id == trace_id]


@attrs.frozen
class Traced:
    trio: Trio
    receiver: Receiver


@pytest_twisted.async_yield_fixture
async def traced(tmp_path: Path) -> AsyncIterator[Traced]:
    receiver = Receiver()
    endpoint = receiver.start()
    tracing = {"tracing": {"enabled": True, "endpoint": endpoint, "service_name": "routerd-test",
                           "headers": {"x-collector-auth": COLLECTOR_SECRET}}}
    master = {**tracing, "auth": {"inference_keys": [{"name": "team-a", "key": KEY}]}}
    trio = await start_trio(tmp_path, text_models(alpha=JOB), text_models(beta=JOB), master_extra=LENDING,
                            master_sections=master, owner_sections=tracing, helper_sections=tracing)
    try:
        yield Traced(trio, receiver)
    finally:
        await trio.stop()
        assert receiver.port is not None
        await receiver.port.stopListening()


def _traceparent() -> tuple[str, str, str]:
    trace_id, span_id = os.urandom(16).hex(), os.urandom(8).hex()
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


async def _chat(url: str, traceparent: str) -> Any:
    return await treq.post(url + "/v1/chat/completions", json=chat("alpha"),
                           headers={"Authorization": [f"Bearer {KEY}"], "traceparent": [traceparent]})


def _one(spans: list[Got], node: str, name: str, parent: Got | str | None = None) -> Got:
    found = [s for s in spans if s.node == node and s.name == name
             and (parent is None or s.parent_id == (parent if isinstance(parent, str) else parent.span_id))]
    assert len(found) == 1, (node, name, parent, [(s.node, s.name, s.parent_id) for s in spans])
    return found[0]


@pytest_twisted.ensureDeferred
async def test_a_lent_request_is_one_trace_across_master_owner_relay_and_helper(traced: Traced) -> None:
    trio, receiver = traced.trio, traced.receiver
    await warm_and_link(trio, key=KEY)
    sent = [_traceparent() for _ in range(10)]
    responses = await defer.gatherResults(
        [defer.Deferred.fromCoroutine(_chat(trio.master.url, parent)) for parent, _, _ in sent])
    assert [r.code for r in responses] == [200] * 10
    lent = [(ids, r) for ids, r in zip(sent, responses, strict=True)
            if r.headers.getRawHeaders(b"x-routerd-lent-to")]
    assert lent, "some of the backlog went to the helper"
    (_parent, trace_id, client_span), _response = lent[0]

    # exported off the request path, about once a second: wait for the last node's spans
    expected = {("master", "routerd.request"), ("master", "routerd.relay"), ("owner", "routerd.request"),
                ("helper", "routerd.backend_request")}
    await wait_until(lambda: expected <= {(s.node, s.name) for s in receiver.trace(trace_id)}, timeout=15.0)
    spans = receiver.trace(trace_id)
    assert {s.service for s in spans} == {"routerd-test"}
    assert {s.node for s in spans} == {"master", "owner", "helper"}

    # the master: the client's span is its request's parent; it chose the owner and forwarded there
    m_request = _one(spans, "master", "routerd.request", client_span)
    assert m_request.kind == 2  # SPAN_KIND_SERVER
    choice = _one(spans, "master", "routerd.route_choice", m_request)
    assert choice.attributes["routerd.target"] == "forward"
    assert choice.attributes["routerd.node_chosen"] == "owner"
    m_forward = _one(spans, "master", "routerd.forward", m_request)
    assert m_request.attributes["routerd.key_name"] == "team-a"
    assert m_request.attributes["routerd.public_model"] == "alpha"
    assert m_request.attributes["routerd.forwarded_to"] == "owner"
    assert m_request.attributes["routerd.class"] == "standard"
    assert m_request.attributes["http.response.status_code"] == 200

    # the owner: held in its queue, lent on the lease, sent to the master's relay
    o_request = _one(spans, "owner", "routerd.request", m_forward)
    assert o_request.attributes["routerd.lent_to"] == "helper/beta"
    assert o_request.attributes["routerd.model_id"] == "alpha"
    wait = _one(spans, "owner", "routerd.queue_wait", o_request)
    assert wait.attributes["routerd.verdict"] == "lend"
    lend = _one(spans, "owner", "routerd.lend", o_request)
    assert lend.attributes["routerd.lent_to"] == "helper/beta"
    assert "routerd.predicted_helper_ms" in lend.attributes
    o_forward = _one(spans, "owner", "routerd.forward", lend)
    assert "/offload/request" in o_forward.attributes["url.full"]

    # the master's relay, then the helper serving the borrowed request on its backend
    relay = _one(spans, "master", "routerd.relay", o_forward)
    assert relay.attributes["routerd.lent_from"] == "owner/alpha"
    r_forward = _one(spans, "master", "routerd.forward", relay)
    h_request = _one(spans, "helper", "routerd.request", r_forward)
    assert h_request.attributes["routerd.lent_from"] == "owner/alpha"
    assert h_request.attributes["routerd.model_id"] == "beta"
    assert h_request.attributes["routerd.key_name"] == "team-a"
    # its slot and load have a span only if they took time (beta loaded, its slot free: none)
    for load in (s for s in spans if s.node == "helper" and s.name == "routerd.backend_load"):
        assert load.parent_id == h_request.span_id and load.attributes["routerd.model_id"] == "beta"
    _one(spans, "helper", "routerd.backend_request", h_request)
    assert h_request.attributes["routerd.measured_s"] > 0

    # every request id is the client's one request's
    ids = {s.attributes["routerd.request_id"] for s in spans if "routerd.request_id" in s.attributes}
    assert len(ids) == 1

    # never key material: not the inference key, not the cluster token, not the collector's headers
    everything = json.dumps([attrs.asdict(s) for s in receiver.spans])
    for secret in (KEY, TOKEN, COLLECTOR_SECRET, "Bearer"):
        assert secret not in everything
    assert receiver.auth == {COLLECTOR_SECRET.encode()}, "the configured headers go with each export"


@pytest_twisted.ensureDeferred
async def test_a_dead_collector_never_fails_or_holds_a_request(tmp_path: Path) -> None:
    """Nothing listens at the endpoint: every request is answered as without tracing (the spans wait
    in the SDK's bounded queue, exported off the request path, and are dropped)."""
    dead = f"http://127.0.0.1:{free_port()}/v1/traces"
    models, weights = {"alpha": {"model": "../weights/alpha.sim.json", "contextsize": 4096}}, {"alpha": JOB}
    node = await start_standalone(tmp_path, models, weights, {"tracing": {"enabled": True, "endpoint": dead}})
    try:
        responses = await defer.gatherResults(
            [defer.Deferred.fromCoroutine(_chat(node.url, _traceparent()[0])) for _ in range(20)])
        assert [r.code for r in responses] == [200] * 20
        for response in responses:
            assert json.loads(await response.content())["model"] == "alpha"
    finally:
        await node.stop()


@pytest_twisted.ensureDeferred
async def test_when_the_master_is_the_helper_its_in_process_borrowed_request_stays_in_the_trace(
        tmp_path: Path) -> None:
    """The master relays a lent request to itself without HTTP: the borrowed request's span is still
    the relay span's child, in the client's trace."""
    receiver = Receiver()
    tracing = {"tracing": {"enabled": True, "endpoint": receiver.start()}}
    plan = plan_cluster(tmp_path, ["owner"])
    write_models(plan.root / "master", {"gamma": {"model": "../weights/gamma.sim.json", "contextsize": 4096}},
                 {"gamma": JOB})
    write_models(plan.root / "owner", {"alpha": {"model": "../weights/alpha.sim.json", "contextsize": 4096}},
                 {"alpha": JOB})
    master = await start_node(plan.master_config(LENDING, sections=tracing))
    owner = await start_node(plan.slave_config("owner", extra_cluster=LENDING, sections=tracing))
    try:
        registry = master.node.master.registry  # type: ignore[union-attr]
        await wait_until(lambda: registry.node("owner") is not None)
        for model in ("alpha", "gamma"):
            for _ in range(3):
                response = await treq.post(master.url + "/v1/chat/completions", json=chat(model))
                assert response.code == 200
                await response.content()
        await lend_to_the_master(master, owner)
        sent = [_traceparent() for _ in range(8)]
        responses = await defer.gatherResults(
            [defer.Deferred.fromCoroutine(_chat(master.url, parent)) for parent, _, _ in sent])
        assert [r.code for r in responses] == [200] * 8
        lent = [ids for ids, r in zip(sent, responses, strict=True)
                if r.headers.getRawHeaders(b"x-routerd-lent-to") == [b"master/gamma"]]
        assert lent, "some of the backlog went to the master"
        _parent, trace_id, client_span = lent[0]
        # each node's batch exporter sends on its own second: wait for every node's part of the trace
        wanted = {("master", "routerd.backend_request"), ("master", "routerd.relay"),
                  ("owner", "routerd.request"), ("owner", "routerd.forward"), ("owner", "routerd.lend")}
        await wait_until(lambda: wanted <= {(s.node, s.name) for s in receiver.trace(trace_id)}, timeout=15.0)
        spans = receiver.trace(trace_id)
        first = _one(spans, "master", "routerd.request", client_span)
        o_request = _one(spans, "owner", "routerd.request", _one(spans, "master", "routerd.forward", first))
        o_forward = _one(spans, "owner", "routerd.forward", _one(spans, "owner", "routerd.lend", o_request))
        relay = _one(spans, "master", "routerd.relay", o_forward)
        borrowed = _one(spans, "master", "routerd.request", relay)
        assert borrowed.attributes["routerd.lent_from"] == "owner/alpha"
        _one(spans, "master", "routerd.backend_request", borrowed)
    finally:
        await owner.stop()
        await master.stop()
        assert receiver.port is not None
        await receiver.port.stopListening()


@pytest_twisted.ensureDeferred
async def test_a_step_has_a_span_of_its_own_only_when_it_took_time_or_made_a_choice(tmp_path: Path) -> None:
    """The rule (contract §2 "tracing"): a cold model's load has its span, a request that waited in
    the queue its queue-wait span, a refusal its choice span; a request whose model was loaded, whose
    slot was free and that named a model of the node's own catalog is the request's span and the
    backend request's, its span saying ``routerd.target`` ``local``."""
    receiver = Receiver()
    tracing = {"tracing": {"enabled": True, "endpoint": receiver.start()}}
    models = {"alpha": {"model": "../weights/alpha.sim.json", "contextsize": 4096, "parallel": 1}}
    node = await start_standalone(tmp_path, models, {"alpha": JOB}, tracing)
    try:
        cold, cold_trace, _ = _traceparent()
        assert (await _chat(node.url, cold)).code == 200  # the first request loads alpha
        # one slot: the router queue admits the first two (one runs, one waits at the backend) and
        # holds the others until a request ends
        sent = [_traceparent() for _ in range(4)]
        responses = await defer.gatherResults(
            [defer.Deferred.fromCoroutine(_chat(node.url, parent)) for parent, _, _ in sent])
        assert [r.code for r in responses] == [200] * 4
        unknown, unknown_trace, _ = _traceparent()
        refused = await treq.post(node.url + "/v1/chat/completions", json=chat("nowhere"),
                                  headers={"traceparent": [unknown]})
        assert refused.code == 404
        traces = [cold_trace, *(trace_id for _, trace_id, _ in sent), unknown_trace]
        await wait_until(lambda: all(any(s.name == "routerd.request" for s in receiver.trace(t))
                                     for t in traces), timeout=15.0)

        def names(trace_id: str) -> list[str]:
            return sorted(s.name for s in receiver.trace(trace_id))

        load = _one(receiver.trace(cold_trace), NODE, "routerd.backend_load")
        assert load.attributes == {"routerd.model_id": "alpha", "routerd.switch": True}
        assert names(cold_trace) == ["routerd.backend_load", "routerd.backend_request", "routerd.request"]
        waited = [t for _, t, _ in sent if "routerd.queue_wait" in names(t)]
        at_once = [t for _, t, _ in sent if t not in waited]
        assert waited and at_once, [names(t) for _, t, _ in sent]
        for trace_id in waited:
            wait = _one(receiver.trace(trace_id), NODE, "routerd.queue_wait")
            assert wait.attributes["routerd.verdict"] == "admit"
        for trace_id in at_once:
            assert names(trace_id) == ["routerd.backend_request", "routerd.request"]
        for trace_id in (cold_trace, *at_once):
            request = _one(receiver.trace(trace_id), NODE, "routerd.request")
            assert request.attributes["routerd.target"] == "local"
        choice = _one(receiver.trace(unknown_trace), NODE, "routerd.route_choice")
        assert choice.attributes["routerd.target"] == "refuse"
        assert "nowhere" in choice.attributes["routerd.reason"]
    finally:
        await node.stop()
        assert receiver.port is not None
        await receiver.port.stopListening()
