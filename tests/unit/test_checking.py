"""``--check`` / ``routerd check``: every mistake a user makes in a models folder or config, at once."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from routerd.checking import check_config, did_you_mean
from routerd.config.load import ConfigError, parse_config


def _setup(tmp_path: Path, kcpps: dict[str, object], binary: str | list[str] | None = None,
           extra: dict[str, object] | None = None) -> Path:
    models = tmp_path / "models"
    models.mkdir()
    (tmp_path / "w.gguf").write_text("weights")
    for name, body in kcpps.items():
        (models / name).write_text(body if isinstance(body, str) else json.dumps(body))
    prog = tmp_path / "llama-server"
    prog.write_text("#!/bin/sh\n")
    prog.chmod(prog.stat().st_mode | stat.S_IXUSR)
    cfg = {"models": {"config_dir": "models"}, "cluster": {"store_dir": "store"},
           "llama": {"binary_path": binary if binary is not None else str(prog)}, **(extra or {})}
    path = tmp_path / "node.yaml"
    path.write_text(json.dumps(cfg))
    return path


def test_a_clean_folder_is_ok(tmp_path: Path) -> None:
    path = _setup(tmp_path, {"chat.kcpps": {"model": "../w.gguf", "contextsize": 4096}})
    assert check_config(str(path)) == (True, [])


def test_every_broken_kcpps_is_named_with_its_reason(tmp_path: Path) -> None:
    """Bad JSON, a wrong type, a missing weights file and a likely misspelt key: one line each."""
    path = _setup(tmp_path, {
        "a.kcpps": "{not json",
        "b.kcpps": {"model": "../w.gguf", "contextsize": "4096"},
        "c.kcpps": {"model": "../missing.gguf"},
        "d.kcpps": {"model": "../w.gguf", "contextsze": 4096},
        "e.kcpps": {"model": "../w.gguf", "sdvae": "", "quiet": True},  # koboldcpp keys: not errors
    })
    ok, errors = check_config(str(path))
    assert not ok
    text = "\n".join(errors)
    assert "a.kcpps: config is not valid JSON" in text
    assert "b.kcpps: contextsize" in text
    assert f"c.kcpps: model {tmp_path / 'missing.gguf'} does not exist" in text
    assert "d.kcpps: unknown key 'contextsze' (did you mean 'contextsize'?)" in text
    assert not any(line.startswith("e.kcpps") for line in errors)
    assert len(errors) == 4


def test_a_missing_or_non_executable_backend_binary_is_reported(tmp_path: Path) -> None:
    kcpps = {"chat.kcpps": {"model": "../w.gguf"}}
    missing = _setup(tmp_path, kcpps, binary="/nonexistent/llama-server")
    ok, errors = check_config(str(missing))
    assert not ok and errors[0].startswith("llama.binary_path: backend binary '/nonexistent/llama-server'")
    assert "needed by chat.kcpps" in errors[0]
    prog = tmp_path / "llama-server"
    os.chmod(prog, 0o644)
    path = tmp_path / "node2.yaml"
    path.write_text(json.dumps({"models": {"config_dir": "models"}, "cluster": {"store_dir": "store"},
                                "llama": {"binary_path": str(prog)}}))
    ok, errors = check_config(str(path))
    assert errors == [f"llama.binary_path: {prog} is not executable (needed by chat.kcpps)"]


def test_a_binary_no_model_needs_is_not_checked(tmp_path: Path) -> None:
    """An image-only folder does not need llama-server."""
    path = _setup(tmp_path, {"sd.kcpps": {"sdmodel": "../w.gguf"}}, binary="/nonexistent/llama-server",
                  extra={"sdcpp": {"binary_path": str(tmp_path / "llama-server")}})
    assert check_config(str(path)) == (True, [])


def test_a_startup_model_without_a_valid_config_is_reported(tmp_path: Path) -> None:
    path = _setup(tmp_path, {"chat.kcpps": {"model": "../w.gguf"}}, extra={
        "models": {"config_dir": "models", "startup_model": "chta"}})
    ok, errors = check_config(str(path))
    assert not ok and errors[0].startswith("models.startup_model: no valid config chta.kcpps")


def test_unknown_yaml_keys_and_sections_come_with_a_did_you_mean() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"servr": {}, "cluster": {"sync_intervall": "60s"}}, base_dir="/", env={})
    assert "servr: unknown section (did you mean 'server'?)" in err.value.errors
    assert "cluster.sync_intervall: unknown key (did you mean 'sync_interval'?)" in err.value.errors
    assert did_you_mean("zzz", ["server"]) is None


def test_extra_args_is_a_shell_style_string_or_a_list(tmp_path: Path) -> None:
    """``extra_args: "-ngl 99 --alias 'my model'"`` is split like a command line, not one argument."""
    (tmp_path / "models").mkdir()
    as_string = parse_config({"llama": {"extra_args": "-ngl 99 --alias 'my model'"}},
                             base_dir=str(tmp_path), env={})
    as_list = parse_config({"llama": {"extra_args": ["-ngl", "99"]}}, base_dir=str(tmp_path), env={})
    assert as_string.llama.extra_args == ("-ngl", "99", "--alias", "my model")
    assert as_list.llama.extra_args == ("-ngl", "99")
    with pytest.raises(ConfigError) as err:
        parse_config({"llama": {"extra_args": "-x 'unclosed"}}, base_dir=str(tmp_path), env={})
    assert any(e.startswith("llama.extra_args: cannot be split") for e in err.value.errors)
