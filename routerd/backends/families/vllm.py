"""The ``vllm`` family: generation, pooling and speech runtimes, each a lazily started
``vllm serve MODEL`` process (reference cluster.md §7.1); readiness is ``GET /health``.

A config's ``vllm.settings`` become ``vllm serve`` flags (``max_model_length`` →
``--max-model-len``, ``max_number_sequences`` → ``--max-num-seqs``, …) and ``vllm.serve_args``
are appended as given.  The process serves the model under its local ID
(``--served-model-name``), the name routerd writes into every request it forwards.

Its declared facts are its ``DECLARED`` (read by :mod:`routerd.families`).

The APIs clients speak besides chat (README "APIs"), checked in vLLM's own source (main, commits
01540b75 and 055e47c2): ``vllm/entrypoints/anthropic/api_router.py`` serves ``POST /v1/messages`` and
``POST /v1/messages/count_tokens``, ``vllm/frontend/entrypoints/openai/responses/api_router.py``
``POST /v1/responses`` (with its own store behind ``GET /v1/responses/{id}``, which routerd does not
route), ``vllm/entrypoints/pooling/score/api_router.py`` ``POST /rerank``, ``/v1/rerank`` and
``/v2/rerank`` (a pooling, score-capable model only), and ``vllm/entrypoints/serve/tokenize`` ``POST
/tokenize``.  So every one of them passes through: routerd translates nothing for vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from twisted.internet.defer import Deferred

from routerd.backends.families.base import Family, FamilyPlugin, FamilyWorld, SlotFactory, command, text_side
from routerd.backends.readiness import PROBE_TIMEOUT_S, HTTPGetter, Probe, probe_url
from routerd.backends.slot import RuntimeSlot
from routerd.catalog.model import ModelConfig, RuntimeKind
from routerd.config.schema import BinaryConfig, Config
from routerd.families import Declared

DECLARED = Declared(
    "vllm",
    sections={"text": "vllm", "stt": "vllm"},
    simulators={"vllm": "vllm"},
    # vLLM serves Anthropic's Messages (and token counting), OpenAI's Responses and rerank itself
    passes_through=frozenset({"tts", "stt", "messages", "count_tokens", "responses", "rerank"}),
    # KoboldCpp's own API, llama-server's completion and every image route
    refuses=frozenset({"kobold_tts", "kobold_generate", "kobold_generate_stream", "kobold_transcribe",
                       "kobold_music", "llama_completion", "image", "sd_txt2img", "sd_img2img"}),
    context_from_settings=True,
)

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


def probe_health(http: HTTPGetter, base_url: str, timeout: float = PROBE_TIMEOUT_S) -> Deferred[bool]:
    """vLLM's readiness: ``GET /health`` 2xx (its body is empty)."""
    return Deferred.fromCoroutine(probe_url(http, base_url + "/health", timeout, None))


#: The runtime kind each runtime's requests are (its lane).
_KINDS: Mapping[VllmRuntime, RuntimeKind] = {"generation": "text", "pooling": "text", "speech": "stt"}


class VllmFamily(Family):
    """Generation, pooling and speech runtimes, each one lazily started ``vllm serve``."""

    name = DECLARED.name

    def __init__(self, config: Config, make: SlotFactory) -> None:
        section = DECLARED.sections["text"]
        binary: BinaryConfig = getattr(config, section)
        setting = f"{section}.binary_path"

        def argv_for(model: ModelConfig, port: int) -> list[str]:
            return serve_argv(command(binary, setting), binary.extra_args, model, port)

        self._slots = {name: make(_KINDS[name], f"vllm-{name}", argv_for, probe_health)
                       for name in VLLM_RUNTIMES}

    def slots(self) -> list[RuntimeSlot]:
        return [self._slots[name] for name in VLLM_RUNTIMES]

    def slot_for(self, kind: RuntimeKind, model: ModelConfig) -> RuntimeSlot | None:
        if kind not in DECLARED.kinds:
            return None
        if kind == "stt" and not model.capabilities.stt:
            return None
        if kind == "text" and not text_side(model):
            return None
        return self._slots[runtime_of(model)]

    def slots_for_kind(self, kind: RuntimeKind) -> list[RuntimeSlot]:
        if kind == "text":
            return [self._slots["generation"], self._slots["pooling"]]
        if kind == "stt":
            return [self._slots["speech"]]
        return []

    def lane_probe(self, kind: RuntimeKind, model: ModelConfig) -> Probe:
        return probe_health


def _build(config: Config, make: SlotFactory, world: FamilyWorld) -> Family:
    return VllmFamily(config, make)


PLUGIN = FamilyPlugin(DECLARED, _build)
