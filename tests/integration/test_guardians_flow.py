"""Guardian models end to end (spec "Guardian models"): a master and two slaves with simulator
backends.  ``left`` has a text-only ``text``, a multimodal ``vision`` and ``shy`` (an mmproj in its
config, so multimodal on paper, but its backend runs with ``--no-mmproj`` and refuses images the
way llama-server does); ``right`` has a multimodal ``big`` and a text-only ``own``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_twisted
import treq
from twisted.internet import defer, reactor, task

from routerd.routing.guardians import GuardianSet
from tests.integration import nodes
from tests.integration.nodes import (
    FAST_TEXT,
    RunningNode,
    plan_cluster,
    sim_model,
    start_cluster,
    wait_until,
    write_models,
)

GUARDIANS = "/router/v1/site/guardians"
QUICK = {"offload_restore_delay": "300ms"}
PNG = "data:image/png;base64,iVBORw0KGgo="
JOB = {**FAST_TEXT, "load_ms": 30}


class Cluster(nodes.Cluster):
    """The master, ``left`` and ``right``."""

    left = nodes.slave("left")
    right = nodes.slave("right")


@pytest_twisted.async_yield_fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    plan = plan_cluster(tmp_path, ["left", "right"])
    (plan.root / "master" / "models").mkdir(parents=True)
    write_models(plan.root / "left", {
        "text": sim_model("text"),
        "vision": sim_model("vision", mmproj="../weights/proj.gguf"),
        "shy": sim_model("shy", mmproj="../weights/proj.gguf", extra_args=["--no-mmproj"]),
    }, {"text": JOB, "vision": JOB, "shy": JOB})
    write_models(plan.root / "right", {"big": sim_model("big", mmproj="../weights/proj.gguf"),
                                       "own": sim_model("own")}, {"big": JOB, "own": JOB})
    for name in ("left", "right"):
        (plan.root / name / "weights" / "proj.gguf").write_bytes(b"projector")
    slaves = {name: plan.slave_config(name, extra_cluster=QUICK) for name in ("left", "right")}
    started = await start_cluster(
        plan, plan.master_config(QUICK), slaves,
        ready=lambda r: nodes.knows(r, left="shy", right="big") and nodes.all_healthy(r))
    running = Cluster(started.plan, started.master, started.slaves)
    yield running
    await running.stop()


async def _json(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    response = await treq.request(method, url, data=None if body is None else json.dumps(body).encode(),
                                  headers={"content-type": "application/json"})
    return response.code, json.loads(await response.content())


async def _guard(cluster: Cluster, *settings: dict[str, Any]) -> None:
    code, body = await _json("POST", cluster.master.url + GUARDIANS, {"guardians": list(settings)})
    assert code == 200, body
    slaves = (cluster.left.node.lending, cluster.right.node.lending)
    await wait_until(lambda: all(len(s.guardians) == len(settings) for s in slaves))


def _setting(scope: str, guardian: str, **key: str) -> dict[str, Any]:
    node_id, model_id = guardian.split("/")
    return {"scope": scope, **key, "guardian": {"node_id": node_id, "model_id": model_id}}


def plain_chat(model: str) -> dict[str, Any]:
    return {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


def image_chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is in this picture"},
        {"type": "image_url", "image_url": {"url": PNG}}]}], **extra}


async def _post(url: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    response = await treq.post(url + path, json=body)
    content = await response.content()
    headers = {k.decode().lower(): v[0].decode() for k, v in response.headers.getAllRawHeaders()}
    return response.code, headers, content


async def _decisions(node: RunningNode) -> list[dict[str, Any]]:
    return [row for row in await node.node.lending.decisions.query(kind="dispatch")  # type: ignore[union-attr]
            if row["outcome"] == "guardian"]


@pytest_twisted.ensureDeferred
async def test_a_same_node_guardian_answers_and_the_text_model_is_loaded_back_when_quiet(
        cluster: Cluster) -> None:
    await _guard(cluster, _setting("node", "left/vision", node_id="left"))
    code, _, _ = await _post(cluster.master.url, "/v1/chat/completions", plain_chat("text"))
    assert code == 200
    runtimes = cluster.left.node.runtimes
    assert runtimes.loaded_config("text") == "text.kcpps"
    code, headers, content = await _post(cluster.master.url, "/v1/chat/completions", image_chat("text"))
    assert code == 200, content
    assert headers["x-routerd-guardian"] == "left/vision"
    assert headers["x-routerd-node"] == "left"
    assert json.loads(content)["model"] == "text"  # the client sees the model it named
    # the guardian displaced the text model, which came back once the node was quiet (read from the
    # load samples: under load the restore may already be done when the answer is read)
    await wait_until(lambda: runtimes.loaded_config("text") == "text.kcpps", timeout=5)
    store = cluster.left.node.store
    assert store is not None
    loads = [s.config_filename for s in await store.load_samples(0)]
    assert loads[:2] == ["text.kcpps", "vision.kcpps"]
    [row] = await _decisions(cluster.left)
    assert (row["reason"], row["owner_model_id"], row["helper_node_id"], row["helper_model_id"]) == (
        "structure", "text", "left", "vision")


@pytest_twisted.ensureDeferred
async def test_a_cluster_guardian_on_another_node_answers_and_that_node_keeps_it_loaded(
        cluster: Cluster) -> None:
    await _guard(cluster, _setting("cluster", "right/big"))
    code, _, _ = await _post(cluster.master.url, "/v1/chat/completions", plain_chat("own"))
    assert code == 200
    code, headers, content = await _post(cluster.master.url, "/v1/chat/completions", image_chat("text"))
    assert code == 200, content
    assert (headers["x-routerd-guardian"], headers["x-routerd-node"]) == ("right/big", "right")
    assert json.loads(content)["model"] == "text"
    assert cluster.left.node.runtimes.loaded_config("text") is None  # the text model never saw it
    await task.deferLater(reactor, 0.8, lambda: None)  # well past offload_restore_delay
    assert cluster.right.node.runtimes.loaded_config("text") == "big.kcpps"  # no load back there
    [row] = await _decisions(cluster.master)
    assert (row["reason"], row["owner_node_id"], row["helper_node_id"]) == ("structure", "left", "right")


@pytest_twisted.ensureDeferred
async def test_a_guardian_that_cannot_read_images_is_refused(cluster: Cluster) -> None:
    code, body = await _json("POST", cluster.master.url + GUARDIANS, _setting("cluster", "right/own"))
    assert code == 400 and "not a multimodal text model" in body["error"]["message"]
    code, body = await _json("GET", cluster.master.url + GUARDIANS)
    assert code == 200 and body["guardians"] == []
    assert {(c["node_id"], c["model_id"]) for c in body["candidates"]} == {
        ("left", "vision"), ("left", "shy"), ("right", "big")}


@pytest_twisted.ensureDeferred
async def test_an_ollama_images_list_is_detected_and_streams_through_the_guardian(cluster: Cluster) -> None:
    await _guard(cluster, _setting("model", "right/big", node_id="left", model_id="text"))
    code, headers, content = await _post(cluster.master.url, "/api/chat", {
        "model": "text", "stream": False, "options": {"num_predict": 4},
        "messages": [{"role": "user", "content": "what is this", "images": ["iVBORw0KGgo="]}]})
    assert code == 200, content
    assert headers["x-routerd-guardian"] == "right/big"
    assert json.loads(content)["model"] == "text"
    # streaming (OpenAI SSE) through the guardian: every chunk names the model the client asked for
    code, headers, content = await _post(cluster.master.url, "/v1/chat/completions",
                                         image_chat("text", stream=True))
    assert code == 200 and headers["content-type"].startswith("text/event-stream")
    assert headers["x-routerd-guardian"] == "right/big"
    chunks = [json.loads(line[6:]) for line in content.decode().splitlines()
              if line.startswith("data: {")]
    assert chunks and {c["model"] for c in chunks} == {"text"}
    assert content.rstrip().endswith(b"data: [DONE]")


@pytest_twisted.ensureDeferred
async def test_a_backend_refusing_the_image_hands_the_request_to_the_guardian(cluster: Cluster) -> None:
    await _guard(cluster, _setting("model", "right/big", node_id="left", model_id="shy"))
    code, headers, content = await _post(cluster.master.url, "/v1/chat/completions", image_chat("shy"))
    assert code == 200, content
    assert (headers["x-routerd-guardian"], headers["x-routerd-node"]) == ("right/big", "right")
    assert json.loads(content)["model"] == "shy"
    [row] = await _decisions(cluster.master)
    assert (row["reason"], row["owner_node_id"], row["owner_model_id"]) == ("backend_refused", "left", "shy")


@pytest_twisted.ensureDeferred
async def test_a_refusal_with_a_same_node_guardian_is_handled_on_that_node(cluster: Cluster) -> None:
    await _guard(cluster, _setting("node", "left/vision", node_id="left"))
    code, headers, content = await _post(cluster.master.url, "/v1/chat/completions", image_chat("shy"))
    assert code == 200, content
    assert (headers["x-routerd-guardian"], headers["x-routerd-node"]) == ("left/vision", "left")
    [row] = await _decisions(cluster.left)
    assert row["reason"] == "backend_refused"


@pytest_twisted.ensureDeferred
async def test_without_a_guardian_nothing_changes_and_guardians_are_covered_by_in_sync(
        cluster: Cluster) -> None:
    code, headers, content = await _post(cluster.master.url, "/v1/chat/completions", image_chat("text"))
    assert code == 500 and "x-routerd-guardian" not in headers  # the backend's own refusal
    assert b"image input is not supported" in content
    before = cluster.master.node.lending.sync_fingerprint()
    await _guard(cluster, _setting("cluster", "right/big"))
    assert cluster.master.node.lending.sync_fingerprint() != before
    code, summary = await _json("GET", cluster.master.url + "/router/v1/site/offload/summary")
    assert code == 200
    assert [(n["node_id"], n["in_sync"]) for n in summary["nodes"]] == [
        ("left", True), ("master", True), ("right", True)]
    # a slave that lost the guardians is out of sync
    cluster.right.node.lending.install_guardians(GuardianSet())
    code, summary = await _json("GET", cluster.master.url + "/router/v1/site/offload/summary")
    assert {n["node_id"]: n["in_sync"] for n in summary["nodes"]}["right"] is False


@pytest_twisted.ensureDeferred
async def test_a_same_node_guardian_waits_for_the_text_model_running_requests(cluster: Cluster) -> None:
    await _guard(cluster, _setting("node", "left/vision", node_id="left"))
    finished: list[str] = []

    async def ask(name: str, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        answer = await _post(cluster.master.url, "/v1/chat/completions", body)
        finished.append(name)
        return answer

    long_text = {**plain_chat("text"), "max_tokens": 80}  # ~0.4 s of generation on the text model
    running = defer.Deferred.fromCoroutine(ask("text", long_text))
    runtimes = cluster.left.node.runtimes
    await wait_until(lambda: any(a.state == "running" for a in cluster.left.node.local.active.values()))
    guarded = defer.Deferred.fromCoroutine(ask("guardian", image_chat("text")))
    (code, _, _), (g_code, headers, _) = await running, await guarded
    assert (code, g_code) == (200, 200)
    assert headers["x-routerd-guardian"] == "left/vision"
    assert finished == ["text", "guardian"]  # the switch waited for the running request
    await wait_until(lambda: runtimes.loaded_config("text") == "text.kcpps", timeout=5)
