"""A master and two slaves, each a real node on 127.0.0.1 with simulator backends."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_twisted
import treq
from twisted.internet import reactor, task

from routerd.routing.sse import parse_events
from routerd.sim.wav import make_wav
from tests.integration.nodes import (
    FAST_TEXT,
    TOKEN,
    Cluster,
    ClusterPlan,
    plan_cluster,
    post,
    sim_model,
    start_cluster,
    start_node,
    wait_until,
    write_models,
)

SHARED = sim_model("shared")
EARS = {"whispermodel": "../weights/ears.sim.json"}
STT = {"kind": "stt", "load_ms": 20, "realtime_factor": 0.01}


def _layout(plan: ClusterPlan) -> None:
    write_models(plan.root / "master", {"shared": SHARED, "mine": {"model": "../weights/mine.sim.json"}},
                 {"shared": {**FAST_TEXT, "weights": "shared-v1"}, "mine": FAST_TEXT})
    write_models(plan.root / "slave-a", {"shared": SHARED, "alpha": {"model": "../weights/alpha.sim.json"},
                                         "ears": EARS},
                 {"shared": {**FAST_TEXT, "weights": "shared-v1"}, "alpha": FAST_TEXT, "ears": STT})
    write_models(plan.root / "slave-b", {"shared": SHARED, "ears": EARS},
                 {"shared": {**FAST_TEXT, "weights": "shared-v2"}, "ears": STT})






@pytest_twisted.async_yield_fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    plan = plan_cluster(tmp_path, ["slave-a", "slave-b"])
    _layout(plan)
    running = await start_cluster(plan)
    yield running
    await running.stop()


def chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3, **extra}


def _auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@pytest_twisted.ensureDeferred
async def test_slaves_register_and_the_master_merges_models_by_identity(cluster: Cluster) -> None:
    inventory = await (await treq.get(cluster.master.url + "/router/v1/site/inventory")).json()
    nodes = {n["node_id"]: n for n in inventory["nodes"]}
    assert set(nodes) == {"master", "slave-a", "slave-b"}
    assert all(n["healthy"] for n in nodes.values())
    by_node = {(m["node_id"], m["local_id"]): m["public_id"] for m in inventory["models"]}
    # identical hashes merge under one public ID; different weights get a stable suffix
    assert by_node[("master", "shared")] == "shared"
    assert by_node[("slave-a", "shared")] == "shared"
    assert by_node[("slave-b", "shared")] == "shared-2"
    models = await (await treq.get(cluster.master.url + "/v1/models")).json()
    ids = [m["id"] for m in models["data"]]
    assert sorted(ids) == ["alpha", "mine", "shared", "shared-2"]
    assert not any("slave" in i for i in ids)


@pytest_twisted.ensureDeferred
async def test_a_suffixed_model_is_forwarded_with_its_local_id_and_answered_with_the_public_one(
        cluster: Cluster) -> None:
    code, payload, response = await post(cluster.master.url + "/v1/chat/completions", chat("shared-2"))
    assert code == 200, payload
    assert payload["model"] == "shared-2"
    assert response.headers.getRawHeaders(b"x-routerd-node") == [b"slave-b"]
    # the slave saw its own local ID
    state = cluster.slaves["slave-b"].node.runtimes.status()
    assert [s.model_id for s in state if s.kind == "text"] == ["shared"]
    # streaming, both SSE and Ollama NDJSON, comes back rewritten chunk by chunk
    response = await treq.post(cluster.master.url + "/v1/chat/completions",
                               json=chat("shared-2", stream=True))
    frames = [line for line in (await response.content()).split(b"\n") if line.startswith(b"data: {")]
    assert frames and all(json.loads(f[6:])["model"] == "shared-2" for f in frames)
    response = await treq.post(cluster.master.url + "/api/chat", json={
        "model": "shared-2", "messages": [{"role": "user", "content": "hi"}], "options": {"num_predict": 2}})
    lines = [json.loads(x) for x in (await response.content()).splitlines() if x.strip()]
    assert lines[-1]["done"] and all(x["model"] == "shared-2" for x in lines)


@pytest_twisted.ensureDeferred
async def test_a_request_goes_to_the_node_holding_the_named_model(cluster: Cluster) -> None:
    code, payload, response = await post(cluster.master.url + "/v1/chat/completions", chat("alpha"))
    assert code == 200 and payload["model"] == "alpha"
    assert response.headers.getRawHeaders(b"x-routerd-node") == [b"slave-a"]
    code, payload, response = await post(cluster.master.url + "/v1/chat/completions", chat("mine"))
    assert response.headers.getRawHeaders(b"x-routerd-node") == [b"master"]


@pytest_twisted.ensureDeferred
async def test_replicas_prefer_the_idle_master_then_rotate_over_slaves(cluster: Cluster) -> None:
    url = cluster.master.url + "/v1/chat/completions"
    code, _, response = await post(url, chat("shared"))
    assert response.headers.getRawHeaders(b"x-routerd-node") == [b"master"]
    # hold the master's replica busy with a long stream, then the next goes to slave-a
    long = treq.post(url, json=chat("shared", max_tokens=300, stream=True), unbuffered=True)
    busy = await long
    collecting = treq.collect(busy, lambda _d: None)
    await task.deferLater(reactor, 0.1, lambda: None)
    code, _, response = await post(url, chat("shared"))
    assert code == 200
    assert response.headers.getRawHeaders(b"x-routerd-node") == [b"slave-a"]
    await collecting


@pytest_twisted.ensureDeferred
async def test_unlisted_slave_and_wrong_token_are_refused(cluster: Cluster) -> None:
    snapshot = {"node_id": "intruder", "node_url": "http://127.0.0.1:1", "protocol_version": 2,
                "build_version": "x", "models": []}
    response = await treq.post(cluster.master.url + "/router/v1/node/register", json=snapshot,
                               headers=_auth(TOKEN))
    assert response.code == 403
    assert "not configured" in (await response.json())["error"]["message"]
    registry = cluster.master.node.master.registry  # type: ignore[union-attr]
    assert registry.node("intruder") is None
    response = await treq.post(cluster.master.url + "/router/v1/node/register", json=snapshot,
                               headers=_auth("wrong-token-0123456789"))
    assert response.code == 401
    response = await treq.post(cluster.master.url + "/router/v1/node/register", data=b"{broken",
                               headers=_auth(TOKEN))
    assert response.code == 400
    # a slave refuses non-inference paths on its inference prefix
    slave = cluster.slaves["slave-a"].url
    response = await treq.post(slave + "/router/v1/node/inference/router/v1/load", json={},
                               headers=_auth(TOKEN))
    assert response.code == 404
    # site routes are the master's only
    response = await treq.get(slave + "/router/v1/site/inventory")
    assert response.code == 404


@pytest_twisted.ensureDeferred
async def test_a_dead_slave_makes_its_models_unavailable_until_it_returns(cluster: Cluster) -> None:
    registry = cluster.master.node.master.registry  # type: ignore[union-attr]
    await cluster.slaves["slave-a"].stop()
    await wait_until(lambda: not registry.node("slave-a").healthy)  # type: ignore[union-attr]
    code, payload, _ = await post(cluster.master.url + "/v1/chat/completions", chat("alpha"))
    assert code == 502 and "no available replicas" in payload["error"]["message"]
    # the cluster keeps serving from the other replicas
    code, _, response = await post(cluster.master.url + "/v1/chat/completions", chat("shared"))
    assert code == 200
    # the node is still listed, unavailable
    inventory = await (await treq.get(cluster.master.url + "/router/v1/site/inventory")).json()
    alpha = [m for m in inventory["models"] if m["local_id"] == "alpha"]
    assert alpha and alpha[0]["available"] is False
    cluster.slaves["slave-a"] = await start_node(cluster.plan.slave_config("slave-a"))
    await wait_until(lambda: registry.node("slave-a").healthy)  # type: ignore[union-attr]
    code, payload, _ = await post(cluster.master.url + "/v1/chat/completions", chat("alpha"))
    assert code == 200, payload


@pytest_twisted.ensureDeferred
async def test_a_slave_dying_mid_stream_gives_the_client_an_error(cluster: Cluster) -> None:
    """The error is the stream's last event (SSE ``error``, no ``data: [DONE]``) and the answer then
    ends whole: the client reads an error, not a connection that broke."""
    url = cluster.master.url + "/v1/chat/completions"
    response = await treq.post(url, json=chat("alpha", max_tokens=400, stream=True), unbuffered=True)
    got: list[bytes] = []
    collecting = treq.collect(response, got.append)
    await task.deferLater(reactor, 0.1, lambda: None)
    await cluster.slaves["slave-a"].node.runtimes.stop()  # the backend goes away mid-answer
    await collecting
    events = parse_events(b"".join(got))
    assert len(events) > 1 and events[-1].name == "error" and b"[DONE]" not in b"".join(got), events[-2:]
    assert json.loads(events[-1].data)["error"]["code"] == "backend_error"
    code, _, _ = await post(url, chat("shared-2"))
    assert code == 200


@pytest_twisted.ensureDeferred
async def test_selector_less_transcription_prefers_a_loaded_remote_then_rotates_idle_nodes(
        cluster: Cluster) -> None:
    url = cluster.master.url + "/v1/audio/transcriptions"

    async def transcribe() -> bytes:
        response = await treq.post(url, files={"file": ("a.wav", "audio/wav", make_wav(0.5))})
        assert response.code == 200, await response.content()
        await response.content()
        return response.headers.getRawHeaders(b"x-routerd-node")[0]

    first, second = await transcribe(), await transcribe()
    # both slaves idle at first: equal candidates rotate...
    assert {first, second} <= {b"slave-a", b"slave-b"}
    # ...and once one has its STT config loaded, the loaded one wins
    await cluster.slaves["slave-a"].node.runtimes.unload("stt")
    await cluster.slaves["slave-b"].node.runtimes.unload("stt")
    code, _, _ = await post(cluster.slaves["slave-b"].url + "/router/v1/node/load", {"model": "ears"},
                            headers=_auth(TOKEN))
    assert code == 200
    assert [await transcribe() for _ in range(3)] == [b"slave-b"] * 3


@pytest_twisted.ensureDeferred
async def test_site_load_and_node_state_reach_the_owning_node(cluster: Cluster) -> None:
    code, payload, _ = await post(cluster.master.url + "/router/v1/load", {"model": "alpha"})
    assert code == 200 and payload["node_id"] == "slave-a"
    state = await (await treq.get(cluster.master.url + "/router/v1/site/nodes/state",
                                  params={"node_id": "slave-a"})).json()
    text = [r for r in state["runtimes"] if r["kind"] == "text"][0]
    assert text["model_id"] == "alpha" and text["state"] == "ready"
    code, payload, _ = await post(cluster.master.url + "/router/v1/load", {"model": "nothing"})
    assert code == 404


@pytest_twisted.ensureDeferred
async def test_a_public_id_suffix_survives_a_master_restart_without_moving(tmp_path: Path) -> None:
    plan = plan_cluster(tmp_path, ["slave-b", "slave-c"])
    write_models(plan.root / "master", {"shared": SHARED}, {"shared": {**FAST_TEXT, "weights": "v1"}})
    write_models(plan.root / "slave-b", {"shared": SHARED}, {"shared": {**FAST_TEXT, "weights": "v2"}})
    write_models(plan.root / "slave-c", {"shared": SHARED}, {"shared": {**FAST_TEXT, "weights": "v3"}})
    master = await start_node(plan.master_config())
    slave_b = await start_node(plan.slave_config("slave-b"))
    registry = master.node.master.registry  # type: ignore[union-attr]
    await wait_until(lambda: registry.node("slave-b") is not None)
    slave_c = await start_node(plan.slave_config("slave-c"))
    await wait_until(lambda: registry.node("slave-c") is not None)
    ids = {r.node_id: r.public_id for r in registry.records()}
    assert ids == {"master": "shared", "slave-b": "shared-2", "slave-c": "shared-3"}
    await slave_b.stop()
    await slave_c.stop()
    await master.stop()
    # a new master process on the same store; only slave-c comes back
    master = await start_node(plan.master_config())
    slave_c = await start_node(plan.slave_config("slave-c"))
    registry = master.node.master.registry  # type: ignore[union-attr]
    await wait_until(lambda: registry.node("slave-c") is not None)
    assert {r.node_id: r.public_id for r in registry.records()} == {"master": "shared", "slave-c": "shared-3"}
    code, payload, _ = await post(master.url + "/v1/chat/completions", chat("shared-3"))
    assert code == 200 and payload["model"] == "shared-3"
    await slave_c.stop()
    await master.stop()


@pytest_twisted.ensureDeferred
async def test_a_routing_only_master_starts_no_backend_and_routes_everything_to_slaves(
        tmp_path: Path) -> None:
    plan = plan_cluster(tmp_path, ["slave-a"])
    (plan.root / "master" / "models").mkdir(parents=True)  # 1. an empty config_dir, 2. no startup model
    write_models(plan.root / "slave-a", {"alpha": {"model": "../weights/alpha.sim.json"}, "ears": EARS},
                 {"alpha": FAST_TEXT, "ears": STT})
    master = await start_node(plan.master_config())
    slave = await start_node(plan.slave_config("slave-a"))
    try:
        registry = master.node.master.registry  # type: ignore[union-attr]
        await wait_until(lambda: registry.node("slave-a") is not None)
        code, payload, response = await post(master.url + "/v1/chat/completions", chat("alpha"))
        assert code == 200 and response.headers.getRawHeaders(b"x-routerd-node") == [b"slave-a"]
        response = await treq.post(master.url + "/v1/audio/transcriptions",
                                   files={"file": ("a.wav", "audio/wav", make_wav(0.3))})
        assert response.code == 200
        assert response.headers.getRawHeaders(b"x-routerd-node") == [b"slave-a"]
        # the master started no backend process
        assert all(s.pid is None and s.state == "empty" for s in master.node.runtimes.status())
        assert (await treq.get(master.url + "/router/v1/site/inventory")).code == 200
    finally:
        await slave.stop()
        await master.stop()
