"""Backend flags that cannot leave the box (:mod:`routerd.catalog.backend_args`): Cook refuses a
config whose ``extra_args`` set what routerd sets itself or name a path (400 with the reason),
``routerd check`` warns of one written by hand; and IDs and key names are matched whole (a
trailing newline is no part of a name)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from routerd.assets.cook import CookError, parse_order, valid_id
from routerd.assets.hf import BindRefused, parse_origin
from routerd.assets.index import is_sha256
from routerd.catalog.backend_args import unsafe_arg
from routerd.checking import check_config
from routerd.config.load import ConfigError, parse_config
from routerd.registry.recipes import RecipeError, parse_recipe
from tests.unit.node_fixture import TEXT, World

ORDER: dict[str, Any] = {"id": "x", "files": {"model": "a.sim.json"}}


@pytest.mark.parametrize("args", [
    ["--host", "0.0.0.0"], ["--port", "9"], ["--port=9"], ["-m", "/outside/secret.txt"],
    ["--model", "w.gguf"], ["--slot-save-path", "slots"], ["--log-file", "x.log"],
    ["--listen-ip", "0.0.0.0"],
    ["--lora", "adapter.gguf"], ["--chat-template-file", "t.jinja"], ["-hf", "owner/repo"],
    ["--flash-attn", "--mmproj=p.gguf"], ["--grammar", "/etc/passwd"], ["--x", "../../y"], ["--x=~/y"],
])
def test_flags_routerd_sets_and_paths_are_refused_over_http(args: list[str]) -> None:
    with pytest.raises(CookError) as err:
        parse_order({**ORDER, "extra_args": args})
    assert err.value.code == "unsafe_extra_arg" and "extra_args may not" in str(err.value)


@pytest.mark.parametrize("args", [
    ["--flash-attn"], ["-ngl", "99"], ["--temp", "0.7", "--threads", "-1"], ["-c", "4096"], ["--jinja"],
    ["-M", "img_gen"], ["--override-kv", "a=int:1"], ["--max-model-len", "4096"],
])
def test_ordinary_tuning_flags_pass(args: list[str]) -> None:
    assert unsafe_arg(args) is None
    assert parse_order({**ORDER, "extra_args": args}).extra_args == tuple(args)


def test_cook_answers_400_with_the_reason_and_writes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "files"
    root.mkdir()
    (root / "ok.sim.json").write_text(json.dumps(TEXT))
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT}, models={"file_roots": [str(root)]})
    world.start(node)
    order = {"id": "drive-by", "files": {"model": "ok.sim.json"}, "extra_args": ["--host", "0.0.0.0"]}
    response, content = world.call("POST", node, "/router/v1/site/cook/apply", json=order)
    body = json.loads(content)
    assert response.code == 400 and body["error"]["code"] == "unsafe_extra_arg"
    assert "--host" in body["error"]["message"]
    assert not (tmp_path / "solo" / "models" / "drive-by.kcpps").exists()


def test_routerd_check_warns_of_a_hand_written_one_and_still_says_ok(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (tmp_path / "w.sim.json").write_text(json.dumps(TEXT))
    (models / "hand.kcpps").write_text(json.dumps({"model": "../w.sim.json",
                                                   "extra_args": ["--host", "0.0.0.0"]}))
    (tmp_path / "routerd.yaml").write_text(json.dumps({
        "models": {"config_dir": str(models)}, "llama": {"binary_path": ["/bin/true"],
                                                         "extra_args": ["--log-file", "/tmp/l.log"]}}))
    ok, errors = check_config(str(tmp_path / "routerd.yaml"))
    assert ok, errors
    warnings = capsys.readouterr().err
    assert "warning: hand.kcpps: extra_args may not set --host" in warnings
    assert "warning: llama.extra_args: extra_args may not set --log-file" in warnings


def test_ids_and_key_names_are_matched_whole(tmp_path: Path) -> None:
    with pytest.raises(CookError, match="id must be"):
        valid_id("ok\n")
    assert valid_id("ok") == "ok"
    with pytest.raises(ConfigError, match="name"):
        parse_config({"auth": {"inference_keys": [{"name": "team\n", "key": "k" * 20}]},
                      "models": {"config_dir": str(tmp_path)}}, ".", {})
    assert not is_sha256("0" * 64 + "\n") and is_sha256("0" * 64)
    with pytest.raises(RecipeError):
        parse_recipe({"id": "split\n", "lanes": {}})
    with pytest.raises(BindRefused):
        parse_origin("hf://o/r@" + "0" * 40 + "/a.gguf\n")
    assert parse_origin("hf://o/r@" + "0" * 40 + "/a.gguf").commit == "0" * 40
