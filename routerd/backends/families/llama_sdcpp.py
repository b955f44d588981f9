"""The ``llama_sdcpp`` family: llama-server, sd-server and whisper-server as
three lazily started processes, one slot per runtime kind (reference cluster.md §7.1).

This module declares the family's facts (``DECLARED``, read by :mod:`routerd.families`), knows
its command lines, which probe tells each process is ready, and builds its slots.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from routerd.backends.families.base import Family, FamilyPlugin, FamilyWorld, SlotFactory, command
from routerd.backends.kv_slots import SlotKeeper
from routerd.backends.readiness import Probe, probe_image, probe_stt, probe_text
from routerd.backends.slot import RuntimeSlot
from routerd.catalog.model import RUNTIME_KINDS, ModelConfig, RuntimeKind
from routerd.config.schema import BinaryConfig, Config
from routerd.families import Declared

DECLARED = Declared(
    "llama_sdcpp",
    sections={"text": "llama", "image": "sdcpp", "stt": "whispercpp"},
    simulators={"llama": "llama-server", "sdcpp": "sd-server", "whispercpp": "whisper-server"},
    refuses=frozenset({"kobold_generate_stream"}),
    # llama-server (b11434) speaks Anthropic's Messages (and count_tokens), OpenAI's Responses and
    # rerank itself (rerank only when started with --reranking: a config's extra_args)
    passes_through=frozenset({"messages", "count_tokens", "responses", "rerank"}),
    video=True,
    kv_slots=True,
)

HOST = "127.0.0.1"

#: ``argv_builder(command, binary_extra_args, model, port) -> argv``.
ArgvBuilder = Callable[[Sequence[str], Sequence[str], ModelConfig, int], list[str]]


def primary_kind(model: ModelConfig) -> RuntimeKind | None:
    """The runtime a config's own ``extra_args`` belong to: text when it names
    text or embeddings weights, else image, else stt.  A combined config's
    ``extra_args`` are llama-server flags; handing them to sd-server or
    whisper-server as well would break those."""
    if model.text_model or model.embeddings_model:
        return "text"
    if model.sd_model:
        return "image"
    if model.whisper_model:
        return "stt"
    return None


def _model_extra(model: ModelConfig, kind: RuntimeKind) -> list[str]:
    return list(model.extra_args) if primary_kind(model) == kind else []


def _sets(args: Sequence[str], *flags: str) -> bool:
    """Whether ``args`` name one of ``flags`` (as ``--flag value`` or ``--flag=value``)."""
    return any(arg.split("=", 1)[0] in flags for arg in args)


def text_argv(cmd: Sequence[str], extra: Sequence[str], model: ModelConfig, port: int) -> list[str]:
    """llama-server for text, embeddings and multimodal.  An embeddings model's own GGUF says how it
    pools; a text model that also embeds gets ``--pooling mean`` unless its flags choose one.  A config
    without ``parallel`` serves one request at a time, as routerd's queue and pricing count it: llama-server
    is given ``--parallel 1`` (its own default runs 4 slots at once) unless a flag already sets it.  It is
    started with ``--metrics`` (its Prometheus ``/metrics``: the rack telemetry reads its token rates at each
    health poll) unless a flag already says so, and with ``--reranking`` for a config with
    ``"reranking": true``."""
    argv = [*cmd, "--host", HOST, "--port", str(port)]
    if model.text_model:
        argv += ["-m", model.text_model]
    elif model.embeddings_model:
        argv += ["-m", model.embeddings_model, "--embeddings"]
    else:
        raise ValueError(f"model {model.local_id!r} names no text or embeddings weights")
    if model.context_size:
        argv += ["--ctx-size", str(model.context_size)]
    own = [*_model_extra(model, "text"), *extra]
    if model.parallel:
        argv += ["--parallel", str(model.parallel)]
    elif not _sets([*cmd, *own], "-np", "--parallel"):
        argv += ["--parallel", "1"]
    if model.mmproj:
        argv += ["--mmproj", model.mmproj]
    if model.text_model and (model.capabilities.embeddings or model.embeddings_model):
        argv.append("--embeddings")
        if not _sets(own, "--pooling"):
            # a generative GGUF states no pooling: llama-server would refuse /v1/embeddings
            # ("Pooling type 'none' is not OAI compatible"); mean pooling is what embeds its text
            argv += ["--pooling", "mean"]
    if model.reranking and not _sets(own, "--rerank", "--reranking"):
        argv.append("--reranking")  # the config's "reranking": true (llama-server then serves /v1/rerank)
    if not _sets([*cmd, *own], "--metrics"):
        argv.append("--metrics")
    return [*argv, *own]


def with_slot_folder(argv: list[str], folder: str) -> list[str]:
    """llama-server's argv with ``--slot-save-path <folder>`` (where the KV slots kept across swaps are
    written: ``routerd.backends.kv_slots``) unless its flags name one already."""
    return argv if _sets(argv, "--slot-save-path") else [*argv, "--slot-save-path", folder]


def image_argv(cmd: Sequence[str], extra: Sequence[str], model: ModelConfig, port: int) -> list[str]:
    """sd-server."""
    if not model.sd_model:
        raise ValueError(f"model {model.local_id!r} names no image weights")
    argv = [*cmd, "--listen-ip", HOST, "--listen-port", str(port), "-m", model.sd_model]
    return [*argv, *_model_extra(model, "image"), *extra]


def stt_argv(cmd: Sequence[str], extra: Sequence[str], model: ModelConfig, port: int) -> list[str]:
    """whisper-server."""
    if not model.whisper_model:
        raise ValueError(f"model {model.local_id!r} names no whisper weights")
    argv = [*cmd, "--host", HOST, "--port", str(port), "-m", model.whisper_model]
    return [*argv, *_model_extra(model, "stt"), *extra]


@attrs.frozen
class RuntimeSpec:
    """How one runtime kind of the family is started and probed."""

    kind: RuntimeKind
    #: ``Config`` attribute holding the :class:`~routerd.config.schema.BinaryConfig`.
    section: str
    #: Label for log lines and error reasons.
    process_name: str
    argv: ArgvBuilder
    probe: Probe


SPECS: dict[RuntimeKind, RuntimeSpec] = {
    "text": RuntimeSpec("text", DECLARED.sections["text"], "llama-server", text_argv, probe_text),
    "image": RuntimeSpec("image", DECLARED.sections["image"], "sd-server", image_argv, probe_image),
    "stt": RuntimeSpec("stt", DECLARED.sections["stt"], "whisper-server", stt_argv, probe_stt),
}


class LlamaSdcppFamily(Family):
    name = DECLARED.name

    def __init__(self, config: Config, make: SlotFactory, kv_slots: SlotKeeper | None = None) -> None:
        self._slots: dict[RuntimeKind, RuntimeSlot] = {}
        for kind in RUNTIME_KINDS:
            spec = SPECS[kind]
            binary: BinaryConfig = getattr(config, spec.section)
            setting = f"{spec.section}.binary_path"
            keeper = kv_slots if kind == "text" and kv_slots is not None and kv_slots.enabled else None

            def argv_for(model: ModelConfig, port: int, spec: RuntimeSpec = spec,
                         binary: BinaryConfig = binary, setting: str = setting,
                         keeper: SlotKeeper | None = keeper) -> list[str]:
                argv = list(spec.argv(command(binary, setting), binary.extra_args, model, port))
                return argv if keeper is None else with_slot_folder(argv, keeper.folder)

            if keeper is None:
                self._slots[kind] = make(kind, spec.process_name, argv_for, spec.probe)
            else:  # llama-server's KV slots saved before a switch or an unload stops it
                self._slots[kind] = make(kind, spec.process_name, argv_for, spec.probe,
                                         before_stop=keeper.before_stop)

    def slots(self) -> list[RuntimeSlot]:
        return [self._slots[k] for k in RUNTIME_KINDS]

    def slot_for(self, kind: RuntimeKind, model: ModelConfig) -> RuntimeSlot | None:
        return self._slots[kind] if model.capabilities.serves(kind) else None

    def slots_for_kind(self, kind: RuntimeKind) -> list[RuntimeSlot]:
        return [self._slots[kind]]

    def lane_probe(self, kind: RuntimeKind, model: ModelConfig) -> Probe:
        return SPECS[kind].probe


def _build(config: Config, make: SlotFactory, world: FamilyWorld) -> Family:
    return LlamaSdcppFamily(config, make, world.kv_slots)


PLUGIN = FamilyPlugin(DECLARED, _build)
