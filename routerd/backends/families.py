"""The three backend families and how each maps a (runtime kind, model) to a slot and a probe.

* ``llama_sdcpp``: one slot per kind (llama-server, sd-server, whisper-server).
* ``kobold``: one KoboldCpp slot for every kind; switches by ``reload_config``.
* ``vllm``: generation, pooling and speech slots, one ``vllm serve`` each.

A model's own ``backend_mode`` picks its family (reference §4: a ``.kcpps`` overrides the node's
``backend.mode``).  Text-side kinds (text, embeddings, multimodal, speech, music) are ``text``; image
is ``image``; transcription ``stt``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from twisted.internet.defer import Deferred

from routerd.backends import kobold, vllm
from routerd.backends.llama_sdcpp import SPECS
from routerd.backends.process import ProcessLauncher, Scheduler, resolve_command
from routerd.backends.readiness import (
    HTTPGetter,
    Probe,
    probe_health,
    probe_image,
    probe_kobold_capability,
    probe_kobold_live,
    probe_text,
)
from routerd.backends.slot import LoadEvent, RuntimeSlot
from routerd.catalog.model import RUNTIME_KINDS, ModelConfig, RuntimeKind
from routerd.config.schema import BinaryConfig, Config

__all__ = ["Family", "KoboldFamily", "LlamaSdcppFamily", "SlotFactory", "VllmFamily", "text_side"]

#: ``factory(kind, name, argv_for, probe, **slot_options) -> RuntimeSlot``.
SlotFactory = Callable[..., RuntimeSlot]


def text_side(model: ModelConfig) -> bool:
    """Whether a config has anything the text side serves (text, embeddings, multimodal, speech,
    music)."""
    caps = model.capabilities
    return caps.llm or caps.embeddings or caps.multimodal or caps.tts or caps.music


class Family:
    """One family's slots (created up front; no process runs until a load needs one)."""

    name = ""

    def slots(self) -> list[RuntimeSlot]:
        raise NotImplementedError

    def slot_for(self, kind: RuntimeKind, model: ModelConfig) -> RuntimeSlot | None:
        """The slot a ``kind`` request for ``model`` runs in, ``None`` if the family cannot serve it."""
        raise NotImplementedError

    def slots_for_kind(self, kind: RuntimeKind) -> list[RuntimeSlot]:
        """The slots an unload of ``kind`` stops."""
        raise NotImplementedError

    def lane_probe(self, kind: RuntimeKind, model: ModelConfig) -> Probe:
        """The readiness probe of the ``kind`` lane while ``model`` is loaded (reference §4.2)."""
        raise NotImplementedError

    def boot(self) -> None:
        """Anything the family starts with the router (KoboldCpp ``--nomodel``)."""


def _command(binary: BinaryConfig, setting: str) -> list[str]:
    return resolve_command(binary.command, setting)


class LlamaSdcppFamily(Family):
    name = "llama_sdcpp"

    def __init__(self, config: Config, make: SlotFactory) -> None:
        self._slots: dict[RuntimeKind, RuntimeSlot] = {}
        for kind in RUNTIME_KINDS:
            spec = SPECS[kind]
            binary: BinaryConfig = getattr(config, spec.section)
            setting = f"{spec.section}.binary_path"

            def argv_for(model: ModelConfig, port: int, spec: Any = spec, binary: BinaryConfig = binary,
                         setting: str = setting) -> list[str]:
                # Resolved at every load, so a binary installed after start-up is found.
                return list(spec.argv(_command(binary, setting), binary.extra_args, model, port))

            self._slots[kind] = make(kind, spec.process_name, argv_for, spec.probe)

    def slots(self) -> list[RuntimeSlot]:
        return [self._slots[k] for k in RUNTIME_KINDS]

    def slot_for(self, kind: RuntimeKind, model: ModelConfig) -> RuntimeSlot | None:
        return self._slots[kind] if model.capabilities.serves(kind) else None

    def slots_for_kind(self, kind: RuntimeKind) -> list[RuntimeSlot]:
        return [self._slots[kind]]

    def lane_probe(self, kind: RuntimeKind, model: ModelConfig) -> Probe:
        return SPECS[kind].probe


def _sleep(clock: Scheduler, seconds: float) -> Deferred[None]:
    d: Deferred[None] = Deferred()
    clock.callLater(seconds, d.callback, None)
    return d


class KoboldFamily(Family):
    """One KoboldCpp process for every lane."""

    name = "kobold"
    #: How often a reload waits for a just-started (``--nomodel``) process to answer.
    LIVE_POLL_S = 0.1

    def __init__(self, config: Config, make: SlotFactory, *, clock: Scheduler, http: Any,
                 probe_timeout_s: float) -> None:
        binary = config.kobold
        self.password = kobold.new_admin_password()
        self.admindir = os.path.join(config.cluster.store_dir, "kobold-configs")
        self.no_model = binary.no_model
        self._clock = clock
        self._http = http
        self._probe_timeout_s = probe_timeout_s
        self._reload_timeout_s = binary.reload_timeout

        def argv_for(model: ModelConfig, port: int) -> list[str]:
            return kobold.model_argv(_command(binary, "kobold.binary_path"), binary.extra_args, model, port,
                                     self.password, self.admindir)

        def idle(port: int) -> list[str]:
            return kobold.idle_argv(_command(binary, "kobold.binary_path"), binary.extra_args, port,
                                    self.password, self.admindir)

        self.slot = make("text", "koboldcpp", argv_for, probe_kobold_live, reload=self._reload,
                         reload_timeout_s=binary.reload_timeout, idle_argv=idle)

    def _reload(self, model: ModelConfig, port: int) -> Deferred[None]:
        return Deferred.fromCoroutine(self._reload_async(model, port))

    async def _reload_async(self, model: ModelConfig, port: int) -> None:
        base = f"http://127.0.0.1:{port}"
        deadline = self._clock.seconds() + self._reload_timeout_s
        # A process started a moment ago (--nomodel) may not listen yet.
        while not await probe_kobold_live(self._http, base, self._probe_timeout_s):
            if self._clock.seconds() >= deadline:
                raise kobold.ReloadRefused("KoboldCpp did not answer to take the reload")
            await _sleep(self._clock, self.LIVE_POLL_S)
        await kobold.reload_config(self._http, base, self.password, self.admindir, model,
                                   self._probe_timeout_s)

    def slots(self) -> list[RuntimeSlot]:
        return [self.slot]

    def slot_for(self, kind: RuntimeKind, model: ModelConfig) -> RuntimeSlot | None:
        caps = model.capabilities
        serves = {"text": text_side(model), "image": caps.image, "stt": caps.stt}[kind]
        return self.slot if serves else None

    def slots_for_kind(self, kind: RuntimeKind) -> list[RuntimeSlot]:
        return [self.slot]

    def lane_probe(self, kind: RuntimeKind, model: ModelConfig) -> Probe:
        caps = model.capabilities
        if kind == "image":
            return probe_image
        if kind == "stt":
            return probe_kobold_capability("transcribe")
        if caps.llm:
            return probe_text
        if caps.embeddings:
            return probe_kobold_capability("embeddings")
        if caps.tts:
            return probe_kobold_capability("tts")
        return probe_kobold_capability("music")

    def boot(self) -> None:
        if self.no_model:
            self.slot.start_idle()


class VllmFamily(Family):
    """Generation, pooling and speech runtimes, each one lazily started ``vllm serve``."""

    name = "vllm"

    def __init__(self, config: Config, make: SlotFactory) -> None:
        binary = config.vllm

        def argv_for(model: ModelConfig, port: int) -> list[str]:
            return vllm.serve_argv(_command(binary, "vllm.binary_path"), binary.extra_args, model, port)

        kinds: Mapping[vllm.VllmRuntime, RuntimeKind] = {"generation": "text", "pooling": "text",
                                                         "speech": "stt"}
        self._slots = {name: make(kinds[name], f"vllm-{name}", argv_for, probe_health)
                       for name in vllm.VLLM_RUNTIMES}

    def slots(self) -> list[RuntimeSlot]:
        return [self._slots[name] for name in vllm.VLLM_RUNTIMES]

    def slot_for(self, kind: RuntimeKind, model: ModelConfig) -> RuntimeSlot | None:
        if kind == "image":
            return None
        if kind == "stt" and not model.capabilities.stt:
            return None
        if kind == "text" and not text_side(model):
            return None
        return self._slots[vllm.runtime_of(model)]

    def slots_for_kind(self, kind: RuntimeKind) -> list[RuntimeSlot]:
        if kind == "text":
            return [self._slots["generation"], self._slots["pooling"]]
        if kind == "stt":
            return [self._slots["speech"]]
        return []

    def lane_probe(self, kind: RuntimeKind, model: ModelConfig) -> Probe:
        return probe_health


def slot_factory(clock: Scheduler, launcher: ProcessLauncher, http: HTTPGetter,
                 port_allocator: Callable[[], int], on_load: Callable[[LoadEvent], None] | None,
                 env: Mapping[str, str] | None, probe_timeout_s: float, **options: Any) -> SlotFactory:
    """A factory building slots that share the node's clock, launcher, probes and timeouts."""

    def make(kind: RuntimeKind, name: str, argv_for: Callable[[ModelConfig, int], list[str]], probe: Probe,
             **more: Any) -> RuntimeSlot:
        def probe_base(base_url: str) -> Deferred[bool]:
            return probe(http, base_url, probe_timeout_s)

        return RuntimeSlot(kind, clock=clock, launcher=launcher, argv_for=argv_for, probe=probe_base,
                           port_allocator=port_allocator, on_load=on_load, name=name, env=env,
                           **options, **more)

    return make
