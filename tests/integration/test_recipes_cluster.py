"""Split recipes on a real cluster: text on one slave, image on another (issue 15)."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_twisted
import treq

from tests.integration.nodes import (
    FAST_TEXT,
    Cluster,
    knows,
    plan_cluster,
    start_cluster,
    start_node,
    write_models,
)

PAINTER = {"kind": "image", "load_ms": 30, "ms_per_step_megapixel": 5}
JOB = {"prompt": "a lighthouse", "size": "256x256", "steps": 2}


Trio = Cluster  # the master, slave-a (text) and slave-b (image)


@pytest_twisted.async_yield_fixture
async def trio(tmp_path: Path) -> AsyncIterator[Trio]:
    plan = plan_cluster(tmp_path, ["slave-a", "slave-b"])
    write_models(plan.root / "master", {"mine": {"model": "../weights/mine.sim.json"}}, {"mine": FAST_TEXT})
    write_models(plan.root / "slave-a", {"words": {"model": "../weights/words.sim.json"}},
                 {"words": FAST_TEXT})
    write_models(plan.root / "slave-b", {"paint": {"sdmodel": "../weights/paint.sim.json"}},
                 {"paint": PAINTER})
    trio = await start_cluster(plan, ready=lambda r: knows(r, **{"slave-a": "words", "slave-b": "paint"}))
    yield trio
    await trio.stop()


async def _call(method: str, url: str, body: Any = None) -> tuple[int, Any, Any]:
    response = await treq.request(method, url, json=body) if body is not None else \
        await treq.request(method, url)
    raw = await response.content()
    try:
        return response.code, json.loads(raw), response
    except ValueError:
        return response.code, raw, response


RECIPE = {"id": "duo", "text": {"node_id": "slave-a", "model_id": "words"},
          "image": {"node_id": "slave-b", "model_id": "paint"}}


@pytest_twisted.ensureDeferred
async def test_a_split_recipe_routes_text_and_image_to_their_nodes_and_loads_both(trio: Trio) -> None:
    url = trio.master.url
    code, saved, _ = await _call("POST", url + "/router/v1/site/recipes", RECIPE)
    assert code == 200, saved
    assert saved["recipe"]["public_id"] == "duo" and saved["recipe"]["public_image_id"] == "duo-image"
    path = trio.plan.root / "master" / "store" / "split-recipes.json"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    # listed and in the inventory
    models = (await _call("GET", url + "/v1/models"))[1]
    assert "duo" in [m["id"] for m in models["data"]]
    sd = (await _call("GET", url + "/sdapi/v1/sd-models"))[1]
    assert "duo-image" in [m["model_name"] for m in sd]
    inventory = (await _call("GET", url + "/router/v1/site/inventory"))[1]
    assert [r["id"] for r in inventory["recipes"]] == ["duo"]
    # explicit load prepares both components on their nodes
    code, loaded, _ = await _call("POST", url + "/router/v1/load", {"model": "duo"})
    assert code == 200, loaded
    assert [(c["lane"], c["node_id"]) for c in loaded["loaded"]] == [("text", "slave-a"),
                                                                      ("image", "slave-b")]
    assert trio.slaves["slave-a"].node.runtimes.loaded_config("text") == "words.kcpps"
    assert trio.slaves["slave-b"].node.runtimes.loaded_config("image") == "paint.kcpps"
    # text goes to slave-a, image to slave-b, answers carry the recipe's public IDs
    code, answer, response = await _call("POST", url + "/v1/chat/completions", {
        "model": "duo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert code == 200, answer
    assert answer["model"] == "duo"
    assert response.headers.getRawHeaders(b"x-routerd-node") == [b"slave-a"]
    code, answer, response = await _call("POST", url + "/v1/images/generations",
                                         {"model": "duo-image", **JOB})
    assert code == 200, answer
    assert response.headers.getRawHeaders(b"x-routerd-node") == [b"slave-b"]
    # the image lane is not served under the text public ID
    code, _, _ = await _call("POST", url + "/v1/chat/completions", {
        "model": "duo-image", "messages": [{"role": "user", "content": "hi"}]})
    assert code == 404


@pytest_twisted.ensureDeferred
async def test_recipe_validation_refuses_bad_components_and_survives_a_restart(trio: Trio) -> None:
    url = trio.master.url + "/router/v1/site/recipes"
    code, err, _ = await _call("POST", url, {"id": "bad",
                                             "text": {"node_id": "slave-b", "model_id": "paint"}})
    assert code == 400 and err["error"]["code"] == "capability_mismatch"
    code, err, _ = await _call("POST", url, {"id": "bad", "text": {"node_id": "slave-c", "model_id": "x"}})
    assert code == 400 and err["error"]["code"] == "component_not_found"
    code, err, _ = await _call("POST", url, {"id": "../etc",
                                             "text": {"node_id": "slave-a", "model_id": "words"}})
    assert code == 400
    assert (await _call("POST", url, RECIPE))[0] == 200
    code, err, _ = await _call("POST", url, RECIPE)
    assert code == 400 and err["error"]["code"] == "recipe_exists"
    # a restarted master reads the recipes back
    await trio.master.stop()
    master = await start_node(trio.plan.master_config())
    try:
        assert [r.id for r in master.node.recipes.book.recipes()] == ["duo"]  # type: ignore[union-attr]
        code, _, _ = await _call("DELETE", master.url + "/router/v1/site/recipes?id=duo")
        assert code == 200
        assert (await _call("DELETE", master.url + "/router/v1/site/recipes?id=duo"))[0] == 404
        code, listed, _ = await _call("GET", master.url + "/router/v1/site/recipes")
        assert listed == {"recipes": []}
    finally:
        await master.stop()
