"""The configuration of replica choice: the master's ``routing`` section and a model config's
``router_replica_choice`` (contract §2, §3), read with every problem named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from routerd.catalog.kcpps import parse_kcpps
from routerd.catalog.model import InvalidConfig, ModelConfig
from routerd.config.load import ConfigError, parse_config
from routerd.config.routing import RoutingConfig
from routerd.wire.records import parse_record, record_from_config, record_to_json


def parse(tmp_path: Path, routing: dict[str, Any] | None = None) -> RoutingConfig:
    data: dict[str, Any] = {"models": {"config_dir": str(tmp_path)}}
    if routing is not None:
        data["routing"] = routing
    return parse_config(data, base_dir=str(tmp_path), env={}).routing


def test_the_routing_section_defaults_to_rotation_and_reads_every_key(tmp_path: Path) -> None:
    assert parse(tmp_path) == RoutingConfig("rotation", "auto", 1.25, 10_000)
    assert parse(tmp_path, {"replica_choice": "affinity", "affinity_key": "prompt", "load_bound": 1.5,
                            "affinity_history": 64}) == RoutingConfig("affinity", "prompt", 1.5, 64)


@pytest.mark.parametrize(("routing", "named"), [
    ({"replica_choice": "fastest"}, "routing.replica_choice"),
    ({"affinity_key": "cookie"}, "routing.affinity_key"),
    ({"load_bound": 0.9}, "routing.load_bound"),
    ({"affinity_history": 0}, "routing.affinity_history"),
    ({"replica": "affinity"}, "routing.replica"),
])
def test_a_bad_routing_value_is_refused_naming_its_key(
        tmp_path: Path, routing: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse(tmp_path, routing)
    assert any(error.startswith(named) for error in info.value.errors), info.value.errors


def kcpps(tmp_path: Path, **extra: Any) -> ModelConfig | InvalidConfig:
    path = tmp_path / "chat.kcpps"
    path.write_text(json.dumps({"model": "chat.gguf", **extra}))
    return parse_kcpps(str(path), "llama_sdcpp")


def test_a_model_config_states_its_own_replica_choice_and_its_record_carries_it(tmp_path: Path) -> None:
    config = kcpps(tmp_path, router_replica_choice="least_loaded")
    assert isinstance(config, ModelConfig) and config.replica_choice == "least_loaded"
    record = record_from_config(config, node_id="a", node_url="http://a")
    doc = record_to_json(record)
    assert doc["replica_choice"] == "least_loaded"
    assert parse_record(doc).replica_choice == "least_loaded"
    plain = kcpps(tmp_path)
    assert isinstance(plain, ModelConfig) and plain.replica_choice is None
    assert "replica_choice" not in record_to_json(record_from_config(plain, node_id="a", node_url=""))


def test_a_model_config_naming_no_mode_is_invalid(tmp_path: Path) -> None:
    bad = kcpps(tmp_path, router_replica_choice="sticky")
    assert isinstance(bad, InvalidConfig) and "router_replica_choice" in bad.reason


def test_a_record_from_a_peer_with_a_mode_this_build_does_not_know_still_parses() -> None:
    assert parse_record({"local_id": "chat", "replica_choice": "future-mode"}).replica_choice == "future-mode"
