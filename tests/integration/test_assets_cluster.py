"""Assets between real nodes (issue 15): a slave missing weights pulls them by hash from a peer and
serves; a corrupted copy is rejected and the next peer used; a cut transfer resumes with Range; the
asset and file-hash APIs refuse traversal."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest_twisted
import treq

from tests.integration.nodes import (
    FAST_TEXT,
    TOKEN,
    ClusterPlan,
    RunningNode,
    plan_cluster,
    start_node,
    wait_until,
    write_models,
)

CLUSTER = {"authorization": f"Bearer {TOKEN}"}


@attrs.define
class Setup:
    plan: ClusterPlan
    master: RunningNode
    holder: RunningNode
    sha: str
    weights: bytes
    nodes: list[RunningNode] = attrs.field(factory=list)


def _weights(root: Path) -> bytes:
    # padded so a transfer is more than one read
    return (root / "weights" / "chat.sim.json").read_bytes()


@pytest_twisted.async_yield_fixture
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    plan = plan_cluster(tmp_path, ["holder", "puller"])
    spec = {**FAST_TEXT, "padding": "x" * 300_000}
    for name in ("master", "holder"):
        write_models(plan.root / name, {"chat": {"model": "../weights/chat.sim.json", "contextsize": 4096}},
                     {"chat": spec})
    (plan.root / "master" / "files" / "sub").mkdir(parents=True)
    (plan.root / "master" / "files" / "sub" / "note.bin").write_bytes(b"hello")
    os.symlink(plan.root / "master" / "store", plan.root / "master" / "files" / "escape")
    weights = _weights(plan.root / "master")
    master_cfg = plan.master_config({"public_url": plan.master_url})
    master_cfg = attrs.evolve(master_cfg, models=attrs.evolve(
        master_cfg.models, file_roots=(str(plan.root / "master" / "files"),)))
    master = await start_node(master_cfg)
    holder = await start_node(plan.slave_config("holder"))
    registry = master.node.master.registry  # type: ignore[union-attr]
    await wait_until(lambda: registry.find("holder", local_id="chat") is not None)
    out = Setup(plan, master, holder, hashlib.sha256(weights).hexdigest(), weights, [holder, master])
    yield out
    for node in reversed(out.nodes):
        if node not in (holder, master):
            await node.stop()
    await holder.stop()
    await master.stop()


async def _puller(s: Setup) -> RunningNode:
    root = s.plan.root / "puller"
    write_models(root, {"chat": {"model": "chat.sim.json", "model_hash": s.sha,
                                 "model_filename": "chat.sim.json", "contextsize": 4096}}, {})
    node = await start_node(s.plan.slave_config("puller"))
    s.nodes.append(node)
    return node


def _bound(node: Any, pulled: Path) -> bool:
    model = node.node.catalog.get("chat")
    return model is not None and model.text_model == str(pulled)


def _shared(s: Setup) -> Path:
    return s.plan.root / "puller" / "store" / "model-assets" / "sha256" / s.sha[:2] / s.sha


async def _chat(url: str) -> tuple[int, Any]:
    response = await treq.post(url + "/v1/chat/completions", json={
        "model": "chat", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2})
    return response.code, json.loads(await response.content())


@pytest_twisted.ensureDeferred
async def test_a_slave_missing_weights_pulls_them_by_hash_and_then_serves(setup: Setup) -> None:
    puller = await _puller(setup)
    pulled = _shared(setup) / "chat.sim.json"
    # The states are published, then the bound catalog is hashed off the reactor and installed:
    # wait for both (on a loaded machine the hashing thread may still run when the state is set).
    await wait_until(lambda: puller.node.assets.states.get("chat") is not None and _bound(puller, pulled),
                     timeout=10)
    assert puller.node.assets.states["chat"].state == "ready", puller.node.assets.states
    assert pulled.read_bytes() == setup.weights
    assert not (_shared(setup) / ".partial").exists()
    model = puller.node.catalog.get("chat")
    assert model is not None and model.text_model == str(pulled)
    code, answer = await _chat(puller.url)
    assert code == 200, answer
    # the record says it is bound, and progress is visible
    snapshot = puller.node.snapshot()
    assert snapshot["models"][0]["asset_state"] == "ready"
    state = await (await treq.get(puller.url + "/router/v1/node/assets/state", headers=CLUSTER)).json()
    assert state["transfers"][0]["state"] == "done"
    assert state["transfers"][0]["received"] == len(setup.weights)
    metrics = (await (await treq.get(puller.url + "/metrics")).content()).decode()
    assert f"routerd_asset_bytes_transferred_total {float(len(setup.weights))}" in metrics


@pytest_twisted.ensureDeferred
async def test_a_corrupted_copy_is_rejected_and_the_next_peer_serves_the_file(setup: Setup) -> None:
    # corrupt the master's copy without changing its size or mtime: its index still vouches for it
    path = setup.plan.root / "master" / "weights" / "chat.sim.json"
    st = os.stat(path)
    path.write_bytes(setup.weights[:-2] + b"XX")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    puller = await _puller(setup)
    await wait_until(lambda: puller.node.assets.states.get("chat") is not None, timeout=10)
    assert puller.node.assets.states["chat"].state == "ready", puller.node.assets.states
    transfer = puller.node.assets.puller.transfers[setup.sha]
    assert transfer.source == setup.holder.url
    # the master was asked first and its copy refused
    assert transfer.state == "done" and setup.master.url in transfer.reason
    assert "expected sha256" in transfer.reason
    assert (_shared(setup) / "chat.sim.json").read_bytes() == setup.weights


@pytest_twisted.ensureDeferred
async def test_a_cut_transfer_resumes_from_its_partial_with_a_range_request(setup: Setup) -> None:
    half = len(setup.weights) // 2
    _shared(setup).mkdir(parents=True)
    (_shared(setup) / ".partial").write_bytes(setup.weights[:half])
    puller = await _puller(setup)
    await wait_until(lambda: puller.node.assets.states.get("chat") is not None, timeout=10)
    assert puller.node.assets.states["chat"].state == "ready", puller.node.assets.states
    assert (_shared(setup) / "chat.sim.json").read_bytes() == setup.weights
    # only the missing half travelled
    metrics = (await (await treq.get(puller.url + "/metrics")).content()).decode()
    assert f"routerd_asset_bytes_transferred_total {float(len(setup.weights) - half)}" in metrics


@pytest_twisted.ensureDeferred
async def test_assets_stream_by_hash_with_one_range_and_refuse_anything_else(setup: Setup) -> None:
    url = setup.master.url + "/router/v1/node/assets/"
    response = await treq.get(url + setup.sha, headers=CLUSTER)
    assert response.code == 200 and await response.content() == setup.weights
    assert response.headers.getRawHeaders(b"x-content-type-options") == [b"nosniff"]
    response = await treq.get(url + setup.sha, headers={**CLUSTER, "range": "bytes=10-19"})
    assert response.code == 206 and await response.content() == setup.weights[10:20]
    size = len(setup.weights)
    assert response.headers.getRawHeaders(b"content-range") == [f"bytes 10-19/{size}".encode()]
    response = await treq.get(url + setup.sha, headers={**CLUSTER, "range": "bytes=0-1,5-6"})
    assert response.code == 416
    assert (await treq.get(url + "0" * 64, headers=CLUSTER)).code == 404
    assert (await treq.get(url + "..%2F..%2Fetc%2Fpasswd", headers=CLUSTER)).code == 404
    assert (await treq.get(url + setup.sha)).code == 401  # cluster token only
    lookup = await treq.post(url + "lookup", json={"hashes": [setup.sha, setup.sha, "1" * 64]},
                             headers=CLUSTER)
    assert (await lookup.json())["assets"] == [{"sha256": setup.sha, "filename": "chat.sim.json",
                                                "size": len(setup.weights)}]
    bad = await treq.post(url + "lookup", json={"hashes": ["../etc/passwd"]}, headers=CLUSTER)
    assert bad.code == 400
    merged = await treq.post(url + "lookup-cluster", json={"hashes": [setup.sha]}, headers=CLUSTER)
    assert {a["node_url"] for a in (await merged.json())["assets"]} == {setup.master.url,
                                                                        setup.holder.url}
    site = await (await treq.get(setup.master.url + "/router/v1/site/model-assets/" + setup.sha)).json()
    assert site["available"] and site["nodes"] == ["holder", "master"]


@pytest_twisted.ensureDeferred
async def test_file_hashing_refuses_traversal_absolute_paths_and_symlink_escapes(setup: Setup) -> None:
    url = setup.master.url + "/router/v1/site/model-files/hash"
    ok = await treq.post(url, json={"path": "sub/note.bin"})
    assert ok.code == 200 and (await ok.json())["sha256"] == hashlib.sha256(b"hello").hexdigest()
    for path in ("../store/hash-cache.json", "/etc/passwd", "sub/../../store/hash-cache.json",
                 "escape/hash-cache.json", "sub/\x00x", ""):
        response = await treq.post(url, json={"path": path})
        assert response.code == 400, path
    # a node_id/node_url pair must match the registry
    response = await treq.post(url, json={"node_id": "holder", "node_url": "http://evil.example",
                                          "path": "x"})
    assert response.code == 400 and b"does not match" in await response.content()
    response = await treq.post(url, json={"node_id": "nobody", "path": "x"})
    assert response.code == 400 and b"node url for nobody is required" in await response.content()
