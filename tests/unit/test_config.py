"""Config loading and validation (contract §2)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from routerd.config.durations import DurationError, format_duration, parse_duration
from routerd.config.load import ConfigError, load_config, parse_config

TOKEN = "a-real-cluster-secret-0123456789"


def _parse(tmp_path: Path, data: dict[str, Any], env: dict[str, str] | None = None) -> Any:
    models = tmp_path / "models"
    models.mkdir(exist_ok=True)
    data = {"models": {"config_dir": "models"}, **data}
    return parse_config(data, base_dir=str(tmp_path), env=env or {})


def _errors(tmp_path: Path, data: dict[str, Any], env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        _parse(tmp_path, data, env)
    return info.value.errors


def test_embedded_default_loads_as_a_standalone_node_on_8080() -> None:
    config = load_config(None, env={})
    assert config.server.bind == "127.0.0.1:8080"
    assert config.cluster.role == "standalone"
    assert os.path.isdir(config.models.config_dir)
    assert config.cluster.store_dir == os.path.abspath("routerd-data")
    assert config.llama.command == ("routerd-sim", "llama-server")


def test_every_lending_setting_has_its_contract_default(tmp_path: Path) -> None:
    lending = _parse(tmp_path, {}).cluster.lending
    assert lending.scheduling_refresh_interval == 60
    assert lending.scheduling_sample_window == 24 * 3600
    assert lending.scheduling_min_samples == 20
    assert lending.scheduling_backend_depth == 2
    assert lending.scheduling_grant_ttl == 30
    assert lending.scheduling_context_reserve == 256
    assert lending.offload_restore_delay == 1.5
    assert lending.offload_probe_idle == 5
    assert lending.offload_faster_helper_slots == 2
    assert lending.offload_slower_helper_slots == 1
    assert lending.offload_probe_helper_slots == 1
    assert lending.offload_hold_for_faster_helper is True
    assert lending.offload_decisions_retention == 720 * 3600
    assert lending.offload_lent_stall_timeout == 180


def test_lending_settings_parse_from_yaml_values(tmp_path: Path) -> None:
    cluster = {"scheduling_backend_depth": 4, "offload_restore_delay": "1500ms",
               "offload_hold_for_faster_helper": False, "scheduling_grant_ttl": "1m"}
    lending = _parse(tmp_path, {"cluster": cluster}).cluster.lending
    assert lending.scheduling_backend_depth == 4
    assert lending.offload_restore_delay == 1.5
    assert lending.offload_hold_for_faster_helper is False
    assert lending.scheduling_grant_ttl == 60


def test_all_errors_are_reported_at_once_each_naming_its_key(tmp_path: Path) -> None:
    errors = _errors(tmp_path, {
        "server": {"bind": "nonsense", "colour": "blue"},
        "cluster": {"scheduling_min_samples": 1, "scheduling_backend_depth": 65,
                    "offload_probe_idle": "soon", "health_interval": "-1s"},
        "limits": {"max_body_mb": "big"},
        "bogus": {},
    })
    joined = "\n".join(errors)
    for key in ("server.bind", "server.colour", "cluster.scheduling_min_samples",
                "cluster.scheduling_backend_depth", "cluster.offload_probe_idle",
                "cluster.health_interval", "limits.max_body_mb", "bogus"):
        assert key in joined, key
    assert len(errors) >= 8


def test_scheduling_range_limits_are_inclusive(tmp_path: Path) -> None:
    ok = _parse(tmp_path, {"cluster": {"scheduling_min_samples": 2, "scheduling_backend_depth": 64,
                                       "scheduling_context_reserve": 0}})
    assert ok.cluster.lending.scheduling_backend_depth == 64
    errors = _errors(tmp_path, {"cluster": {"scheduling_context_reserve": 1048577}})
    assert any("scheduling_context_reserve" in e and "between 0 and 1048576" in e for e in errors)


def test_a_cluster_node_needs_a_real_token(tmp_path: Path) -> None:
    errors = _errors(tmp_path, {"cluster": {"role": "master"}})
    assert any(e.startswith("cluster.token") and "required" in e for e in errors)
    for placeholder in ("change-me", "CHANGEME", "Replace-Me", "replace_me"):
        errors = _errors(tmp_path, {"cluster": {"role": "master", "token": placeholder}})
        assert any("placeholder" in e for e in errors)
    errors = _errors(tmp_path, {"cluster": {"role": "master", "token": "short"}})
    assert any("at least 16" in e for e in errors)


def test_a_slave_needs_master_url_and_public_url(tmp_path: Path) -> None:
    errors = _errors(tmp_path, {"cluster": {"role": "slave", "token": TOKEN}})
    assert any(e.startswith("cluster.master_url") for e in errors)
    assert any(e.startswith("cluster.public_url") for e in errors)


def test_a_token_reused_as_a_key_is_refused(tmp_path: Path) -> None:
    errors = _errors(tmp_path, {"cluster": {"role": "master", "token": TOKEN},
                                "auth": {"inference_keys": [TOKEN]}})
    assert any("reused" in e for e in errors)
    errors = _errors(tmp_path, {"auth": {"inference_keys": ["k" * 20], "admin_keys": ["k" * 20]}})
    assert any("reused" in e for e in errors)


def test_duplicate_and_malformed_urls_are_refused(tmp_path: Path) -> None:
    errors = _errors(tmp_path, {"cluster": {"role": "master", "token": TOKEN, "slave_urls": [
        "http://127.0.0.1:9001", "HTTP://127.0.0.1:9001/", "ftp://x", "not a url"]}})
    assert any("twice" in e for e in errors)
    assert sum("invalid URL" in e for e in errors) == 2


def test_non_loopback_bind_without_keys_is_refused(tmp_path: Path) -> None:
    errors = _errors(tmp_path, {"server": {"bind": "0.0.0.0:8080"}})
    assert any(e.startswith("server.bind") and "not a loopback" in e for e in errors)
    ok = _parse(tmp_path, {"server": {"bind": "0.0.0.0:8080"}, "auth": {"inference_keys": ["x" * 20]}})
    assert ok.server.port == 8080


def test_missing_config_dir_is_refused(tmp_path: Path) -> None:
    errors = _errors(tmp_path, {"models": {"config_dir": "nowhere"}})
    assert any(e.startswith("models.config_dir") for e in errors)


def test_token_env_overrides_config_and_both_env_forms_conflict(tmp_path: Path) -> None:
    env = {"ROUTERD_CLUSTER_TOKEN": TOKEN}
    config = _parse(tmp_path, {"cluster": {"role": "master", "token": "change-me"}}, env)
    assert config.cluster.token == TOKEN
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    config = _parse(tmp_path, {"cluster": {"role": "master"}},
                    {"ROUTERD_CLUSTER_TOKEN_FILE": str(token_file)})
    assert config.cluster.token == TOKEN
    errors = _errors(tmp_path, {"cluster": {"role": "master"}},
                     {"ROUTERD_CLUSTER_TOKEN": TOKEN, "ROUTERD_CLUSTER_TOKEN_FILE": str(token_file)})
    assert any("only one" in e for e in errors)


def test_relative_paths_resolve_against_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    cfg = tmp_path / "node.yaml"
    cfg.write_text("models:\n  config_dir: models\nllama:\n  binary_path: ./bin/llama-server\n"
                   "cluster:\n  store_dir: data\n")
    config = load_config(str(cfg), env={})
    assert config.models.config_dir == str(tmp_path / "models")
    assert config.llama.command == (str(tmp_path / "bin" / "llama-server"),)
    assert config.cluster.store_dir == str(tmp_path / "data")


def test_unreadable_or_non_mapping_yaml_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(str(tmp_path / "missing.yaml"), env={})
    assert "cannot read" in info.value.errors[0]
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError):
        load_config(str(bad), env={})


@pytest.mark.parametrize("text,seconds", [
    ("500ms", 0.5), ("1.5s", 1.5), ("30s", 30), ("1m", 60), ("1h30m", 5400), ("720h", 2592000)])
def test_durations_parse_go_style(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["", "30", "1.5", "s", "3 m", "1d", 5])
def test_bad_durations_are_refused(bad: Any) -> None:
    with pytest.raises(DurationError):
        parse_duration(bad)


def test_durations_format_canonically() -> None:
    assert format_duration(1.5) == "1.5s"
    assert format_duration(60) == "1m0s"
    assert format_duration(720 * 3600) == "720h0m0s"
    assert format_duration(0.25) == "250ms"


def test_reliability_settings_parse_with_defaults_and_refuse_bad_values(tmp_path: Path) -> None:
    default = _parse(tmp_path, {})
    assert (default.limits.max_queued_per_model, default.limits.first_byte_timeout,
            default.limits.idle_stream_timeout, default.server.drain_timeout) == (256, 600.0, 300.0, 30.0)
    ok = _parse(tmp_path, {"server": {"trusted_proxies": ["127.0.0.1/32"], "drain_timeout": "5s"},
                           "auth": {"metrics_keys": ["m" * 20]},
                           "limits": {"max_queued_per_model": 4, "first_byte_timeout": "2m",
                                      "idle_stream_timeout": "30s"}})
    assert ok.server.trusted_proxies == ("127.0.0.1/32",) and ok.server.drain_timeout == 5.0
    assert ok.auth.metrics_keys == ("m" * 20,)
    assert (ok.limits.max_queued_per_model, ok.limits.first_byte_timeout,
            ok.limits.idle_stream_timeout) == (4, 120.0, 30.0)
    errors = _errors(tmp_path, {"server": {"trusted_proxies": ["nope"], "drain_timeout": "x"},
                                "auth": {"metrics_keys": ["k" * 20], "admin_keys": ["k" * 20]},
                                "limits": {"max_queued_per_model": 0, "first_byte_timeout": "-1s"}})
    for key in ("server.trusted_proxies", "server.drain_timeout", "auth.metrics_keys",
                "limits.max_queued_per_model", "limits.first_byte_timeout"):
        assert any(e.startswith(key) for e in errors), (key, errors)


def test_kobold_and_vllm_backend_modes_are_accepted_with_their_settings(tmp_path: Path) -> None:
    config = _parse(tmp_path, {"backend": {"mode": "kobold"},
                               "kobold": {"binary_path": "koboldcpp", "no_model": True,
                                          "reload_timeout": "45s"}})
    assert config.backend.mode == "kobold"
    assert config.kobold.no_model is True and config.kobold.reload_timeout == 45.0
    assert _parse(tmp_path, {"backend": {"mode": "vllm"}}).backend.mode == "vllm"
    assert _parse(tmp_path, {}).kobold.reload_timeout == 90.0


def test_bad_family_settings_name_their_key(tmp_path: Path) -> None:
    errors = _errors(tmp_path, {"backend": {"mode": "ollama"},
                                "kobold": {"no_model": "yes", "reload_timeout": "soon"},
                                "vllm": {"no_model": True}})
    joined = "\n".join(errors)
    assert "backend.mode" in joined and "kobold, llama_sdcpp, or vllm" in joined
    assert "kobold.no_model" in joined and "kobold.reload_timeout" in joined
    assert "vllm.no_model" in joined


def test_analytics_section_defaults_on_and_takes_durations(tmp_path: Path) -> None:
    """Issue 22: ``analytics.*`` (contract §2): 3m flush, 720h raw retention; on by default since issue 32
    (a first run shows its requests on the Overview), off when the config says so."""
    default = load_config(None, env={}).analytics
    assert (default.enabled, default.flush_interval, default.raw_retention) == (True, 180.0, 720 * 3600.0)
    assert _parse(tmp_path, {"server": {"bind": "127.0.0.1:9"}}).analytics.enabled is True
    config = _parse(tmp_path, {"analytics": {"enabled": False, "flush_interval": "10s",
                                             "hour_retention": "24h", "max_buffered": 100}})
    assert (config.analytics.enabled, config.analytics.flush_interval) == (False, 10.0)
    assert (config.analytics.hour_retention, config.analytics.max_buffered) == (86400.0, 100)


def test_analytics_bad_values_are_named(tmp_path: Path) -> None:
    errors = _errors(tmp_path, {"analytics": {"flush_interval": "0s", "raw_retention": "soon",
                                              "max_buffered": 0, "enabeld": True}})
    text = "\n".join(errors)
    for key in ("analytics.flush_interval", "analytics.raw_retention", "analytics.max_buffered",
                "analytics.enabeld"):
        assert key in text


def test_listen_backlog_defaults_to_1024_and_refuses_values_outside_1_to_65535(tmp_path: Path) -> None:
    """``server.listen_backlog``: Twisted's default of 50 reset clients of a burst of thousands of
    connects; the node asks the kernel for 1024 unless told otherwise, and a bad value is named."""
    assert _parse(tmp_path, {}).server.listen_backlog == 1024
    assert _parse(tmp_path, {"server": {"listen_backlog": 4096}}).server.listen_backlog == 4096
    for bad in (0, 70000, "many"):
        errors = _errors(tmp_path, {"server": {"listen_backlog": bad}})
        assert any("server.listen_backlog" in e for e in errors)
