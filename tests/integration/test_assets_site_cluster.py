"""Site asset APIs between real nodes (issue 15, reference §8.5–§8.6): a config exported from one
slave names its weights only by hash and, dropped on another slave, is pulled and served there; an
unresolvable one answers 503 on resolve and is never loaded; jobs, batch resolve, substitution
confirmation and the target-node trust rule."""

from __future__ import annotations

import json
from typing import Any

import pytest_twisted
import treq

from tests.integration.nodes import RunningNode, start_node, wait_until, write_models
from tests.integration.test_assets_cluster import CLUSTER, Setup, _chat, _shared, setup

__all__ = ["setup"]  # the fixture, shared with the peer-pull tests

MISSING = "e" * 64


async def _slave(s: Setup, config: dict[str, Any]) -> RunningNode:
    write_models(s.plan.root / "puller", {"chat": config}, {})
    node = await start_node(s.plan.slave_config("puller"))
    s.nodes.append(node)
    registry = s.master.node.master.registry  # type: ignore[union-attr]
    await wait_until(lambda: registry.node("puller") is not None, timeout=10)
    return node


async def _post(s: Setup, op: str, body: Any) -> tuple[int, Any]:
    response = await treq.post(s.master.url + "/router/v1/site/model-assets/" + op, json=body)
    return response.code, json.loads(await response.content())


@pytest_twisted.ensureDeferred
async def test_an_exported_config_names_weights_by_hash_and_another_slave_pulls_and_serves_it(
        setup: Setup) -> None:
    response = await treq.post(setup.master.url + "/router/v1/site/model-assets/export",
                               json={"node_id": "holder", "model_id": "chat"})
    assert response.code == 200
    assert response.headers.getRawHeaders(b"content-disposition") == [b'attachment; filename="chat.kcpps"']
    portable = json.loads(await response.content())
    assert portable["model_hash"] == setup.sha and portable["model_filename"] == "chat.sim.json"
    assert "model" not in portable and portable["contextsize"] == 4096
    puller = await _slave(setup, portable)  # no path at all: only the hash
    await wait_until(lambda: puller.node.assets.states.get("chat") is not None, timeout=10)
    assert puller.node.assets.states["chat"].state == "ready", puller.node.assets.states
    assert (_shared(setup) / "chat.sim.json").read_bytes() == setup.weights
    code, answer = await _chat(puller.url)
    assert code == 200, answer
    code, doc = await _post(setup, "resolve", {"node_id": "puller", "model_id": "chat"})
    assert code == 200 and doc["asset_state"] == "ready" and doc["fields"][0]["sha256"] == setup.sha
    site = await (await treq.get(setup.master.url + "/router/v1/site/model-assets/" + setup.sha)).json()
    assert site["nodes"] == ["holder", "master", "puller"] and site["size"] == len(setup.weights)


@pytest_twisted.ensureDeferred
async def test_an_unresolvable_config_answers_503_and_never_reaches_a_backend(setup: Setup) -> None:
    puller = await _slave(setup, {"model_hash": MISSING, "model_filename": "gone.gguf"})
    await wait_until(lambda: puller.node.assets.states.get("chat") is not None, timeout=10)
    code, doc = await _post(setup, "resolve", {"node_id": "puller", "model_id": "chat"})
    assert code == 503 and doc["asset_state"] == "unresolved"
    assert doc["error"]["code"] == "assets_unresolved" and MISSING in doc["reason"]
    load = await treq.post(puller.url + "/router/v1/node/load", json={"model": "chat"}, headers=CLUSTER)
    body = await load.json()
    assert load.code == 503 and body["error"]["code"] == "assets_unresolved"
    assert puller.node.runtimes.loaded_config("text") is None
    code, batch = await _post(setup, "resolve-batch", {"requests": [
        {"node_id": "holder", "model_id": "chat"}, {"node_id": "puller", "model_id": "chat"},
        {"node_id": "puller", "model_id": "nope"}]})
    assert code == 200 and [r["status"] for r in batch["results"]] == [200, 503, 404]
    code, _ = await _post(setup, "resolve-batch", {"requests": [{"model_id": "chat"}] * 129})
    assert code == 400
    # a background job: its events tell what happened, fetched through the master by job ID
    code, job = await _post(setup, "jobs", {"node_id": "puller", "model_id": "chat"})
    assert code == 202 and job["node_id"] == "puller"
    url = setup.master.url + "/router/v1/site/model-assets/jobs/" + job["job_id"]
    await wait_until(lambda: puller.node.assets.jobs.get(job["job_id"]).state != "running")  # type: ignore[union-attr]
    state = await (await treq.get(url)).json()
    assert state["state"] == "unresolved"
    events = await (await treq.get(url + "/events?after_sequence=1")).json()
    assert [e["type"] for e in events["events"]] == ["field", "finished"]
    jobs_url = setup.master.url + "/router/v1/site/model-assets/jobs?node_id=puller"
    listed = await (await treq.get(jobs_url)).json()
    assert [j["job_id"] for j in listed["jobs"]] == [job["job_id"]]


@pytest_twisted.ensureDeferred
async def test_substitution_needs_confirmation_and_targets_must_match_the_registry(setup: Setup) -> None:
    code, doc = await _post(setup, "substitute", {"node_id": "holder", "expected_sha256": MISSING,
                                                  "sha256": setup.sha})
    assert code == 400 and doc["error"]["code"] == "confirmation_required"
    code, doc = await _post(setup, "substitute", {"node_id": "holder", "expected_sha256": MISSING,
                                                  "sha256": setup.sha, "confirm": True})
    assert code == 200 and setup.holder.node.assets.book.substitute_for(MISSING) == setup.sha
    code, doc = await _post(setup, "candidates", {"node_id": "holder", "sha256": MISSING})
    assert code == 200 and doc["substitution"]["sha256"] == setup.sha and doc["exact"] == []
    code, doc = await _post(setup, "candidates", {"sha256": setup.sha})
    assert {c["node_url"] for c in doc["exact"]} == {setup.master.url, setup.holder.url}
    code, doc = await _post(setup, "export", {"node_id": "holder", "node_url": "http://evil.example",
                                              "model_id": "chat"})
    assert code == 400 and "does not match the registered node" in doc["error"]["message"]
    code, doc = await _post(setup, "resolve", {"node_id": "nobody", "model_id": "chat"})
    assert code == 400 and "node url for nobody is required" in doc["error"]["message"]
    code, doc = await _post(setup, "bind", {"sha256": setup.sha, "hf": "hf://o/r@main/x.gguf"})
    assert code == 400 and doc["error"]["code"] == "bind_refused"
