"""Guardian routing on one real node in memory (``node_fixture.World``): which requests go to the
guardian, and which are left alone (spec "Guardian models")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from routerd.node import Node
from routerd.routing.guardians import Guardian, GuardianSet
from routerd.wire.lending import Endpoint
from tests.unit.node_fixture import TEXT, World, master_cluster, slave_cluster

PNG = "data:image/png;base64,iVBORw0KGgo="
MMPROJ = {"mmproj": "../proj.gguf"}


def solo(tmp_path: Path, *guardians: Guardian) -> tuple[World, Node]:
    world = World(tmp_path)
    (tmp_path / "solo").mkdir(parents=True)
    (tmp_path / "solo" / "proj.gguf").write_bytes(b"projector")
    node = world.node("solo", {
        "text": TEXT,
        "vision": {**TEXT, "kcpps": MMPROJ},
        "shy": {**TEXT, "kcpps": {**MMPROJ, "extra_args": ["--no-mmproj"]}},  # refuses images
    })
    world.start(node)
    node.lending.install_guardians(GuardianSet(guardians))
    return world, node


def image_chat(model: str) -> dict[str, Any]:
    return {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": PNG}}]}]}


def ask(world: World, node: Node, body: dict[str, Any]) -> tuple[int, dict[str, str], dict[str, Any]]:
    response, content = world.call("POST", node, "/v1/chat/completions", json=body)
    headers = {k.decode().lower(): v[0].decode() for k, v in response.headers.getAllRawHeaders()}
    return int(response.code), headers, json.loads(content)


def guardian(scope: str, target: str, node_id: str = "", model_id: str = "") -> Guardian:
    g_node, g_model = target.split("/")
    return Guardian(scope, Endpoint(g_node, g_model), node_id=node_id, model_id=model_id)  # type: ignore[arg-type]


def test_an_image_for_a_text_only_model_goes_to_the_guardian_on_this_node(tmp_path: Path) -> None:
    world, node = solo(tmp_path, guardian("node", "solo/vision", node_id="solo"))
    code, headers, body = ask(world, node, image_chat("text"))
    assert code == 200 and body["model"] == "text"
    assert (headers["x-routerd-guardian"], headers["x-routerd-node"]) == ("solo/vision", "solo")
    assert node.runtimes.loaded_config("text") == "vision.kcpps"


def test_text_without_an_image_is_never_redirected(tmp_path: Path) -> None:
    world, node = solo(tmp_path, guardian("cluster", "solo/vision"))
    code, headers, _ = ask(world, node, {"model": "text", "max_tokens": 4,
                                         "messages": [{"role": "user", "content": "an image_url, please"}]})
    assert code == 200 and "x-routerd-guardian" not in headers
    assert node.runtimes.loaded_config("text") == "text.kcpps"


def test_a_guardian_on_another_node_is_out_of_a_non_master_reach(tmp_path: Path) -> None:
    """A slave or standalone node cannot reach another node's guardian: the request goes on to the
    backend, and its refusal is answered as it is."""
    world, node = solo(tmp_path, guardian("cluster", "elsewhere/vision"))
    code, headers, body = ask(world, node, image_chat("text"))
    assert code == 500 and "x-routerd-guardian" not in headers
    assert "image input is not supported" in body["error"]["message"]


def test_a_refusing_backend_hands_the_request_to_the_guardian(tmp_path: Path) -> None:
    world, node = solo(tmp_path, guardian("model", "solo/vision", node_id="solo", model_id="shy"))
    code, headers, body = ask(world, node, image_chat("shy"))
    assert code == 200 and body["model"] == "shy"
    assert headers["x-routerd-guardian"] == "solo/vision"


def test_a_guardian_that_is_not_multimodal_here_is_not_used(tmp_path: Path) -> None:
    world, node = solo(tmp_path, guardian("cluster", "solo/text"))
    code, headers, _ = ask(world, node, image_chat("shy"))
    assert code == 500 and "x-routerd-guardian" not in headers


# -- a slave keeps what its master pushed ---------------------------------------------------------------


def test_a_slave_restarted_while_its_master_is_down_serves_with_the_pushed_guardians_and_links(
        tmp_path: Path) -> None:
    """The master pushes a guardian for the slave's text-only model and a link; the master goes
    down and the slave restarts: the slave's router database gave it both back, so an image for the
    text-only model still goes to the guardian (not to the backend, which refuses images)."""
    world = World(tmp_path, on_disk=True)
    (tmp_path / "slave").mkdir(parents=True)
    (tmp_path / "slave" / "proj.gguf").write_bytes(b"projector")
    slave = world.node("slave", {"text": {**TEXT, "kcpps": {"contextsize": 4096}},
                                 "vision": {**TEXT, "kcpps": MMPROJ}}, cluster=slave_cluster())
    master = world.node("master", {"chat": {**TEXT, "kcpps": {"contextsize": 4096}}},
                        cluster=master_cluster())
    world.start(slave, master)
    setting = {"scope": "model", "node_id": "slave", "model_id": "text",
               "guardian": {"node_id": "slave", "model_id": "vision"}}
    response, body = world.call("POST", master, "/router/v1/site/guardians", json=setting)
    assert response.code == 200, body
    edit = {"anchor": {"node_id": "master", "model_id": "chat"}, "acknowledge_different_weights": True,
            "lends_to": [{"node_id": "slave", "model_id": "text"}]}
    response, body = world.call("POST", master, "/router/v1/site/text-routing-groups", json=edit)
    assert response.code == 200, body
    assert len(slave.lending.guardians) == 1 and len(slave.lending.links["text"]) == 1

    world.run(master.stop())
    world.network.unplug(world.netlocs[master])
    world.run(slave.stop())
    again = world.again("slave")
    world.start(again)
    assert again.lending.guardians == slave.lending.guardians
    assert list(again.lending.links["text"]) == list(slave.lending.links["text"])
    code, headers, body = ask(world, again, image_chat("text"))
    assert code == 200, body
    assert headers["x-routerd-guardian"] == "slave/vision"
