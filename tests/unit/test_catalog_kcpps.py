"""routerd.catalog.kcpps: parsing one .kcpps model config (contract §3)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from routerd.catalog.kcpps import (
    NO_MODEL_FILE,
    bad_backend_mode,
    config_hash,
    image_id_for,
    looks_like_path,
    parse_kcpps,
)
from routerd.catalog.model import Capabilities, InvalidConfig, ModelConfig


def write(directory: Path, name: str, content: Any) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return str(path)


def parse_ok(directory: Path, content: Any, name: str = "m.kcpps", mode: str = "llama_sdcpp") -> ModelConfig:
    result = parse_kcpps(write(directory, name, content), mode)
    assert isinstance(result, ModelConfig), result
    return result


def parse_bad(directory: Path, content: Any, name: str = "m.kcpps") -> InvalidConfig:
    result = parse_kcpps(write(directory, name, content), "llama_sdcpp")
    assert isinstance(result, InvalidConfig), result
    return result


# -- keys ---------------------------------------------------------------------


def test_every_read_key_lands_in_its_field(tmp_path: Path) -> None:
    cfg = parse_ok(
        tmp_path,
        {
            "backend_mode": "kobold",
            "model": "/w/text.gguf",
            "contextsize": 8192,
            "parallel": 1,
            "mmproj": "/w/proj.gguf",
            "embeddingsmodel": "/w/embed.gguf",
            "sdmodel": "/w/sdxl.safetensors",
            "whispermodel": "/w/whisper.bin",
            "ttsmodel": "/w/tts.gguf",
            "vllm": {"settings": {"max_model_length": 4096, "max_number_sequences": 1}},
            "extra_args": ["--flash-attn", "--threads", "8"],
            "threads": 8,
        },
        name="full.kcpps",
    )
    assert cfg.local_id == "full"
    assert cfg.filename == "full.kcpps"
    assert cfg.path == str(tmp_path / "full.kcpps")
    assert cfg.backend_mode == "kobold"
    assert cfg.text_model == "/w/text.gguf"
    assert cfg.mmproj == "/w/proj.gguf"
    assert cfg.embeddings_model == "/w/embed.gguf"
    assert cfg.sd_model == "/w/sdxl.safetensors"
    assert cfg.whisper_model == "/w/whisper.bin"
    assert cfg.tts_model == "/w/tts.gguf"
    assert cfg.context_size == 8192
    assert cfg.parallel == 1
    assert cfg.vllm_max_model_length == 4096
    assert cfg.vllm_max_sequences == 1
    assert cfg.extra_args == ("--flash-attn", "--threads", "8")
    assert cfg.image_id == "full-sdxl"
    assert cfg.model_hash == ""
    assert cfg.options["threads"] == 8
    assert cfg.capabilities == Capabilities(
        llm=True, image=True, embeddings=True, multimodal=True, stt=True, tts=True, context=8192
    )
    assert cfg.weight_files() == {
        "model": "/w/text.gguf",
        "mmproj": "/w/proj.gguf",
        "embeddingsmodel": "/w/embed.gguf",
        "sdmodel": "/w/sdxl.safetensors",
        "whispermodel": "/w/whisper.bin",
        "ttsmodel": "/w/tts.gguf",
    }


def test_file_stem_is_the_local_id_even_with_dots(tmp_path: Path) -> None:
    assert parse_ok(tmp_path, {"model": "/a.gguf"}, name="qwen2.5-7b.kcpps").local_id == "qwen2.5-7b"


def test_model_param_is_read_when_model_is_unset(tmp_path: Path) -> None:
    cfg = parse_ok(tmp_path, {"model": "", "model_param": "/w/text.gguf"})
    assert cfg.text_model == "/w/text.gguf"
    assert cfg.capabilities.llm


def test_model_wins_over_model_param(tmp_path: Path) -> None:
    cfg = parse_ok(tmp_path, {"model": "/w/a.gguf", "model_param": "/w/b.gguf"})
    assert cfg.text_model == "/w/a.gguf"


def test_model_as_a_list_uses_its_first_non_empty_entry(tmp_path: Path) -> None:
    cfg = parse_ok(tmp_path, {"model": ["", "/w/shard-1.gguf", "/w/shard-2.gguf"]})
    assert cfg.text_model == "/w/shard-1.gguf"


def test_empty_strings_and_nulls_mean_unset(tmp_path: Path) -> None:
    cfg = parse_ok(
        tmp_path,
        {"model": "/w/t.gguf", "mmproj": "", "sdmodel": None, "whispermodel": "", "parallel": None},
    )
    assert cfg.mmproj is None and cfg.sd_model is None and cfg.whisper_model is None
    assert cfg.parallel is None
    assert cfg.capabilities == Capabilities(llm=True)
    assert cfg.weight_files() == {"model": "/w/t.gguf"}


def test_missing_backend_mode_takes_the_node_default(tmp_path: Path) -> None:
    assert parse_ok(tmp_path, {"model": "/a.gguf"}, mode="vllm").backend_mode == "vllm"
    assert (
        parse_ok(tmp_path, {"model": "/a.gguf", "backend_mode": ""}, mode="kobold").backend_mode == "kobold"
    )


def test_extra_args_string_is_split_like_a_shell(tmp_path: Path) -> None:
    cfg = parse_ok(tmp_path, {"model": "/a.gguf", "extra_args": "--foo 'two words' --bar=1"})
    assert cfg.extra_args == ("--foo", "two words", "--bar=1")


def test_mcp_keys_are_left_out_of_options(tmp_path: Path) -> None:
    cfg = parse_ok(tmp_path, {"model": "/a.gguf", "mcp_servers": [], "mcp_enabled": True, "mcpfile": "x"})
    assert set(cfg.options) == {"model"}


def test_utf8_bom_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "bom.kcpps"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"model": "/a.gguf"}).encode())
    assert isinstance(parse_kcpps(str(path), "kobold"), ModelConfig)


# -- paths --------------------------------------------------------------------


def test_relative_weight_paths_resolve_against_the_config_directory(tmp_path: Path) -> None:
    configs = tmp_path / "configs"
    cfg = parse_ok(
        configs,
        {
            "model": "weights/t.gguf",
            "mmproj": "../shared/p.gguf",
            "sdmodel": "./img.safetensors",
            "whispermodel": "w.bin",
            "embeddingsmodel": "e.gguf",
            "ttsmodel": "sub/../tts.gguf",
        },
    )
    assert cfg.text_model == str(configs / "weights" / "t.gguf")
    assert cfg.mmproj == str(tmp_path / "shared" / "p.gguf")
    assert cfg.sd_model == str(configs / "img.safetensors")
    assert cfg.whisper_model == str(configs / "w.bin")
    assert cfg.embeddings_model == str(configs / "e.gguf")
    assert cfg.tts_model == str(configs / "tts.gguf")


def test_relative_config_path_still_yields_absolute_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path / "c", "r.kcpps", {"model": "t.gguf"})
    monkeypatch.chdir(tmp_path)
    cfg = parse_kcpps(os.path.join("c", "r.kcpps"), "kobold")
    assert isinstance(cfg, ModelConfig)
    assert cfg.path == str(tmp_path / "c" / "r.kcpps")
    assert cfg.text_model == str(tmp_path / "c" / "t.gguf")


def test_absolute_weight_paths_are_kept(tmp_path: Path) -> None:
    assert parse_ok(tmp_path, {"model": "/srv/models/t.gguf"}).text_model == "/srv/models/t.gguf"


# -- image id -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("sdmodel", "image_id"),
    [
        ("juggernautXL.safetensors", "sdxl-juggernautXL"),
        ("/w/dream.gguf", "sdxl-dream"),
        ("old.ckpt", "sdxl-old"),
        ("../weights/dream.sim.json", "sdxl-dream"),
        ("v1.5-pruned.SAFETENSORS", "sdxl-v1.5-pruned"),
        ("plain.json", "sdxl-plain.json"),
        ("noext", "sdxl-noext"),
        ("C:\\models\\win.safetensors", "sdxl-win"),
    ],
)
def test_image_id_strips_only_the_weights_ending(tmp_path: Path, sdmodel: str, image_id: str) -> None:
    cfg = parse_ok(tmp_path, {"sdmodel": sdmodel}, name="sdxl.kcpps")
    assert cfg.image_id == image_id
    assert image_id_for("sdxl", sdmodel) == image_id


def test_config_without_sdmodel_has_no_image_id(tmp_path: Path) -> None:
    assert parse_ok(tmp_path, {"model": "/a.gguf"}).image_id is None


# -- capabilities ---------------------------------------------------------------


def test_text_only_config_is_an_llm_with_its_context(tmp_path: Path) -> None:
    cfg = parse_ok(tmp_path, {"model": "/a.gguf", "contextsize": 4096})
    assert cfg.capabilities == Capabilities(llm=True, context=4096)
    assert cfg.capabilities.serves("text") and not cfg.capabilities.serves("image")


def test_image_only_config_is_not_an_llm(tmp_path: Path) -> None:
    cfg = parse_ok(tmp_path, {"sdmodel": "/i.safetensors"})
    assert cfg.capabilities == Capabilities(image=True)


def test_whisper_only_config_serves_stt(tmp_path: Path) -> None:
    cfg = parse_ok(tmp_path, {"whispermodel": "/w.bin"})
    assert cfg.capabilities == Capabilities(stt=True)
    assert cfg.capabilities.serves("stt")


def test_tts_only_config_is_valid_with_tts(tmp_path: Path) -> None:
    assert parse_ok(tmp_path, {"ttsmodel": "/t.gguf"}).capabilities == Capabilities(tts=True)


def test_embeddingsmodel_alone_gives_embeddings_not_llm(tmp_path: Path) -> None:
    cfg = parse_ok(tmp_path, {"embeddingsmodel": "/e.gguf", "contextsize": 2048})
    assert cfg.capabilities == Capabilities(embeddings=True, context=2048)
    assert cfg.capabilities.serves("text")


def test_embeddings_flag_with_text_model_gives_embeddings(tmp_path: Path) -> None:
    cfg = parse_ok(tmp_path, {"model": "/a.gguf", "embeddings": True})
    assert cfg.capabilities.embeddings and cfg.capabilities.llm


def test_mmproj_makes_an_llm_multimodal(tmp_path: Path) -> None:
    assert parse_ok(tmp_path, {"model": "/a.gguf", "mmproj": "/p.gguf"}).capabilities.multimodal


def test_mmproj_without_text_model_is_not_multimodal(tmp_path: Path) -> None:
    cfg = parse_ok(tmp_path, {"sdmodel": "/i.gguf", "mmproj": "/p.gguf"})
    assert not cfg.capabilities.multimodal and not cfg.capabilities.llm


def test_vllm_config_takes_its_context_from_max_model_length(tmp_path: Path) -> None:
    cfg = parse_ok(
        tmp_path,
        {
            "backend_mode": "vllm",
            "model": "/m",
            "contextsize": 2048,
            "vllm": {"settings": {"max_model_length": 32768}},
        },
    )
    assert cfg.capabilities.context == 32768


def test_non_vllm_config_prefers_contextsize_but_falls_back_to_max_model_length(tmp_path: Path) -> None:
    both = {"model": "/m.gguf", "contextsize": 2048, "vllm": {"settings": {"max_model_length": 9}}}
    assert parse_ok(tmp_path, both).capabilities.context == 2048
    only_vllm = {"model": "/m.gguf", "vllm": {"settings": {"max_model_length": 9}}}
    assert parse_ok(tmp_path, only_vllm).capabilities.context == 9


def test_no_stated_context_is_zero(tmp_path: Path) -> None:
    assert parse_ok(tmp_path, {"model": "/m.gguf"}).capabilities.context == 0


# -- invalid ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "key"),
    [
        ({"model": "/a.gguf", "contextsize": "big"}, "contextsize"),
        ({"model": "/a.gguf", "contextsize": -1}, "contextsize"),
        ({"model": "/a.gguf", "contextsize": 4096.5}, "contextsize"),
        ({"model": "/a.gguf", "contextsize": True}, "contextsize"),
        ({"model": "/a.gguf", "parallel": -1}, "parallel"),
        ({"model": "/a.gguf", "parallel": 0}, "parallel"),
        ({"model": "/a.gguf", "parallel": "2"}, "parallel"),
        ({"model": "/a.gguf", "extra_args": 5}, "extra_args"),
        ({"model": "/a.gguf", "extra_args": ["--ok", 3]}, "extra_args"),
        ({"model": "/a.gguf", "extra_args": "--unterminated 'quote"}, "extra_args"),
        ({"model": 5}, "model"),
        ({"model": "", "model_param": {"x": 1}}, "model_param"),
        ({"model": "/a.gguf", "model_param": 7}, "model_param"),
        ({"model": "/a.gguf", "mmproj": 1}, "mmproj"),
        ({"embeddingsmodel": True}, "embeddingsmodel"),
        ({"sdmodel": ["/a", 1]}, "sdmodel"),
        ({"whispermodel": {}}, "whispermodel"),
        ({"ttsmodel": 0}, "ttsmodel"),
        ({"model": "/a.gguf", "vllm": []}, "vllm"),
        ({"model": "/a.gguf", "vllm": {"settings": "x"}}, "vllm.settings"),
        (
            {"model": "/a", "vllm": {"settings": {"max_model_length": "long"}}},
            "vllm.settings.max_model_length",
        ),
        ({"model": "/a", "vllm": {"settings": {"max_model_length": 0}}}, "vllm.settings.max_model_length"),
        (
            {"model": "/a", "vllm": {"settings": {"max_number_sequences": -4}}},
            "vllm.settings.max_number_sequences",
        ),
        ({"model": "/a.gguf", "embeddings": "yes"}, "embeddings"),
    ],
)
def test_wrong_types_are_invalid_with_a_reason_naming_the_key(tmp_path: Path, content: Any, key: str) -> None:
    bad = parse_bad(tmp_path, content, name="bad.kcpps")
    assert bad.reason.startswith(f"{key} must") or bad.reason.startswith(f"{key} cannot"), bad.reason
    assert bad.filename == "bad.kcpps"
    assert bad.path == str(tmp_path / "bad.kcpps")


@pytest.mark.parametrize("mode", ["llama", "KOBOLD", 3, ["vllm"]])
def test_bad_backend_mode_is_invalid_with_the_fixed_reason(tmp_path: Path, mode: Any) -> None:
    assert parse_bad(tmp_path, {"model": "/a.gguf", "backend_mode": mode}).reason == bad_backend_mode()


@pytest.mark.parametrize(
    "content",
    [{}, {"contextsize": 4096}, {"model": "", "model_param": ""}, {"mmproj": "/p.gguf"}, {"model": []}],
)
def test_config_naming_no_model_file_is_invalid(tmp_path: Path, content: Any) -> None:
    assert parse_bad(tmp_path, content).reason == NO_MODEL_FILE


@pytest.mark.parametrize("text", ["", "{not json", '{"model": "/a",}', "\xff"])
def test_text_that_is_not_json_is_invalid(tmp_path: Path, text: str) -> None:
    assert "JSON" in parse_bad(tmp_path, text).reason


def test_non_utf8_bytes_are_invalid(tmp_path: Path) -> None:
    path = tmp_path / "latin.kcpps"
    path.write_bytes(b'{"model": "/caf\xe9.gguf"}')
    result = parse_kcpps(str(path), "kobold")
    assert isinstance(result, InvalidConfig) and "UTF-8" in result.reason


@pytest.mark.parametrize("content", [[], [{"model": "/a"}], "a string", 42, None])
def test_json_that_is_not_an_object_is_invalid(tmp_path: Path, content: Any) -> None:
    assert parse_bad(tmp_path, json.dumps(content)).reason == "config must be a JSON object"


def test_unreadable_file_is_invalid_not_an_exception(tmp_path: Path) -> None:
    result = parse_kcpps(str(tmp_path / "absent.kcpps"), "kobold")
    assert isinstance(result, InvalidConfig)
    assert result.reason.startswith("cannot read config")
    assert result.filename == "absent.kcpps"


# -- config hash --------------------------------------------------------------


def test_config_hash_is_equal_for_the_same_config_in_two_directories(tmp_path: Path) -> None:
    a = parse_ok(
        tmp_path / "host-a", {"model": "weights/t.gguf", "contextsize": 4096, "mmproj": "/opt/a/p.gguf"}
    )
    b = parse_ok(
        tmp_path / "host-b",
        {"mmproj": "D:\\models\\p.gguf", "contextsize": 4096, "model": "/home/b/elsewhere/t.gguf"},
    )
    assert a.text_model != b.text_model
    assert a.config_hash == b.config_hash
    assert len(a.config_hash) == 64 and int(a.config_hash, 16) >= 0


def test_config_hash_changes_when_a_setting_changes(tmp_path: Path) -> None:
    a = parse_ok(tmp_path, {"model": "/t.gguf", "contextsize": 4096})
    b = parse_ok(tmp_path, {"model": "/t.gguf", "contextsize": 8192})
    c = parse_ok(tmp_path, {"model": "/t.gguf", "contextsize": 4096, "extra_args": ["--flash-attn"]})
    assert len({a.config_hash, b.config_hash, c.config_hash}) == 3


def test_config_hash_distinguishes_which_weight_slots_are_set(tmp_path: Path) -> None:
    text = parse_ok(tmp_path, {"model": "/t.gguf"})
    image = parse_ok(tmp_path, {"sdmodel": "/t.gguf"})
    assert text.config_hash != image.config_hash


def test_config_hash_replaces_path_looking_strings_at_any_depth() -> None:
    one = {
        "model": "/a/t.gguf",
        "extra_args": ["--lora", "/a/l.safetensors"],
        "vllm": {"snapshot": {"path": "/a/s"}},
    }
    two = {
        "model": "/b/t.gguf",
        "extra_args": ["--lora", "C:\\b\\l.safetensors"],
        "vllm": {"snapshot": {"path": "x/y"}},
    }
    assert config_hash(one) == config_hash(two)
    assert config_hash(one) != config_hash({**one, "extra_args": ["--lora2", "/a/l.safetensors"]})


@pytest.mark.parametrize(
    ("value", "is_path"),
    [
        ("/a", True),
        ("a\\b", True),
        ("w.GGUF", True),
        ("x.sim.json", True),
        ("ggml.bin", True),
        ("q4_k_m", False),
    ],
)
def test_looks_like_path(value: str, is_path: bool) -> None:
    assert looks_like_path(value) is is_path


_scalar = st.one_of(
    st.integers(-(10**6), 10**6),
    st.booleans(),
    st.none(),
    st.text(alphabet="abcdefxyz_-", max_size=8),
)
_settings = st.dictionaries(
    st.sampled_from(["threads", "gpulayers", "quantkv", "flashattention", "usecpu"]), _scalar
)
_dirs = st.lists(st.text(alphabet="abcxyz01", min_size=1, max_size=6), min_size=1, max_size=4)


@given(settings_=_settings, dir_a=_dirs, dir_b=_dirs, reverse=st.booleans())
@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
def test_config_hash_is_invariant_under_key_order_and_directory(
    tmp_path: Path, settings_: dict[str, Any], dir_a: list[str], dir_b: list[str], reverse: bool
) -> None:
    first: dict[str, Any] = {
        "model": "/" + "/".join(dir_a) + "/t.gguf",
        "sdmodel": "rel/img.safetensors",
        **settings_,
    }
    items = list(first.items())
    if reverse:
        items.reverse()
    second = dict(items)
    second["model"] = "/" + "/".join(dir_b) + "/t.gguf"
    second["sdmodel"] = "/".join(dir_b) + "/img.safetensors"
    assert config_hash(first) == config_hash(second)
    path_a = tmp_path.joinpath(*dir_a)
    path_b = tmp_path.joinpath("other", *dir_b)
    assert parse_ok(path_a, first).config_hash == parse_ok(path_b, second).config_hash == config_hash(first)
