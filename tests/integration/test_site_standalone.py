"""A standalone node is a site of one (issue 21 §1): one box with a text-only model, a multimodal
model and an image model, set up through its own site API over real HTTP on 127.0.0.1, with the
simulator's backend processes.  Before, every site route answered 404 on a standalone node."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_twisted
import treq
from twisted.internet import reactor

from tests.integration.nodes import (
    FAST_TEXT,
    RunningNode,
    node_config,
    sim_model,
    start_node,
    wait_until,
    write_models,
)

PNG = "data:image/png;base64,iVBORw0KGgo="
JOB = {**FAST_TEXT, "load_ms": 30}
PAINTER = {"kind": "image", "load_ms": 30, "ms_per_step_megapixel": 5}
RESTORE_DELAY_S = 0.5


@pytest_twisted.async_yield_fixture
async def box(tmp_path: Path) -> AsyncIterator[RunningNode]:
    write_models(tmp_path, {"text": sim_model("text"),
                            "vision": sim_model("vision", mmproj="../weights/proj.gguf"),
                            "paint": {"sdmodel": "../weights/paint.sim.json"}},
                 {"text": JOB, "vision": JOB, "paint": PAINTER})
    (tmp_path / "weights" / "proj.gguf").write_bytes(b"projector")
    running = await start_node(node_config(tmp_path, {"cluster": {"node_id": "box"}}))
    assert running.node.role == "standalone"
    yield running
    await running.stop()


async def _call(method: str, url: str, body: Any = None) -> tuple[int, Any, Any]:
    response = await treq.request(method, url, data=None if body is None else json.dumps(body).encode(),
                                  headers={"content-type": "application/json"})
    raw = await response.content()
    return response.code, json.loads(raw) if raw else None, response


@pytest_twisted.ensureDeferred
async def test_a_guardian_answers_an_image_for_the_text_model_which_is_loaded_back_after_the_delay(
        box: RunningNode) -> None:
    code, body, _ = await _call("POST", box.url + "/router/v1/site/offload/settings",
                                {"values": {"offload_restore_delay": f"{int(RESTORE_DELAY_S * 1000)}ms"}})
    assert code == 200, body
    code, body, _ = await _call("POST", box.url + "/router/v1/site/guardians", {
        "scope": "model", "node_id": "box", "model_id": "text",
        "guardian": {"node_id": "box", "model_id": "vision"}})
    assert code == 200, body
    runtimes = box.node.runtimes
    code, body, _ = await _call("POST", box.url + "/v1/chat/completions", {
        "model": "text", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
    assert code == 200 and runtimes.loaded_config("text") == "text.kcpps"
    code, body, response = await _call("POST", box.url + "/v1/chat/completions", {
        "model": "text", "max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": PNG}}]}]})
    answered = reactor.seconds()
    assert code == 200, body
    assert response.headers.getRawHeaders(b"x-routerd-guardian") == [b"box/vision"]
    assert body["model"] == "text"  # the client sees the model it named
    assert runtimes.loaded_config("text") == "vision.kcpps"  # the guardian displaced it
    await wait_until(lambda: runtimes.loaded_config("text") == "text.kcpps", timeout=10)
    assert reactor.seconds() - answered >= RESTORE_DELAY_S * 0.9  # only once the delay had passed
    code, body, _ = await _call("GET", box.url + "/router/v1/site/offload/decisions?kind=dispatch")
    assert code == 200, body
    assert [(r["outcome"], r["reason"], r["helper_model_id"]) for r in body["records"]] == [
        ("guardian", "structure", "vision")]


@pytest_twisted.ensureDeferred
async def test_a_recipe_of_the_boxs_own_text_and_image_models_routes_both_lanes(box: RunningNode) -> None:
    code, body, _ = await _call("POST", box.url + "/router/v1/site/recipes", {
        "id": "duo", "text": {"node_id": "box", "model_id": "text"},
        "image": {"node_id": "box", "model_id": "paint"}})
    assert code == 200, body
    code, inventory, _ = await _call("GET", box.url + "/router/v1/site/inventory")
    assert [r["id"] for r in inventory["recipes"]] == ["duo"]
    code, loaded, _ = await _call("POST", box.url + "/router/v1/load", {"model": "duo"})
    assert code == 200, loaded
    assert [(c["lane"], c["node_id"]) for c in loaded["loaded"]] == [("text", "box"), ("image", "box")]
    code, answer, _ = await _call("POST", box.url + "/v1/chat/completions", {
        "model": "duo", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert code == 200 and answer["model"] == "duo", answer
    code, answer, _ = await _call("POST", box.url + "/v1/images/generations",
                                  {"model": "duo-image", "prompt": "a lighthouse", "size": "256x256",
                                   "steps": 2})
    assert code == 200, answer
    assert box.node.runtimes.loaded_config("text") == "text.kcpps"
    assert box.node.runtimes.loaded_config("image") == "paint.kcpps"
    # the image lane is not served under the text public ID
    code, _, _ = await _call("POST", box.url + "/v1/chat/completions", {
        "model": "duo-image", "messages": [{"role": "user", "content": "hi"}]})
    assert code == 404
