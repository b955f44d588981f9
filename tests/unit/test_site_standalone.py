"""A standalone node is a site of one (issue 21 §1; contract §7, reference cluster.md §12): the
site API answers on it with the master's code over its own models, where it answered 404
"site routes are served by the master only" before.  One real node in memory (``node_fixture``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.defer import succeed

from routerd.node import Node
from routerd.site.settings import normalise_batch
from routerd.store.guardians import GuardianRow
from routerd.store.store import Store
from tests.unit.node_fixture import IMAGE, TEXT, TOKEN, World

PNG = "data:image/png;base64,iVBORw0KGgo="
MMPROJ = {"mmproj": "../proj.gguf"}


def solo(tmp_path: Path) -> tuple[World, Node]:
    """One standalone node ``solo``: a text-only model, a multimodal one and an image model."""
    world = World(tmp_path)
    (tmp_path / "solo").mkdir(parents=True)
    (tmp_path / "solo" / "proj.gguf").write_bytes(b"projector")
    node = world.node("solo", {"text": TEXT, "vision": {**TEXT, "kcpps": MMPROJ}, "paint": IMAGE})
    world.start(node)
    assert node.role == "standalone" and node.master is None
    return world, node


def call(world: World, node: Node, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    kwargs: dict[str, Any] = {} if body is None else {"json": body}
    response, content = world.call(method, node, path, **kwargs)
    return int(response.code), json.loads(content) if content else None


def test_the_inventory_of_a_standalone_node_lists_itself_and_its_models(tmp_path: Path) -> None:
    world, node = solo(tmp_path)
    code, body = call(world, node, "GET", "/router/v1/site/inventory")
    assert code == 200, body
    assert [(n["node_id"], n["role"], n["healthy"]) for n in body["nodes"]] == [("solo", "standalone", True)]
    assert sorted(m["local_id"] for m in body["models"]) == ["paint", "text", "vision"]
    assert body["recipes"] == []


def test_nodes_state_load_and_unload_on_a_standalone_node_act_on_itself(tmp_path: Path) -> None:
    world, node = solo(tmp_path)
    code, body = call(world, node, "POST", "/router/v1/site/nodes/load", {"node_id": "solo", "model": "text"})
    assert code == 200, body
    assert node.runtimes.loaded_config("text") == "text.kcpps"
    code, state = call(world, node, "GET", "/router/v1/site/nodes/state?node_id=solo")
    assert code == 200 and state["node_id"] == "solo"
    assert any(r["model_id"] == "text" for r in state["runtimes"])
    code, states = call(world, node, "GET", "/router/v1/site/nodes/states")
    assert code == 200 and [s["node_id"] for s in states["states"]] == ["solo"]
    assert states["node_errors"] == []
    # another node is not known to a site of one
    code, body = call(world, node, "GET", "/router/v1/site/nodes/state?node_id=elsewhere")
    assert code == 404 and body["error"]["code"] == "node_not_found"
    code, body = call(world, node, "POST", "/router/v1/site/nodes/unload",
                      {"node_id": "solo", "target": "all"})
    assert code == 200, body
    assert node.runtimes.loaded_config("text") is None


def test_a_guardian_set_through_the_site_api_answers_images_for_the_text_only_model(tmp_path: Path) -> None:
    world, node = solo(tmp_path)
    code, view = call(world, node, "GET", "/router/v1/site/guardians")
    assert code == 200 and view["guardians"] == []
    assert [(c["node_id"], c["model_id"]) for c in view["candidates"]] == [("solo", "vision")]
    code, view = call(world, node, "POST", "/router/v1/site/guardians", {
        "scope": "model", "node_id": "solo", "model_id": "text",
        "guardian": {"node_id": "solo", "model_id": "vision"}})
    assert code == 200, view
    assert len(view["guardians"]) == 1
    response, content = world.call("POST", node, "/v1/chat/completions", json={
        "model": "text", "max_tokens": 4,
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG}}]}]})
    assert response.code == 200, content
    assert response.headers.getRawHeaders(b"x-routerd-guardian") == [b"solo/vision"]
    # a guardian that is not a multimodal text model is refused, nothing stored
    code, body = call(world, node, "POST", "/router/v1/site/guardians", {
        "scope": "cluster", "guardian": {"node_id": "solo", "model_id": "text"}})
    assert code == 400 and body["error"]["code"] == "guardian_not_multimodal"


def test_lending_settings_of_a_standalone_node_are_stored_and_applied(tmp_path: Path) -> None:
    world, node = solo(tmp_path)
    code, body = call(world, node, "POST", "/router/v1/site/offload/settings",
                      {"values": {"offload_restore_delay": "7s"}})
    assert code == 200, body
    assert node.lending.settings.offload_restore_delay == 7.0
    entry = next(e for e in body["entries"] if e["key"] == "offload_restore_delay")
    assert entry["source"] == "db"


def test_a_recipe_of_the_nodes_own_text_and_image_models_routes_both_lanes(tmp_path: Path) -> None:
    world, node = solo(tmp_path)
    code, saved = call(world, node, "POST", "/router/v1/site/recipes", {
        "id": "duo", "text": {"node_id": "solo", "model_id": "text"},
        "image": {"node_id": "solo", "model_id": "paint"}})
    assert code == 200, saved
    code, listed = call(world, node, "GET", "/v1/models")
    assert "duo" in [m["id"] for m in listed["data"]]
    code, answer = call(world, node, "POST", "/v1/chat/completions", {
        "model": "duo", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert code == 200, answer
    assert answer["model"] == "duo" and node.runtimes.loaded_config("text") == "text.kcpps"
    code, answer = call(world, node, "POST", "/v1/images/generations",
                        {"model": "duo-image", "prompt": "a lighthouse", "size": "64x64", "steps": 1})
    assert code == 200, answer
    assert node.runtimes.loaded_config("image") == "paint.kcpps"


@pytest.mark.parametrize("path", ["/router/v1/site/routing-groups", "/router/v1/site/text-routing-groups"])
def test_links_on_a_standalone_node_have_no_candidates_and_cannot_be_made(tmp_path: Path, path: str) -> None:
    world, node = solo(tmp_path)
    model = "paint-paint" if "text" not in path else "text"
    code, view = call(world, node, "GET", path)
    assert code == 200 and view["links"] == []
    code, view = call(world, node, "GET", f"{path}?node_id=solo&model_id={model}")
    assert code == 200 and view["candidates"] == [], view
    code, body = call(world, node, "POST", path, {"anchor": {"node_id": "solo", "model_id": model},
                                                 "lends_to": [{"node_id": "other", "model_id": model}]})
    assert code == 400, body
    assert not node.lending.enrolled("image" if "text" not in path else "text", model)


def test_decisions_and_summary_of_a_standalone_node_are_its_own(tmp_path: Path) -> None:
    world, node = solo(tmp_path)
    code, body = call(world, node, "GET", "/router/v1/site/offload/decisions")
    assert code == 200 and body["node_errors"] == [], body
    code, body = call(world, node, "GET", "/router/v1/site/offload/decisions/folded")
    assert code == 200, body
    code, body = call(world, node, "GET", "/router/v1/site/offload/summary")
    assert code == 200 and [n["node_id"] for n in body["nodes"]] == ["solo"] and body["leases"] == []


def test_a_standalone_node_hashes_its_own_files_through_the_site_api(tmp_path: Path) -> None:
    world, node = solo(tmp_path)
    code, body = call(world, node, "POST", "/router/v1/site/model-files/hash", {"path": "x"})
    # no file roots configured: the node's own answer (403), not the slave's 404
    assert code == 403 and body["error"]["code"] == "no_file_roots"


def test_an_unknown_site_path_on_a_standalone_node_is_an_unknown_endpoint(tmp_path: Path) -> None:
    world, node = solo(tmp_path)
    code, body = call(world, node, "GET", "/router/v1/site/nope")
    assert code == 404 and body["error"]["message"] == "endpoint not found: /router/v1/site/nope"


def test_a_standalone_node_starts_with_the_settings_and_guardians_of_its_database(tmp_path: Path) -> None:
    """What the site API stored is in force after a restart (``assembly.roles.start_site``)."""
    world = World(tmp_path)
    (tmp_path / "solo").mkdir(parents=True)
    (tmp_path / "solo" / "proj.gguf").write_bytes(b"projector")
    node = world.node("solo", {"text": TEXT, "vision": {**TEXT, "kcpps": MMPROJ}})
    stored = Store.open_sync(clock=world.clock)
    world.run(stored.set_setting_overrides(normalise_batch({"offload_restore_delay": "9s"})))
    world.run(stored.put_guardians([GuardianRow("node", "solo", "", "solo", "vision")]))
    node._open_store = lambda _path: succeed(stored)  # the database a previous run left
    world.start(node)
    assert node.lending.settings.offload_restore_delay == 9.0
    assert node.lending.guardians.resolve("solo", "text") is not None


def test_a_standalone_node_refuses_a_pushed_settings_snapshot(tmp_path: Path) -> None:
    """Its settings are its own site's (stored in its database): a push would replace them."""
    world = World(tmp_path)
    node = world.node("solo", {"text": TEXT}, cluster={"token": TOKEN})
    world.start(node)
    response, content = world.call("POST", node, "/router/v1/node/offload/settings",
                                    json={"values": {"offload_restore_delay": "9s"}, "fingerprint": "x"},
                                    headers={"authorization": f"Bearer {TOKEN}"})
    body = json.loads(content)
    assert response.code == 409 and body["error"]["code"] == "is_master", body
    assert node.lending.settings.offload_restore_delay != 9.0
