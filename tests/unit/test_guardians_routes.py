"""Site guardians API (contract §7 ``/router/v1/site/guardians``): validation, storage, install and
push; the guardian decision row's enumerations."""

from __future__ import annotations

from typing import Any

import pytest

from routerd.api.guardians_routes import GUARDIANS_PATH
from routerd.lending.decisions import validate
from tests.unit.lending_api_support import Client, Parts, record

TEXT_A = record("master", "text-a")
VISION_A = record("master", "vision-a", multimodal=True)
TEXT_B = record("slave-b", "text-b")
VISION_B = record("slave-b", "vision-b", multimodal=True)
SD_B = record("slave-b", "sd-b", llm=False, image_id="sd-b")


def guarded(node_id: str = "master", *, slave: bool = False) -> Parts:
    """A master knowing two text and two vision models, an image model and nodes slave-b and slave-c."""
    if slave:
        return Parts.slave(node_id)
    parts = Parts(node_id=node_id)
    parts.add(TEXT_A, VISION_A, TEXT_B, VISION_B, SD_B)
    parts.add_nodes("slave-b", "slave-c")
    return parts


def setting(scope: str, guardian: str, node_id: str | None = None,
            model_id: str | None = None) -> dict[str, Any]:
    g_node, g_model = guardian.split("/")
    out: dict[str, Any] = {"scope": scope, "guardian": {"node_id": g_node, "model_id": g_model}}
    if node_id is not None:
        out["node_id"] = node_id
    if model_id is not None:
        out["model_id"] = model_id
    return out


def test_a_setting_is_stored_installed_pushed_and_listed() -> None:
    node = guarded()
    client = Client(node)
    code, body = client.post(GUARDIANS_PATH, setting("cluster", "slave-b/vision-b"))
    assert code == 200, body
    assert body["guardians"] == [setting("cluster", "slave-b/vision-b")]
    assert node.lending.pushes == 1
    assert node.lending.guardians.resolve("master", "text-a") is not None
    code, again = client.get(GUARDIANS_PATH)
    assert code == 200 and again["guardians"] == body["guardians"]
    assert [(c["node_id"], c["model_id"]) for c in again["candidates"]] == [
        ("master", "vision-a"), ("slave-b", "vision-b")]
    # every text-only model, with the guardian that applies to it
    assert [(t["node_id"], t["model_id"], t["guardian"]["scope"]) for t in again["text_models"]] == [
        ("master", "text-a", "cluster"), ("slave-b", "text-b", "cluster")]


def test_the_listing_shows_the_most_specific_setting_per_text_model() -> None:
    node = guarded()
    client = Client(node)
    code, body = client.post(GUARDIANS_PATH, {"guardians": [
        setting("cluster", "slave-b/vision-b"), setting("node", "master/vision-a", node_id="master"),
        setting("model", "master/vision-a", node_id="slave-b", model_id="text-b")]})
    assert code == 200, body
    listed = [(t["model_id"], t["guardian"]["scope"], t["guardian"]["model_id"]) for t in body["text_models"]]
    assert listed == [
        ("text-a", "node", "vision-a"), ("text-b", "model", "vision-a")]
    assert len(body["guardians"]) == 3


@pytest.mark.parametrize(("entry", "says"), [
    (setting("cluster", "master/text-a"), "is not a multimodal text model"),
    (setting("cluster", "slave-b/sd-b"), "is not a multimodal text model"),
    (setting("cluster", "slave-b/nope"), "not a model known"),
    (setting("cluster", "slave-z/vision-b"), "guardian node 'slave-z' is not known"),
    (setting("node", "slave-b/vision-b", node_id="slave-z"), "node 'slave-z' is not known"),
    (setting("model", "slave-b/vision-b", node_id="master", model_id="nope"), "not a text model known"),
    (setting("model", "slave-b/vision-b", node_id="slave-b", model_id="vision-b"), "its own guardian"),
    ({"scope": "node", "guardian": {"node_id": "slave-b", "model_id": "vision-b"}}, "node_id is required"),
], ids=["text-only", "image-model", "unknown-model", "unknown-guardian-node", "unknown-node",
        "unknown-target", "self", "malformed"])
def test_a_bad_setting_is_refused_with_the_reason_and_nothing_changes(entry: dict[str, Any],
                                                                       says: str) -> None:
    node = guarded()
    client = Client(node)
    code, body = client.post(GUARDIANS_PATH, entry)
    assert code == 400 and says in body["error"]["message"], body
    assert node.lending.pushes == 0
    assert client.get(GUARDIANS_PATH)[1]["guardians"] == []


def test_a_non_multimodal_guardian_names_its_code() -> None:
    code, body = Client(guarded()).post(GUARDIANS_PATH, setting("cluster", "slave-b/text-b"))
    assert code == 400 and body["error"]["code"] == "guardian_not_multimodal"


def test_a_batch_with_one_bad_setting_stores_none() -> None:
    node = guarded()
    client = Client(node)
    code, _ = client.post(GUARDIANS_PATH, {"guardians": [
        setting("cluster", "slave-b/vision-b"), setting("node", "slave-b/text-b", node_id="master")]})
    assert code == 400
    assert client.get(GUARDIANS_PATH)[1]["guardians"] == []


def test_a_known_node_without_models_can_have_a_node_guardian() -> None:
    entry = setting("node", "slave-b/vision-b", node_id="slave-c")
    code, body = Client(guarded()).post(GUARDIANS_PATH, entry)
    assert code == 200 and body["guardians"][0]["node_id"] == "slave-c"


def test_delete_by_scope_key_removes_installs_and_pushes() -> None:
    node = guarded()
    client = Client(node)
    client.post(GUARDIANS_PATH, {"guardians": [setting("cluster", "slave-b/vision-b"),
                                               setting("node", "master/vision-a", node_id="slave-b")]})
    code, body = client.delete(GUARDIANS_PATH, scope="node", node_id="slave-b")
    assert code == 200 and body["removed"] == 1
    assert body["guardians"] == [setting("cluster", "slave-b/vision-b")]
    assert node.lending.guardians.resolve("slave-b", "text-b").scope == "cluster"  # type: ignore[union-attr]
    assert node.lending.pushes == 2
    code, body = client.delete(GUARDIANS_PATH, scope="cluster")
    assert code == 200 and body["removed"] == 1 and body["guardians"] == []
    assert client.delete(GUARDIANS_PATH, scope="cluster")[1]["removed"] == 0
    assert client.delete(GUARDIANS_PATH, scope="model", node_id="x")[0] == 400
    assert client.delete(GUARDIANS_PATH)[0] == 400


def test_the_route_is_closed_on_a_slave() -> None:
    node = guarded("slave-b", slave=True)
    assert Client(node).get(GUARDIANS_PATH)[0] == 404


def test_the_guardian_decision_row_takes_exactly_its_two_reasons() -> None:
    for reason in ("structure", "backend_refused"):
        row = validate("dispatch", "guardian", {"lane": "text", "reason": reason, "owner_model_id": "t",
                                                "helper_model_id": "v"})
        assert row["outcome"] == "guardian"
    with pytest.raises(ValueError, match="reason"):
        validate("dispatch", "guardian", {"lane": "text", "reason": "it_looked_like_one"})
    with pytest.raises(ValueError, match="outcome"):
        validate("plan", "guardian", {"lane": "text"})
