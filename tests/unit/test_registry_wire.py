"""Wire types of the node API (contract §6): exact field names, strict parsing, WireError reasons."""

from __future__ import annotations

from typing import Any

import pytest

from routerd.catalog.model import Capabilities, ModelConfig
from routerd.wire.lending import LaneStatus
from routerd.wire.records import (
    PROTOCOL_VERSION,
    ModelRecord,
    Snapshot,
    WireError,
    parse_record,
    parse_snapshot,
    record_from_config,
    record_to_json,
    snapshot_to_json,
)
from routerd.wire.status import RuntimeStatus, parse_status, status_to_json

RECORD_FIELDS = {
    "public_id", "local_id", "image_id", "public_image_id", "node_id", "node_url", "source",
    "backend_mode", "config_hash", "model_hash", "capabilities", "available", "loaded", "disabled",
    "filename",
}


def snapshot_doc(**extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "node_id": "slave-a", "node_url": "http://slave-a", "build_version": "0.1.0",
        "protocol_version": 2,
        "models": [{
            "public_id": "llm", "local_id": "llm", "image_id": None, "public_image_id": None,
            "filename": "llm.kcpps", "node_id": "slave-a", "node_url": "http://slave-a",
            "source": "local", "backend_mode": "llama_sdcpp", "config_hash": "c1",
            "model_hash": "m1",
            "capabilities": {"llm": True, "image": False, "embeddings": False,
                             "multimodal": False, "stt": False, "tts": False, "context": 4096},
            "available": True, "loaded": True, "disabled": False,
        }],
    }
    doc.update(extra)
    return doc


def test_record_json_uses_exactly_the_contract_field_names() -> None:
    record = ModelRecord(local_id="llm", public_id="llm")
    doc = record_to_json(record)
    assert set(doc) == RECORD_FIELDS
    assert set(doc["capabilities"]) == {"llm", "image", "embeddings", "multimodal", "stt", "tts",
                                        "context"}


def test_snapshot_round_trips() -> None:
    doc = snapshot_doc()
    snapshot = parse_snapshot(doc)
    assert snapshot.node_id == "slave-a"
    assert snapshot.protocol_version == 2
    (record,) = snapshot.models
    assert record.capabilities == Capabilities(llm=True, context=4096)
    assert record.identity == "m1:c1"
    assert snapshot_to_json(snapshot) == doc


def test_unknown_keys_are_ignored_and_missing_optional_fields_default() -> None:
    snapshot = parse_snapshot({"node_id": "n", "future_field": 1,
                               "models": [{"local_id": "x", "new": {"a": 1}}]})
    assert snapshot.protocol_version == 0
    assert snapshot.models[0] == ModelRecord(local_id="x")


def test_node_id_is_trimmed() -> None:
    assert parse_snapshot({"node_id": "  slave-a "}).node_id == "slave-a"


@pytest.mark.parametrize("doc, words", [
    ([], "must be a JSON object"),
    ("x", "must be a JSON object"),
    ({}, "required field missing @ snapshot.node_id"),
    ({"node_id": "  "}, "node_id is required"),
    ({"node_id": 7}, "expected str @ snapshot.node_id"),
    ({"node_id": "n", "protocol_version": "2"}, "expected int @ snapshot.protocol_version"),
    ({"node_id": "n", "protocol_version": True}, "snapshot.protocol_version"),
    ({"node_id": "n", "models": {}}, "snapshot.models"),
    ({"node_id": "n", "models": None}, "snapshot.models"),
    ({"node_id": "n", "models": [5]}, "snapshot.models[0]"),
    ({"node_id": "n", "models": [{"public_id": "x"}]}, "snapshot.models[0].local_id"),
    ({"node_id": "n", "models": [{"local_id": ""}]}, "models[0].local_id is required"),
    ({"node_id": "n", "models": [{"local_id": "x", "available": "false"}]},
     "expected bool @ snapshot.models[0].available"),
    ({"node_id": "n", "models": [{"local_id": "x", "capabilities": {"context": "4k"}}]},
     "snapshot.models[0].capabilities.context"),
    ({"node_id": "n", "models": [{"local_id": "x", "image_id": 3}]},
     "snapshot.models[0].image_id"),
])
def test_malformed_snapshot_raises_wire_error_with_reason(doc: Any, words: str) -> None:
    with pytest.raises(WireError) as caught:
        parse_snapshot(doc)
    assert words in caught.value.reason
    assert caught.value.status == 400


def test_status_parses_lanes_and_costs_into_the_one_typed_status_and_round_trips() -> None:
    doc = {"node_id": "a", "build_version": "0.1.0", "backend_mode": "llama_sdcpp",
           "active_requests": 2, "queued_requests": 3, "active_stt_config": "whisper.kcpps",
           "idle_for_ms": 1500, "settings_fingerprint": "f",
           "lanes": {"image": {"accepting_borrowed": True, "active_config": "", "queue": []}},
           "costs": {"models": [], "loads": [], "tokens": []}}
    status = parse_status(doc)
    assert status.workload == 5
    assert status.lane("image").accepting_borrowed is True
    assert status.lane("text") == LaneStatus()
    assert status_to_json(status) == doc
    assert parse_status(status_to_json(status)) == status


def test_status_from_a_newer_peer_ignores_lanes_and_keys_it_does_not_know() -> None:
    status = parse_status({"node_id": "a", "active_stt_config": None, "future": 1,
                           "lanes": {"video": {"accepting_borrowed": True},
                                     "text": {"accepting_borrowed": True}}})
    assert set(status.lanes) == {"text"}
    assert status.active_stt_config == ""


def test_status_refuses_a_string_where_a_boolean_belongs() -> None:
    with pytest.raises(WireError) as caught:
        parse_status({"node_id": "a", "lanes": {"text": {"accepting_borrowed": "false"}}})
    assert "accepting_borrowed" in caught.value.reason


@pytest.mark.parametrize("doc, words", [
    ({"node_id": ""}, "node_id is required"),
    ({}, "node_id"),
    ({"node_id": "a", "active_requests": "1"}, "active_requests"),
    ({"node_id": "a", "lanes": []}, "lanes"),
    ({"node_id": "a", "active_stt_config": 1}, "active_stt_config"),
    # a lane queue that is not a list: the master leaves such a node out of STT choice and plans
    ({"node_id": "a", "lanes": {"text": {"queue": "not a list"}}}, "queue"),
])
def test_malformed_status_raises_wire_error(doc: Any, words: str) -> None:
    with pytest.raises(WireError) as caught:
        parse_status(doc)
    assert words in caught.value.reason


def test_parse_record_requires_a_local_id() -> None:
    assert parse_record({"local_id": "x"}).local_id == "x"
    with pytest.raises(WireError):
        parse_record({"local_id": " "})


def test_record_from_config_advertises_local_ids() -> None:
    config = ModelConfig(local_id="combo", filename="combo.kcpps", path="/m/combo.kcpps",
                         backend_mode="llama_sdcpp",
                         capabilities=Capabilities(llm=True, image=True, context=2048),
                         config_hash="c", image_id="combo-dream", model_hash="m")
    record = record_from_config(config, node_id="n1", node_url="http://n1", loaded=True)
    assert (record.public_id, record.public_image_id, record.identity, record.loaded) == (
        "combo", "combo-dream", "m:c", True)


def test_snapshot_and_status_defaults() -> None:
    assert Snapshot(node_id="a").models == ()
    assert RuntimeStatus(node_id="a").workload == 0
    assert PROTOCOL_VERSION == 2
