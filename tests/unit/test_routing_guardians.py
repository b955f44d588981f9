"""routing.guardians: resolution precedence, the settings' wire form, the backend-refusal matcher and
the fingerprint that lets "in sync" cover guardians (spec "Guardian models")."""

from __future__ import annotations

import json
from typing import Any

import pytest

from routerd.config.lending import LendingSettings
from routerd.routing.guardians import (
    Guardian,
    GuardianError,
    GuardianSet,
    guardian_to_json,
    image_refused,
    parse_guardian,
    sync_fingerprint,
)
from routerd.wire.lending import Endpoint

CLUSTER = Guardian("cluster", Endpoint("big", "vision-l"))
NODE_A = Guardian("node", Endpoint("a", "vision-s"), node_id="a")
MODEL_A_TEXT = Guardian("model", Endpoint("b", "vision-m"), node_id="a", model_id="text")


def test_the_most_specific_setting_wins_model_then_node_then_cluster() -> None:
    guardians = GuardianSet([CLUSTER, NODE_A, MODEL_A_TEXT])
    assert guardians.resolve("a", "text") == MODEL_A_TEXT
    assert guardians.resolve("a", "other") == NODE_A
    assert guardians.resolve("b", "text") == CLUSTER
    assert GuardianSet([NODE_A]).resolve("b", "text") is None
    assert GuardianSet().resolve("a", "text") is None


def test_a_later_setting_of_the_same_scope_key_replaces_the_earlier() -> None:
    newer = Guardian("node", Endpoint("c", "v"), node_id="a")
    guardians = GuardianSet([NODE_A, newer])
    assert guardians.entries == (newer,)


def test_wire_form_round_trips_and_lists_only_the_keys_of_the_scope() -> None:
    for entry in (CLUSTER, NODE_A, MODEL_A_TEXT):
        assert parse_guardian(guardian_to_json(entry)) == entry
    assert guardian_to_json(CLUSTER) == {"scope": "cluster",
                                         "guardian": {"node_id": "big", "model_id": "vision-l"}}
    assert guardian_to_json(NODE_A) == {"scope": "node", "node_id": "a",
                                        "guardian": {"node_id": "a", "model_id": "vision-s"}}


@pytest.mark.parametrize(("data", "names"), [
    ({"scope": "everywhere", "guardian": {"node_id": "a", "model_id": "v"}}, "scope"),
    ({"scope": "model", "node_id": "a", "guardian": {"node_id": "a", "model_id": "v"}}, "model_id"),
    ({"scope": "node", "guardian": {"node_id": "a", "model_id": "v"}}, "node_id"),
    ({"scope": "node", "node_id": "a", "model_id": "m", "guardian": {"node_id": "a", "model_id": "v"}},
     "model_id"),
    ({"scope": "cluster", "node_id": "a", "guardian": {"node_id": "a", "model_id": "v"}}, "cluster"),
    ({"scope": "cluster"}, "guardian"),
    ({"scope": "cluster", "guardian": {"node_id": "a", "model_id": ""}}, "model_id"),
    ({"scope": "cluster", "guardian": {"node_id": "a", "model_id": 3}}, "model_id"),
    ({"scope": "cluster", "guardian": {"node_id": "a", "model_id": "v"}, "extra": 1}, "extra"),
    ("cluster", "object"),
])
def test_a_malformed_setting_is_refused_naming_the_field(data: Any, names: str) -> None:
    with pytest.raises(GuardianError, match=names):
        parse_guardian(data)


# -- the refusal matcher ------------------------------------------------------------------------------------

LLAMA_REFUSAL = json.dumps({"error": {"code": 500, "type": "server_error", "message":
                            "image input is not supported - hint: if this is unexpected, you may need to"
                            " provide the mmproj"}}).encode()


@pytest.mark.parametrize(("status", "body"), [
    (500, LLAMA_REFUSAL),
    (400, LLAMA_REFUSAL),
    (400, b'{"error": "model does not support image input"}'),  # Ollama's shape
    (400, b'{"object": "error", "message": "qwen is not a multimodal model", "type": "BadRequestError"}'),
    (500, b"image input is not supported"),  # not JSON at all
], ids=["llama-500", "llama-400", "ollama", "vllm", "plain-text"])
def test_a_backend_refusing_an_image_is_recognised(status: int, body: bytes) -> None:
    assert image_refused(status, body) is True


@pytest.mark.parametrize(("status", "body"), [
    (503, LLAMA_REFUSAL),  # only 400 and 500 are refusals
    (200, LLAMA_REFUSAL),
    (400, b'{"error": {"message": "the request exceeds the available context size"}}'),
    (400, b'{"error": {"message": "response_format is not supported"}}'),  # not about images
    (500, b'{"error": {"message": "the image could not be decoded"}}'),  # about images, not a refusal
    (500, b""),
], ids=["503", "200", "context", "other-feature", "bad-image", "empty"])
def test_other_errors_are_not_refusals(status: int, body: bytes) -> None:
    assert image_refused(status, body) is False


# -- the fingerprint ----------------------------------------------------------------------------------------


def test_without_guardians_the_fingerprint_is_the_settings_own() -> None:
    settings = LendingSettings()
    assert sync_fingerprint(settings.fingerprint(), GuardianSet()) == settings.fingerprint()


def test_guardians_change_the_fingerprint_and_equal_sets_agree() -> None:
    fp = LendingSettings().fingerprint()
    one = sync_fingerprint(fp, GuardianSet([CLUSTER, NODE_A]))
    assert one != fp
    assert one == sync_fingerprint(fp, GuardianSet([NODE_A, CLUSTER]))  # order does not matter
    assert one != sync_fingerprint(fp, GuardianSet([CLUSTER]))
    assert len(one) == 12
