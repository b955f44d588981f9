"""The node's runtimes for the ``llama_sdcpp`` family: one slot per runtime kind."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Literal, cast

from twisted.internet.defer import Deferred, FirstError, fail, gatherResults
from twisted.python.failure import Failure

from routerd.backends.errors import BackendMissing, LoadFailed, RuntimeClosed
from routerd.backends.llama_sdcpp import SPECS, RuntimeSpec
from routerd.backends.process import (
    ProcessLauncher,
    ReactorProcessLauncher,
    Scheduler,
    SpawningReactor,
    free_port,
    resolve_command,
)
from routerd.backends.readiness import PROBE_TIMEOUT_S, HTTPGetter
from routerd.backends.slot import (
    LOAD_TIMEOUT_S,
    STOP_GRACE_S,
    LoadEvent,
    RuntimeLease,
    RuntimeSlot,
    SlotStatus,
)
from routerd.catalog.model import RUNTIME_KINDS, ModelConfig, RuntimeKind
from routerd.config.schema import BinaryConfig, Config

__all__ = [
    "BackendMissing",
    "LoadEvent",
    "LoadFailed",
    "RuntimeClosed",
    "RuntimeLease",
    "SlotStatus",
    "Runtimes",
    "UnloadTarget",
]

UnloadTarget = Literal["text", "image", "stt", "all"]

#: Other names the contract's unload targets use for the same runtimes.
_TARGET_ALIASES: Mapping[str, tuple[RuntimeKind, ...]] = {
    "text": ("text",),
    "embeddings": ("text",),
    "image": ("image",),
    "stt": ("stt",),
    "voice": ("stt",),
    "transcription": ("stt",),
    "all": RUNTIME_KINDS,
    "": RUNTIME_KINDS,
}


class Runtimes:
    """Three lazily started backends (text, image, stt), one slot each.

    No process runs until a request or an explicit load needs it.  ``launcher``
    defaults to ``reactor.spawnProcess``, ``port_allocator`` to a free loopback
    port per load; ``env`` (default: the router's own) is every backend's
    environment.
    """

    def __init__(
        self,
        reactor: Scheduler,
        config: Config,
        http: HTTPGetter,
        launcher: ProcessLauncher | None = None,
        on_load: Callable[[LoadEvent], None] | None = None,
        port_allocator: Callable[[], int] | None = None,
        *,
        env: Mapping[str, str] | None = None,
        load_timeout_s: float = LOAD_TIMEOUT_S,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
        stop_grace_s: float = STOP_GRACE_S,
    ) -> None:
        if launcher is None:
            launcher = ReactorProcessLauncher(cast(SpawningReactor, reactor))
        if port_allocator is None:
            port_allocator = free_port
        self._slots: dict[RuntimeKind, RuntimeSlot] = {}
        for kind in RUNTIME_KINDS:
            spec = SPECS[kind]
            binary: BinaryConfig = getattr(config, spec.section)
            self._slots[kind] = RuntimeSlot(
                kind,
                clock=reactor,
                launcher=launcher,
                argv_for=_argv_for(spec, binary),
                probe=_probe_for(spec, http, probe_timeout_s),
                port_allocator=port_allocator,
                on_load=on_load,
                name=spec.process_name,
                env=env,
                load_timeout_s=load_timeout_s,
                stop_grace_s=stop_grace_s,
            )

    def slot(self, kind: RuntimeKind) -> RuntimeSlot:
        return self._slots[kind]

    def acquire(self, kind: RuntimeKind, model: ModelConfig) -> Deferred[RuntimeLease]:
        """A lease on the ``kind`` backend holding ``model`` (loading it if needed).
        Fails with :class:`LoadFailed`; cancel the Deferred to stop waiting."""
        if not model.capabilities.serves(kind):
            return fail(LoadFailed(f"model {model.local_id!r} does not serve {kind}"))
        return self._slots[kind].acquire(model)

    def load(self, model: ModelConfig, kind: RuntimeKind | None = None) -> Deferred[None]:
        """Load ``model`` into the ``kind`` runtime, or (``kind=None``) into every
        runtime it serves, side by side.  Fails with the first :class:`LoadFailed`."""
        kinds = [kind] if kind is not None else [k for k in RUNTIME_KINDS if model.capabilities.serves(k)]
        if not kinds:
            return fail(LoadFailed(f"model {model.local_id!r} serves no runtime"))
        for k in kinds:
            if not model.capabilities.serves(k):
                return fail(LoadFailed(f"model {model.local_id!r} does not serve {k}"))
        loads = [self._slots[k].load(model) for k in kinds]
        return gatherResults(loads, consumeErrors=True).addCallbacks(lambda _: None, _first_error)

    def unload(self, target: UnloadTarget | str = "all") -> Deferred[None]:
        """Drain and stop ``text``, ``image``, ``stt`` or ``all`` runtimes
        (``embeddings`` and ``voice``/``transcription`` name the text and stt ones)."""
        kinds = _TARGET_ALIASES.get(target)
        if kinds is None:
            return fail(ValueError(f"unknown unload target {target!r}"))
        return _all_done(self._slots[k].unload() for k in kinds)

    def status(self) -> list[SlotStatus]:
        return [self._slots[k].status() for k in RUNTIME_KINDS]

    def ready(self, kind: RuntimeKind, model: ModelConfig) -> bool:
        """Lane readiness for routing: can a ``kind`` request for ``model`` be
        served here?  True when the model serves ``kind`` and the slot is not
        closed: ready with that config, or able to get it (empty, failed, dead,
        loading or switching — the request loads or queues).  A native process
        that dies is noticed at once, so there is no liveness probe to consult;
        a failed load does not make the lane unready (the next request retries)."""
        return model.capabilities.serves(kind) and not self._slots[kind].closed

    def loaded_config(self, kind: RuntimeKind) -> str | None:
        """File name of the config the ``kind`` runtime is ready with, else ``None``."""
        config = self._slots[kind].loaded_config()
        return config.filename if config is not None else None

    def stop(self) -> Deferred[None]:
        """Service shutdown: stop every process now; fires when all are gone."""
        return _all_done(slot.close() for slot in self._slots.values())


def _argv_for(spec: RuntimeSpec, binary: BinaryConfig) -> Callable[[ModelConfig, int], list[str]]:
    setting = f"{spec.section}.binary_path"

    def build(model: ModelConfig, port: int) -> list[str]:
        # Resolved at every load, so a binary installed after start-up is found.
        return spec.argv(resolve_command(binary.command, setting), binary.extra_args, model, port)

    return build


def _probe_for(spec: RuntimeSpec, http: HTTPGetter, timeout: float) -> Callable[[str], Deferred[bool]]:
    def probe(base_url: str) -> Deferred[bool]:
        return spec.probe(http, base_url, timeout)

    return probe


def _first_error(failure: Failure) -> Failure:
    if isinstance(failure.value, FirstError):
        inner: Failure = failure.value.subFailure
        return inner
    return failure


def _all_done(ds: Iterable[Deferred[None]]) -> Deferred[None]:
    return gatherResults(list(ds), consumeErrors=True).addCallbacks(lambda _: None, _first_error)
