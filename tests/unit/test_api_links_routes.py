"""Site links API: candidates, acknowledgement, replace-anchor edits, deletes, refusals."""

from __future__ import annotations

from typing import Any

import pytest

from routerd.catalog.eligibility import MULTIMODAL_MISMATCH, NO_CONTEXT
from routerd.store.links import LinkRow
from routerd.wire.lending import Endpoint, Link
from tests.support import fired
from tests.unit.lending_api_support import Client, Parts, config_of, record

TEXT = "/router/v1/site/text-routing-groups"
IMAGE = "/router/v1/site/routing-groups"


def cluster() -> Parts:
    """master/llama (weights H1) and master/second; slave-a and slave-b with a mix of models."""
    node = Parts()
    node.add(
        record("master", "llama", model_hash="H1"),
        record("master", "second", model_hash="H9"),
        record("slave-a", "llama", model_hash="H1"),
        record("slave-a", "tuned", model_hash="H2"),
        record("slave-a", "paint", llm=False, image_id="paint-sdxl", model_hash="I1"),
        record("slave-b", "vision", model_hash="H3", multimodal=True),
        record("slave-b", "nocontext", model_hash="H1", context=0),
        record("master", "sketch", llm=False, image_id="sketch-sd15", model_hash="I1"),
        record("slave-b", "sketch", llm=False, image_id="sketch-sd15", model_hash="I1"),
    )
    return node


def peer(node_id: str, model_id: str, **flags: bool) -> dict[str, Any]:
    return {"node_id": node_id, "model_id": model_id, **flags}


def stored(node: Parts, lane: str = "text") -> list[LinkRow]:
    assert node.store is not None
    return fired(node.store.links(lane))  # type: ignore[arg-type]


def row(owner: str, helper: str, load: bool = True, restore: bool = False) -> LinkRow:
    on, om = owner.split("/")
    hn, hm = helper.split("/")
    return LinkRow(on, om, hn, hm, load, restore)


def seed(node: Parts, lane: str, *rows: LinkRow) -> None:
    assert node.store is not None
    fired(node.store.replace_links(lane, list(rows)))  # type: ignore[arg-type]


def by_id(candidates: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {f"{c['node_id']}/{c['model_id']}": c for c in candidates}


def test_get_without_an_anchor_lists_only_the_lanes_links() -> None:
    node = cluster()
    seed(node, "text", row("master/llama", "slave-a/llama"))
    code, body = Client(node).get(TEXT)
    assert code == 200
    assert body == {"links": [{"owner": {"node_id": "master", "model_id": "llama"},
                               "helper": {"node_id": "slave-a", "model_id": "llama"},
                               "load_if_unloaded": True, "restore_after_borrow": False}]}


def test_text_candidates_are_other_nodes_llms_sorted_with_weights_and_eligibility_labels() -> None:
    node = cluster()
    code, body = Client(node).get(TEXT, node_id="master", model_id="llama")
    assert code == 200
    ids = [f"{c['node_id']}/{c['model_id']}" for c in body["candidates"]]
    # own node (master/second) and image-only models are not candidates; ineligible ones are
    assert ids == ["slave-a/llama", "slave-a/tuned", "slave-b/nocontext", "slave-b/vision"]
    cands = by_id(body["candidates"])
    assert cands["slave-a/llama"]["weights_match"] is True
    assert cands["slave-a/llama"]["eligible"] is True
    assert "ineligible_reason" not in cands["slave-a/llama"]
    assert cands["slave-a/tuned"]["weights_match"] is False
    assert cands["slave-a/tuned"]["eligible"] is True
    assert cands["slave-b/nocontext"]["eligible"] is False
    assert cands["slave-b/nocontext"]["ineligible_reason"] == NO_CONTEXT
    assert cands["slave-b/vision"]["eligible"] is False
    assert cands["slave-b/vision"]["ineligible_reason"] == MULTIMODAL_MISMATCH
    first = cands["slave-a/llama"]
    assert first["filename"] == "llama.kcpps" and first["model_hash"] == "H1"
    assert first["context_size"] == 4096 and first["multimodal"] is False
    assert first["lends_to"] == {"selected": False, "load_if_unloaded": True, "restore_after_borrow": False}
    assert body["anchor"]["known"] is True and body["anchor"]["eligible"] is True


def test_candidates_show_the_existing_links_in_both_directions_with_their_flags() -> None:
    node = cluster()
    seed(node, "text", row("master/llama", "slave-a/llama", load=False),
         row("slave-a/tuned", "master/llama", restore=True))
    _, body = Client(node).get(TEXT, node_id="master", model_id="llama")
    cands = by_id(body["candidates"])
    assert cands["slave-a/llama"]["lends_to"] == {"selected": True, "load_if_unloaded": False,
                                                  "restore_after_borrow": False}
    assert cands["slave-a/llama"]["borrows_from"]["selected"] is False
    assert cands["slave-a/tuned"]["borrows_from"] == {"selected": True, "load_if_unloaded": True,
                                                      "restore_after_borrow": True}


def test_an_anchor_without_model_hash_matches_no_candidates_weights() -> None:
    node = Parts()
    node.add(record("master", "blank"), record("slave-a", "blank"))
    _, body = Client(node).get(TEXT, node_id="master", model_id="blank")
    assert [c["weights_match"] for c in body["candidates"]] == [False]


def test_a_concurrent_model_on_the_master_is_shown_ineligible_from_its_catalog_config() -> None:
    node = cluster()
    busy = record("master", "busy", model_hash="H1")
    node.add(busy)
    node.catalog.configs["busy"] = config_of(busy, parallel=4)
    _, body = Client(node).get(TEXT, node_id="slave-a", model_id="llama")
    cands = by_id(body["candidates"])
    assert cands["master/busy"]["eligible"] is False
    assert "parallel 4" in cands["master/busy"]["ineligible_reason"]
    assert cands["master/llama"]["eligible"] is True


def test_image_lane_candidates_use_image_ids_and_skip_text_models() -> None:
    node = cluster()
    _, body = Client(node).get(IMAGE, node_id="master", model_id="sketch-sd15")
    ids = [f"{c['node_id']}/{c['model_id']}" for c in body["candidates"]]
    assert ids == ["slave-a/paint-sdxl", "slave-b/sketch-sd15"]
    assert all(c["eligible"] for c in body["candidates"])
    assert by_id(body["candidates"])["slave-b/sketch-sd15"]["weights_match"] is True
    assert "multimodal" not in body["candidates"][0]


def test_get_with_half_an_anchor_is_a_bad_request() -> None:
    code, body = Client(cluster()).get(TEXT, node_id="master")
    assert code == 400 and body["error"]["type"] == "invalid_request_error"


def test_post_with_same_weights_stores_installs_pushes_replans_and_answers_like_get() -> None:
    node = cluster()
    code, body = Client(node).post(TEXT, {
        "anchor": {"node_id": "master", "model_id": "llama"},
        "lends_to": [peer("slave-a", "llama", restore_after_borrow=True)],
        "borrows_from": [peer("slave-a", "llama", load_if_unloaded=False)]})
    assert code == 200, body
    assert stored(node) == [row("master/llama", "slave-a/llama", restore=True),
                            row("slave-a/llama", "master/llama", load=False)]
    assert len(node.lending.installed) == 1 and node.lending.refreshes == 1
    image, text = node.lending.installed[0]
    assert image.lane == "image" and len(image) == 0
    assert text.lane == "text"
    assert list(text) == [Link(Endpoint("master", "llama"), Endpoint("slave-a", "llama"), True, True),
                          Link(Endpoint("slave-a", "llama"), Endpoint("master", "llama"), False, False)]
    assert len(body["links"]) == 2
    assert by_id(body["candidates"])["slave-a/llama"]["lends_to"]["selected"] is True
    assert body["anchor"]["node_id"] == "master"


def test_a_first_link_to_different_weights_needs_the_acknowledgement() -> None:
    node = cluster()
    edit = {"anchor": {"node_id": "master", "model_id": "llama"}, "lends_to": [peer("slave-a", "tuned")]}
    client = Client(node)
    code, body = client.post(TEXT, edit)
    assert code == 400
    assert body["error"]["code"] == "acknowledgement_required"
    assert "slave-a/tuned" in body["error"]["message"]
    assert stored(node) == [] and node.lending.installed == [] and node.lending.refreshes == 0
    code, body = client.post(TEXT, {**edit, "acknowledge_different_weights": True})
    assert code == 200, body
    assert stored(node) == [row("master/llama", "slave-a/tuned")]


def test_a_model_already_linked_needs_no_new_acknowledgement_in_either_direction() -> None:
    node = cluster()
    seed(node, "text", row("master/llama", "slave-a/tuned"))
    code, body = Client(node).post(TEXT, {
        "anchor": {"node_id": "master", "model_id": "llama"},
        "lends_to": [peer("slave-a", "tuned", load_if_unloaded=False)],
        "borrows_from": [peer("slave-a", "tuned")]})
    assert code == 200, body
    assert stored(node) == [row("master/llama", "slave-a/tuned", load=False),
                            row("slave-a/tuned", "master/llama")]


def test_post_replaces_every_link_touching_the_anchor_and_keeps_the_others() -> None:
    node = cluster()
    seed(node, "text", row("master/llama", "slave-a/llama"), row("slave-a/llama", "master/llama"),
         row("master/second", "slave-a/tuned"), row("slave-a/tuned", "master/llama"))
    code, _ = Client(node).post(TEXT, {
        "anchor": {"node_id": "master", "model_id": "llama"},
        "borrows_from": [peer("slave-a", "llama")]})
    assert code == 200
    assert stored(node) == [row("master/second", "slave-a/tuned"), row("slave-a/llama", "master/llama")]


def test_post_with_empty_lists_clears_the_anchor() -> None:
    node = cluster()
    seed(node, "text", row("master/llama", "slave-a/llama"), row("master/second", "slave-a/tuned"))
    code, body = Client(node).post(TEXT, {"anchor": {"node_id": "master", "model_id": "llama"},
                                          "lends_to": [], "borrows_from": []})
    assert code == 200
    assert stored(node) == [row("master/second", "slave-a/tuned")]
    assert len(body["links"]) == 1


def test_image_lane_post_stores_image_links_only() -> None:
    node = cluster()
    code, body = Client(node).post(IMAGE, {"anchor": {"node_id": "master", "model_id": "sketch-sd15"},
                                           "lends_to": [peer("slave-b", "sketch-sd15")]})
    assert code == 200, body
    assert stored(node, "image") == [row("master/sketch-sd15", "slave-b/sketch-sd15")]
    assert stored(node, "text") == []
    image, text = node.lending.installed[0]
    assert len(image) == 1 and len(text) == 0


@pytest.mark.parametrize("edit,message", [
    ({"anchor": {"node_id": "master", "model_id": "llama"}, "lends_to": [peer("master", "second")]},
     "model llama cannot lend work to a model on its own node"),
    ({"anchor": {"node_id": "master", "model_id": "llama"}, "borrows_from": [peer("master", "second")]},
     "model second cannot lend work to a model on its own node"),
    ({"anchor": {"node_id": "master", "model_id": "llama"}, "lends_to": [peer("slave-c", "llama")]},
     "slave-c/llama is not a text model known to the registry"),
    ({"anchor": {"node_id": "master", "model_id": "llama"}, "lends_to": [peer("slave-a", "paint")]},
     "slave-a/paint is not a text model known to the registry"),
    ({"anchor": {"node_id": "master", "model_id": "llama"}, "lends_to": [peer("slave-b", "vision")]},
     f"slave-b/vision is not eligible: {MULTIMODAL_MISMATCH}"),
    ({"anchor": {"node_id": "master", "model_id": "llama"}, "lends_to": [peer("slave-b", "nocontext")]},
     f"slave-b/nocontext is not eligible: {NO_CONTEXT}"),
    ({"anchor": {"node_id": "slave-b", "model_id": "nocontext"}, "lends_to": [peer("master", "llama")]},
     f"anchor model cannot lend or borrow work: {NO_CONTEXT}"),
    ({"anchor": {"node_id": "ghost", "model_id": "x"}, "lends_to": [peer("master", "llama")]},
     "anchor ghost/x is not a text model known to the registry"),
    ({"lends_to": [peer("slave-a", "llama")]}, "anchor is required"),
    ({"anchor": {"node_id": "master"}}, "anchor.model_id"),
    ({"anchor": {"node_id": "master", "model_id": " "}}, "anchor.model_id must not be empty"),
    ({"anchor": {"node_id": "master", "model_id": "llama"}, "lends_to": {"node_id": "slave-a"}},
     "lends_to must be a list"),
    ({"anchor": {"node_id": "master", "model_id": "llama"}, "lends_to": [peer("slave-a", "")]},
     "lends_to[0].model_id must not be empty"),
    ({"anchor": {"node_id": "master", "model_id": "llama"},
      "lends_to": [{"node_id": "slave-a", "model_id": "llama", "load_if_unloaded": "yes"}]},
     "lends_to[0].load_if_unloaded must be true or false"),
    ({"anchor": {"node_id": "master", "model_id": "llama"}, "acknowledge_different_weights": 1},
     "acknowledge_different_weights must be true or false"),
])
def test_invalid_edits_are_refused_naming_the_problem_and_store_nothing(edit: dict[str, Any],
                                                                        message: str) -> None:
    node = cluster()
    seed(node, "text", row("master/llama", "slave-a/llama"))
    code, body = Client(node).post(TEXT, edit)
    assert code == 400, body
    assert body["error"]["type"] == "invalid_request_error"
    assert message in body["error"]["message"]
    assert stored(node) == [row("master/llama", "slave-a/llama")]
    assert node.lending.installed == [] and node.lending.refreshes == 0


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b""])
def test_a_body_that_is_not_a_json_object_is_a_bad_request(raw: bytes) -> None:
    node = cluster()
    code, body = Client(node).post(TEXT, raw=raw)
    assert code == 400 and body["error"]["type"] == "invalid_request_error"
    assert stored(node) == []


def test_delete_removes_every_link_touching_the_anchor_and_reinstalls() -> None:
    node = cluster()
    seed(node, "text", row("master/llama", "slave-a/llama"), row("slave-a/tuned", "master/llama"),
         row("master/second", "slave-a/tuned"))
    code, body = Client(node).delete(TEXT, node_id="master", model_id="llama")
    assert code == 200
    assert stored(node) == [row("master/second", "slave-a/tuned")]
    assert body["removed"] == 2 and len(body["links"]) == 1
    assert node.lending.refreshes == 1
    assert list(node.lending.installed[0][1]) == [
        Link(Endpoint("master", "second"), Endpoint("slave-a", "tuned"))]


def test_delete_without_an_anchor_is_a_bad_request() -> None:
    node = cluster()
    seed(node, "text", row("master/llama", "slave-a/llama"))
    code, body = Client(node).delete(TEXT)
    assert code == 400 and "node_id and model_id" in body["error"]["message"]
    assert len(stored(node)) == 1 and node.lending.refreshes == 0


@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
@pytest.mark.parametrize("path", [TEXT, IMAGE])
def test_the_links_api_is_closed_on_a_slave(method: str, path: str) -> None:
    code, body = Client(Parts.slave()).call(method, path, {"anchor": {"node_id": "a", "model_id": "b"}},
                                                params={"node_id": "a", "model_id": "b"})
    assert code == 404 and body["error"]["code"] == "not_found"


def test_a_master_without_a_store_answers_links_not_configured() -> None:
    code, body = Client(Parts(store=None)).get(TEXT)
    assert code == 404 and body["error"]["message"] == "routing links are not configured"
