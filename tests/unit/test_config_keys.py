"""Named inference keys and the ``queue`` section (issue 23): objects with a name, a secret from
``key``/``key_file``/``key_env``, a class and limits; plain strings keep working."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from routerd.config.keys import InferenceKey, KeyLimits
from routerd.config.load import ConfigError, parse_config


def _parse(tmp_path: Path, data: dict[str, Any], env: dict[str, str] | None = None) -> Any:
    (tmp_path / "models").mkdir(exist_ok=True)
    return parse_config({"models": {"config_dir": "models"}, **data}, base_dir=str(tmp_path), env=env or {})


def _errors(tmp_path: Path, data: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        _parse(tmp_path, data)
    return info.value.errors


def test_plain_strings_keep_working_with_generated_names(tmp_path: Path) -> None:
    config = _parse(tmp_path, {"auth": {"inference_keys": ["sk-one", "sk-two"]}})
    assert config.auth.inference_keys == ("sk-one", "sk-two")
    assert [k.name for k in config.auth.inference_entries()] == ["key-1", "key-2"]
    assert {k.priority for k in config.auth.inference_entries()} == {"standard"}


def test_objects_carry_name_class_limits_and_read_the_secret_from_file_or_env(tmp_path: Path) -> None:
    (tmp_path / "batch.key").write_text("sk-from-file\n")
    config = _parse(tmp_path, {"auth": {"inference_keys": [
        "sk-plain",
        {"name": "chat", "key": "sk-chat", "class": "interactive", "limits": {"max_concurrent": 2}},
        {"name": "nightly", "key_file": "batch.key", "class": "batch",
         "limits": {"requests_per_minute": 60, "tokens_per_minute": 1000, "weight": 2}},
        {"name": "ci", "key_env": "CI_KEY"},
    ]}}, env={"CI_KEY": "sk-from-env"})
    assert config.auth.inference_keys == ("sk-plain", "sk-chat", "sk-from-file", "sk-from-env")
    chat = InferenceKey("chat", "sk-chat", "interactive", KeyLimits(max_concurrent=2))
    assert config.auth.named_keys[1] == chat
    assert config.auth.named_keys[2].limits == KeyLimits(0, 60, 1000, 2.0)
    assert config.auth.named_keys[0].name == "key-1"
    assert "sk-chat" not in repr(config.auth.named_keys)


def test_bad_entries_are_refused_each_naming_its_place(tmp_path: Path) -> None:
    errors = _errors(tmp_path, {"auth": {"inference_keys": [
        {"name": "a", "key": "sk-a", "class": "urgent"},
        {"name": "b"},
        {"name": "c", "key": "sk-c", "key_env": "X"},
        {"name": "d", "key": "sk-d", "limits": {"max_concurrent": -1, "burst": 3}},
        {"name": "e", "key_env": "UNSET"},
        {"name": "bad name!", "key": "sk-f"},
        {"name": "dup", "key": "sk-x"},
        {"name": "dup", "key": "sk-y"},
    ]}})
    text = "\n".join(errors)
    assert "auth.inference_keys[0].class" in text
    assert "auth.inference_keys[1]: needs exactly one of key, key_file, key_env" in text
    assert "auth.inference_keys[2]: needs exactly one" in text
    assert "auth.inference_keys[3].limits.max_concurrent" in text
    assert "auth.inference_keys[3].limits.burst: unknown key" in text
    assert "auth.inference_keys[4].key_env" in text
    assert "auth.inference_keys[5].name" in text
    assert "auth.inference_keys: names 'dup' twice" in text


def test_queue_aging_defaults_to_30s_and_parses_durations(tmp_path: Path) -> None:
    assert _parse(tmp_path, {}).queue.aging == 30.0
    assert _parse(tmp_path, {"queue": {"aging": "5s"}}).queue.aging == 5.0
    assert any(e.startswith("queue.agin") for e in _errors(tmp_path, {"queue": {"agin": "5s"}}))
