"""The node's backend runtimes: every registered family's slots, the node's own family first, and
the rule that one family runs at a time (one GPU)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Literal, TypeVar, cast

from twisted.internet.defer import Deferred, FirstError, fail, gatherResults
from twisted.logger import Logger
from twisted.python.failure import Failure

from routerd.backends.errors import BackendMissing, LoadFailed, RuntimeClosed
from routerd.backends.families import Family, FamilyWorld, plugins, slot_factory
from routerd.backends.kv_slots import SlotKeeper
from routerd.backends.process import (
    ProcessLauncher,
    ReactorProcessLauncher,
    Scheduler,
    SpawningReactor,
    free_port,
)
from routerd.backends.readiness import PROBE_TIMEOUT_S, HTTPGetter
from routerd.backends.slot import LoadEvent, RuntimeLease, RuntimeSlot, SlotStatus
from routerd.backends.slot_load import SlotProcess
from routerd.backends.slot_state import LOAD_TIMEOUT_S, STOP_GRACE_S
from routerd.catalog.model import RUNTIME_KINDS, ModelConfig, RuntimeKind
from routerd.config.schema import Config
from routerd.lanes import LANES, Lane

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
_T = TypeVar("_T")
log = Logger()

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
    """The node's backend runtimes, per registered family (:mod:`routerd.backends.families`).

    Each model runs in the family its ``backend_mode`` names (the node's ``backend.mode``
    unless its ``.kcpps`` overrides it).  No process runs until a request or an explicit load
    needs it (except KoboldCpp with ``kobold.no_model``, started by :meth:`boot`).
    ``launcher`` defaults to ``reactor.spawnProcess``, ``port_allocator`` to a free loopback
    port per load; ``env`` (default: the router's own) is every backend's environment.

    Lane readiness for routing (:meth:`ready`) reads the last lane probes
    (:meth:`refresh_readiness`, run on an interval by the node).
    """

    #: Per-probe timeout of the lane readiness probes (a hung backend is "not ready" after it).
    lane_probe_timeout_s = 2.0

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
        kv_slots: SlotKeeper | None = None,
    ) -> None:
        if launcher is None:
            launcher = ReactorProcessLauncher(cast(SpawningReactor, reactor))
        if port_allocator is None:
            port_allocator = free_port
        self._clock = reactor
        self._http = http
        make = slot_factory(reactor, launcher, http, port_allocator, on_load, env, probe_timeout_s,
                            load_timeout_s=load_timeout_s, stop_grace_s=stop_grace_s)
        self.default_mode = config.backend.mode
        world = FamilyWorld(reactor, http, probe_timeout_s, kv_slots)
        self._families: dict[str, Family] = {
            mode: plugin.build(config, make, world) for mode, plugin in plugins().items()}
        # Worked out once (a family's slots are built with it and never change) instead of per
        # request (benchmarks/trees.py --profile at one client: 45 calls a request to acquire a
        # slot and name the loaded config before, 13 after).  Per mode: its family and every
        # other family's slots, which one family's request must find idle.
        self._homes: dict[str, tuple[Family, tuple[RuntimeSlot, ...]]] = {
            mode: (family, tuple(s for other in self._families.values() if other is not family
                                 for s in other.slots()))
            for mode, family in self._families.items()}
        # The occupied slots (``occupied()``), updated when a slot's state or process changes
        # instead of asked of every other family's slot per request (ops.py: 4 calls and about
        # 230 opcodes a request at one client before, one set lookup after).
        self._occupied: set[SlotProcess] = set()
        for family in self._families.values():
            for slot in family.slots():
                slot.watch(self._slot_changed)
                self._slot_changed(slot)
        # Per kind: the slots an unload of it stops, the node's own family's first.
        own = self._families.get(self.default_mode)
        ordered = ([own] if own is not None else []) + [f for f in self._families.values() if f is not own]
        self._kind_slots: dict[RuntimeKind, tuple[tuple[Family, RuntimeSlot], ...]] = {
            kind: tuple((family, slot) for family in ordered for slot in family.slots_for_kind(kind))
            for kind in RUNTIME_KINDS}
        # (slot name, kind) -> (config filename, slot state since, ready)
        self._lanes: dict[tuple[str, RuntimeKind], tuple[str, float, bool]] = {}
        # lanes_sharing's answers: asked on every queued arrival (benchmarks/trees.py --profile:
        # 13 calls a request to work it out).  The answer depends only on the key (the model
        # value itself, so a reloaded config is a new key) and on the families' slots, which
        # are built once with this object: nothing ever makes an entry stale.
        self._sharing: dict[tuple[RuntimeKind | None, ModelConfig], tuple[Lane, ...]] = {}

    def family(self, model: ModelConfig | None = None) -> Family:
        """The family ``model`` runs in (the node's own without a model)."""
        return self._home(model.backend_mode if model is not None else self.default_mode)[0]

    def _home(self, mode: str) -> tuple[Family, tuple[RuntimeSlot, ...]]:
        """The ``mode`` family (the node's own for a mode no family has) and every other family's
        slots."""
        return self._homes.get(mode) or self._homes[self.default_mode]

    def slot(self, kind: RuntimeKind) -> RuntimeSlot:
        """The node's own family's slot for ``kind``."""
        slots = self.family().slots_for_kind(kind)
        if not slots:
            raise KeyError(f"the {self.default_mode} family has no {kind} runtime")
        return slots[0]

    def _slot_for(self, kind: RuntimeKind, model: ModelConfig) -> RuntimeSlot | None:
        return self.family(model).slot_for(kind, model)

    def serves(self, kind: RuntimeKind, model: ModelConfig) -> bool:
        return self._slot_for(kind, model) is not None

    def lanes_sharing(self, kind: RuntimeKind | None, model: ModelConfig) -> tuple[Lane, ...]:
        """The lending lanes whose work runs in the runtime ``model`` takes for ``kind`` (every kind
        it serves for None): its own lane, and with KoboldCpp's one process every lane."""
        key = (kind, model)
        known = self._sharing.get(key)
        if known is None:
            if len(self._sharing) >= 1024:  # configs replaced by reloads are never asked again
                self._sharing.clear()
            known = self._sharing[key] = self._lanes_sharing(kind, model)
        return known

    def _lanes_sharing(self, kind: RuntimeKind | None, model: ModelConfig) -> tuple[Lane, ...]:
        kinds = [kind] if kind is not None else [k for k in RUNTIME_KINDS if self.serves(k, model)]
        taken = [slot for k in kinds if (slot := self._slot_for(k, model)) is not None]
        family = self.family(model)
        return tuple(lane for lane in LANES if any(s in taken for s in family.slots_for_kind(lane)))

    def acquire(self, kind: RuntimeKind, model: ModelConfig, *,
                yields: bool = False) -> Deferred[RuntimeLease]:
        """A lease on the ``kind`` backend holding ``model`` (loading it if needed).
        Fails with :class:`LoadFailed`; cancel the Deferred to stop waiting (``yields``: borrowed
        work, whose giving up stops a load begun only for it: ``RuntimeSlot.acquire``)."""
        family, others = self._home(model.backend_mode)
        slot = family.slot_for(kind, model)
        if slot is None:
            return fail(LoadFailed(f"model {model.local_id!r} does not serve {kind}"))
        if not self._occupied.isdisjoint(others):  # one GPU: the other family stops first
            return Deferred.fromCoroutine(self._switch_family_then(
                model, lambda: slot.acquire(model, yields=yields)))
        return slot.acquire(model, yields=yields)

    def _slot_changed(self, slot: SlotProcess) -> None:
        if slot.occupied():
            self._occupied.add(slot)
        else:
            self._occupied.discard(slot)

    def _others_running(self, model: ModelConfig) -> list[RuntimeSlot]:
        """Slots of families other than ``model``'s that run a process or hold a config."""
        return [s for s in self._home(model.backend_mode)[1] if s.occupied()]

    async def _switch_family_then(self, model: ModelConfig, then: Callable[[], Deferred[_T]]) -> _T:
        """One GPU, one family: stop every other family's process (after its users drain;
        KoboldCpp is not restarted without a model), then ``then()``."""
        others = self._others_running(model)
        log.info("switching backend family to {family} for {model}: stopping {slots}",
                 family=self.family(model).name, model=model.local_id, slots=[s.name for s in others])
        await _all_done(s.unload(idle_after=False) for s in others)
        return await then()

    def lease_current(self, kind: RuntimeKind) -> RuntimeLease | None:
        """A lease on the node's own family's running ``kind`` backend, whatever it holds, loading
        nothing (selector-less embeddings with nothing loaded, reference §6.7); ``None`` when
        none runs."""
        for slot in self.family().slots_for_kind(kind):
            if not slot.closed:
                lease = slot.lease_current()
                if lease is not None:
                    return lease
        return None

    def load(self, model: ModelConfig, kind: RuntimeKind | None = None) -> Deferred[None]:
        """Load ``model`` into the ``kind`` runtime, or (``kind=None``) into every
        runtime it serves, side by side.  Fails with the first :class:`LoadFailed`."""
        kinds = [kind] if kind is not None else [k for k in RUNTIME_KINDS if self.serves(k, model)]
        if not kinds:
            return fail(LoadFailed(f"model {model.local_id!r} serves no runtime"))
        slots: list[RuntimeSlot] = []
        for k in kinds:
            slot = self._slot_for(k, model)
            if slot is None:
                return fail(LoadFailed(f"model {model.local_id!r} does not serve {k}"))
            if slot not in slots:
                slots.append(slot)
        def start() -> Deferred[None]:
            loads = [s.load(model) for s in slots]
            return gatherResults(loads, consumeErrors=True).addCallbacks(lambda _: None, _first_error)

        if not self._others_running(model):
            return start()
        return Deferred.fromCoroutine(self._switch_family_then(model, start))

    def unload(self, target: UnloadTarget | str = "all") -> Deferred[None]:
        """Drain and stop ``text``, ``image``, ``stt`` or ``all`` runtimes
        (``embeddings`` and ``voice``/``transcription`` name the text and stt ones), in every
        family; KoboldCpp restarts without a model."""
        kinds = _TARGET_ALIASES.get(target)
        if kinds is None:
            return fail(ValueError(f"unknown unload target {target!r}"))
        slots: list[RuntimeSlot] = []
        for family in self._families.values():
            for kind in kinds:
                for slot in family.slots_for_kind(kind):
                    if slot not in slots:
                        slots.append(slot)
        return _all_done(s.unload() for s in slots)

    def _all_slots(self) -> list[RuntimeSlot]:
        own = self.family()
        out = list(own.slots())
        for family in self._families.values():
            if family is not own:
                out += [s for s in family.slots() if s.state.value != "empty" or s.status().pid is not None]
        return out

    def slots(self) -> list[RuntimeSlot]:
        """The node's own family's slots, and any other family's that holds or runs something."""
        return self._all_slots()

    def places(self, slot: RuntimeSlot, model: ModelConfig) -> bool:
        """Whether ``slot`` is where ``model`` runs (for one of the runtime kinds it serves)."""
        return any(self._slot_for(kind, model) is slot for kind in RUNTIME_KINDS)

    def status(self) -> list[SlotStatus]:
        """The node's own family's slots, and any other family's that holds or runs something."""
        return [s.status() for s in self._all_slots()]

    def ready(self, kind: RuntimeKind, model: ModelConfig) -> bool:
        """Lane readiness for routing (cluster spec "Registration and health", reference §4.3):
        can a ``kind`` request for ``model`` be served here now?

        False when the model's family cannot serve ``kind`` or the slot is closed.  A slot that
        holds no config or has requests queued is ready (the request loads or queues; a failed
        load does not make the lane unready, the next request retries).  A slot that holds a
        config is ready when the last lane probe said so: the probe of the ``kind`` lane when it
        holds ``model``, else its liveness (a switch would follow).
        """
        slot = self._slot_for(kind, model)
        if slot is None or slot.closed:
            return False
        held = slot.loaded_config()
        status = slot.status()
        if held is None or status.waiters:
            return True
        lane: RuntimeKind = kind if held.filename == model.filename else slot.kind
        cached = self._lanes.get((slot.name, lane))
        if cached is None or cached[0] != held.filename or cached[1] != status.since:
            return True  # not probed since this load finished: its readiness probe just passed
        return cached[2]

    def refresh_readiness(self) -> Deferred[None]:
        """Probe every lane of every ready slot once (``GET /v1/models``, ``/sdapi/v1/sd-models``,
        ``/api/extra/version`` capabilities, ``/health`` as the family and lane need)."""
        return Deferred.fromCoroutine(self._refresh())

    async def _refresh(self) -> None:
        probes: list[tuple[tuple[str, RuntimeKind], str, float, Deferred[bool]]] = []
        for family in self._families.values():
            for slot in family.slots():
                held = slot.loaded_config()
                status = slot.status()
                if held is None or status.port is None:
                    continue
                base = f"http://127.0.0.1:{status.port}"
                for kind in RUNTIME_KINDS:
                    if family.slot_for(kind, held) is slot:
                        probe = family.lane_probe(kind, held)
                        probes.append(((slot.name, kind), held.filename, status.since,
                                       probe(self._http, base, self.lane_probe_timeout_s)))
        for key, filename, since, probing in probes:
            try:
                ok = bool(await probing)
            except Exception:
                ok = False
            self._lanes[key] = (filename, since, ok)

    def loaded_config(self, kind: RuntimeKind) -> str | None:
        """File name of the config a ``kind`` runtime is ready with (the node's own family
        first), else ``None``."""
        for family, slot in self._kind_slots[kind]:
            config = slot.loaded_config()
            if config is not None and family.slot_for(kind, config) is slot:
                return config.filename
        return None

    def held_config(self, kind: RuntimeKind) -> ModelConfig | None:
        """The config a ``kind`` runtime is ready with or loading (the node's own family first),
        else ``None``: what the next request it takes runs without a switch."""
        for family, slot in self._kind_slots[kind]:
            config = slot.held_config()
            if config is not None and family.slot_for(kind, config) is slot:
                return config
        return None

    def watch(self, changed: Callable[[], None]) -> None:
        """Call ``changed()`` after every change of any runtime's state or process."""
        for family in self._families.values():
            for slot in family.slots():
                slot.watch(lambda _slot: changed())

    def boot(self) -> None:
        """Start what runs from router start (KoboldCpp in no-model mode with ``kobold.no_model``)."""
        self.family().boot()

    def stop(self) -> Deferred[None]:
        """Service shutdown: stop every process now; fires when all are gone."""
        slots = [s for f in self._families.values() for s in f.slots()]
        return _all_done(slot.close() for slot in slots)


def _first_error(failure: Failure) -> Failure:
    if isinstance(failure.value, FirstError):
        inner: Failure = failure.value.subFailure
        return inner
    return failure


def _all_done(ds: Iterable[Deferred[None]]) -> Deferred[None]:
    return gatherResults(list(ds), consumeErrors=True).addCallbacks(lambda _: None, _first_error)
