"""Exact command lines for llama-server, sd-server and whisper-server."""

from __future__ import annotations

from typing import Any

import pytest

from routerd.backends.families.llama_sdcpp import image_argv, primary_kind, stt_argv, text_argv
from routerd.catalog.model import Capabilities, ModelConfig

CMD = ("/opt/llama/llama-server",)
EXTRA = ("--threads", "8")


def config(capabilities: Capabilities, **fields: Any) -> ModelConfig:
    return ModelConfig(
        local_id="m",
        filename="m.kcpps",
        path="/models/m.kcpps",
        backend_mode="llama_sdcpp",
        capabilities=capabilities,
        config_hash="h",
        **fields,
    )


def test_text_argv_with_every_option_in_order() -> None:
    m = config(
        Capabilities(llm=True, multimodal=True, embeddings=True),
        text_model="/w/qwen.gguf",
        mmproj="/w/mmproj.gguf",
        context_size=8192,
        parallel=2,
        extra_args=("--flash-attn", "on"),
    )
    assert text_argv(CMD, EXTRA, m, 41001) == [
        "/opt/llama/llama-server",
        "--host",
        "127.0.0.1",
        "--port",
        "41001",
        "-m",
        "/w/qwen.gguf",
        "--ctx-size",
        "8192",
        "--parallel",
        "2",
        "--mmproj",
        "/w/mmproj.gguf",
        "--embeddings",
        "--pooling",
        "mean",
        "--metrics",
        "--flash-attn",
        "on",
        "--threads",
        "8",
    ]


def test_text_argv_minimal_config_has_no_optional_flags_but_one_slot_and_metrics() -> None:
    """Only ``--parallel 1``: a config without ``parallel`` serves one request at a time as routerd counts it
    (llama-server b11434 would otherwise run 4 slots at once); and ``--metrics``, which the rack telemetry
    reads."""
    m = config(Capabilities(llm=True), text_model="/w/a.gguf")
    assert text_argv(["python", "-m", "routerd.sim", "llama-server"], (), m, 5) == [
        "python",
        "-m",
        "routerd.sim",
        "llama-server",
        "--host",
        "127.0.0.1",
        "--port",
        "5",
        "-m",
        "/w/a.gguf",
        "--parallel",
        "1",
        "--metrics",
    ]


def test_text_argv_leaves_the_slot_count_to_a_flag_that_sets_it() -> None:
    m = config(Capabilities(llm=True), text_model="/w/a.gguf")
    for cmd, own in (((*CMD, "-np", "3"), ()), (CMD, ("--parallel=2",)), (CMD, ("-np", "4"))):
        argv = text_argv(cmd, own, m, 5)
        assert argv.count("1") == 0 and "--parallel" not in argv[:-len(own) or None], argv


def test_text_argv_for_an_embeddings_only_config_serves_the_embeddings_model() -> None:
    m = config(Capabilities(embeddings=True), embeddings_model="/w/bge.gguf", context_size=512)
    assert text_argv(CMD, (), m, 7) == [
        "/opt/llama/llama-server",
        "--host",
        "127.0.0.1",
        "--port",
        "7",
        "-m",
        "/w/bge.gguf",
        "--embeddings",
        "--ctx-size",
        "512",
        "--parallel",
        "1",
        "--metrics",
    ]


def test_text_argv_pools_a_text_model_that_embeds_by_mean_unless_its_flags_choose() -> None:
    """A generative GGUF states no pooling, and llama-server refuses /v1/embeddings without one."""
    m = config(Capabilities(llm=True, embeddings=True), text_model="/w/a.gguf")
    assert text_argv(CMD, (), m, 5)[-4:] == ["--embeddings", "--pooling", "mean", "--metrics"]
    for own in (("--pooling", "last"), ("--pooling=cls",)):
        chosen = config(Capabilities(llm=True, embeddings=True), text_model="/w/a.gguf", extra_args=own)
        argv = text_argv(CMD, (), chosen, 5)
        assert argv.count("mean") == 0 and argv[-len(own):] == list(own)
        assert text_argv(CMD, own, config(Capabilities(llm=True, embeddings=True), text_model="/w/a.gguf"),
                         5).count("mean") == 0


def test_text_argv_asks_for_metrics_once() -> None:
    """``--metrics`` is added unless the binary's or the model's flags already give it."""
    m = config(Capabilities(llm=True), text_model="/w/a.gguf")
    assert text_argv(CMD, (), m, 5).count("--metrics") == 1
    assert text_argv((*CMD, "--metrics"), (), m, 5).count("--metrics") == 1
    assert text_argv(CMD, ("--metrics",), m, 5).count("--metrics") == 1


def test_image_argv() -> None:
    m = config(Capabilities(image=True), sd_model="/w/sdxl.safetensors", extra_args=("--steps", "4"))
    assert image_argv(["/opt/sd/sd-server"], ("--vae-tiling",), m, 41002) == [
        "/opt/sd/sd-server",
        "--listen-ip",
        "127.0.0.1",
        "--listen-port",
        "41002",
        "-m",
        "/w/sdxl.safetensors",
        "--steps",
        "4",
        "--vae-tiling",
    ]


def test_stt_argv() -> None:
    m = config(Capabilities(stt=True), whisper_model="/w/ggml-base.bin")
    assert stt_argv(["/opt/whisper/whisper-server"], ("-t", "4"), m, 41003) == [
        "/opt/whisper/whisper-server",
        "--host",
        "127.0.0.1",
        "--port",
        "41003",
        "-m",
        "/w/ggml-base.bin",
        "-t",
        "4",
    ]


def test_a_combined_configs_extra_args_go_to_llama_server_only() -> None:
    m = config(
        Capabilities(llm=True, image=True, stt=True),
        text_model="/w/t.gguf",
        sd_model="/w/sd.gguf",
        whisper_model="/w/wh.bin",
        extra_args=("--jinja",),
    )
    assert primary_kind(m) == "text"
    assert text_argv(CMD, (), m, 1)[-1] == "--jinja"
    assert "--jinja" not in image_argv(["sd-server"], (), m, 2)
    assert "--jinja" not in stt_argv(["whisper-server"], (), m, 3)


@pytest.mark.parametrize("build", [text_argv, image_argv, stt_argv])
def test_argv_for_a_config_without_those_weights_is_refused(build: Any) -> None:
    with pytest.raises(ValueError, match="names no"):
        build(CMD, (), config(Capabilities()), 1)
