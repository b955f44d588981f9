"""The ``vllm`` family: generation, pooling and speech runtimes, each a lazily started
``vllm serve MODEL`` process (reference cluster.md §7.1); readiness is ``GET /health``.

A config's ``vllm.settings`` become ``vllm serve`` flags (``max_model_length`` →
``--max-model-len``, ``max_number_sequences`` → ``--max-num-seqs``, …) and ``vllm.serve_args``
are appended as given.  The process serves the model under its local ID
(``--served-model-name``), the name routerd writes into every request it forwards.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from routerd.catalog.model import ModelConfig

HOST = "127.0.0.1"

VllmRuntime = Literal["generation", "pooling", "speech"]
VLLM_RUNTIMES: tuple[VllmRuntime, ...] = ("generation", "pooling", "speech")

#: ``vllm.settings`` key -> ``vllm serve`` flag (booleans become bare switches when true).
SETTING_FLAGS: Mapping[str, str] = {
    "max_model_length": "--max-model-len",
    "max_number_sequences": "--max-num-seqs",
    "dtype": "--dtype",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "tensor_parallel_size": "--tensor-parallel-size",
    "pipeline_parallel_size": "--pipeline-parallel-size",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "enable_chunked_prefill": "--enable-chunked-prefill",
    "enable_prefix_caching": "--enable-prefix-caching",
    "quantization": "--quantization",
    "kv_cache_dtype": "--kv-cache-dtype",
    "seed": "--seed",
}


def runtime_of(model: ModelConfig) -> VllmRuntime:
    """Which runtime a config runs in: speech for a text-to-speech or transcription model,
    pooling for an embeddings-only one, else generation."""
    caps = model.capabilities
    if not caps.llm and (caps.tts or caps.stt):
        return "speech"
    if not caps.llm and caps.embeddings:
        return "pooling"
    return "generation"


def weights_of(model: ModelConfig) -> str:
    for path in (model.text_model, model.embeddings_model, model.tts_model, model.whisper_model):
        if path:
            return path
    raise ValueError(f"model {model.local_id!r} names no weights vLLM can serve")


def _vllm_section(model: ModelConfig) -> Mapping[str, Any]:
    section = model.options.get("vllm")
    return section if isinstance(section, Mapping) else {}


def setting_args(settings: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for key, flag in SETTING_FLAGS.items():
        value = settings.get(key)
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
        elif isinstance(value, str | int | float):
            out += [flag, str(value)]
    return out


def serve_argv(cmd: Sequence[str], extra: Sequence[str], model: ModelConfig, port: int) -> list[str]:
    """``vllm serve MODEL --host --port --served-model-name ID`` + settings, runner, serve_args."""
    section = _vllm_section(model)
    settings = section.get("settings")
    argv = [*cmd, "serve", weights_of(model), "--host", HOST, "--port", str(port),
            "--served-model-name", model.local_id]
    argv += setting_args(settings if isinstance(settings, Mapping) else {})
    runner = section.get("runner")
    if isinstance(runner, str) and runner:
        argv += ["--runner", runner]
    elif runtime_of(model) == "pooling":
        argv += ["--runner", "pooling"]
    if section.get("trust_remote_code") is True:
        argv.append("--trust-remote-code")
    serve_args = section.get("serve_args")
    if isinstance(serve_args, list):
        argv += [str(a) for a in serve_args]
    return [*argv, *model.extra_args, *extra]
