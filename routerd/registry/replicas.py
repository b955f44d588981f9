"""Replica choice and reservation (cluster reference §6.3).

A *replica* is one non-disabled record that serves a public ID on a lane.  For each request:

1. the first **local** replica that is available, whose lane is ready (``local_ready``) and whose
   busy count is 0;
2. else the **available remote** replicas, round-robin (one counter per public ID; per public
   image ID on the image lane), taken modulo the current remote count; remote busy counts are not
   considered;
3. else a **local** replica that is available and ready even though it is busy;
4. else :class:`NoReplica` (502).

The chosen replica is reserved (``busy[node:local:lane] += 1``, with the request's predicted
seconds when ``routing.replica_choice`` priced it) before anything loads or is forwarded;
:meth:`Reservation.release` gives it back exactly once.

That is the default mode, ``rotation``; ``least_loaded`` and ``affinity`` choose among
:func:`usable_replicas` instead (:mod:`routerd.registry.replica_choice`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from routerd.catalog.model import RuntimeKind
from routerd.counts import count_down
from routerd.errors import StatusError
from routerd.wire.records import ModelRecord

__all__ = [
    "BusyCounts",
    "LocalReady",
    "NoReplica",
    "Reservation",
    "RoundRobin",
    "busy_key",
    "choose_replica",
    "fits_context",
    "replica_order",
    "usable_replicas",
]

# Whether the local runtime for ``kind`` can take a request for ``record`` now (it is live, or
# it will load/switch).  Injected; remote records are judged by node health instead.
LocalReady = Callable[[RuntimeKind, ModelRecord], bool]


class NoReplica(StatusError):
    """No replica can serve the request: 502 ``backend_error``."""

    def __init__(self, public_id: str, lane: RuntimeKind) -> None:
        what = "image model" if lane == "image" else "model"
        reason = f'{what} "{public_id}" has no available replicas'
        super().__init__(502, reason, "backend_error", "backend_error")
        self.public_id = public_id
        self.lane = lane


def busy_key(record: ModelRecord, lane: RuntimeKind) -> str:
    return f"{record.node_id}:{record.local_id}:{lane}"


def replica_order(record: ModelRecord) -> str:
    return f"{record.node_id}:{record.local_id}"


def fits_context(context: int, needed: int) -> bool:
    """Whether a model with ``context`` tokens (0 = unstated) can take ``needed`` (0 = unsized).

    A stated window fits anything up to its size; an unstated one fits only an unsized request.
    """
    if needed <= 0:
        return True
    return context > 0 and needed <= context


@attrs.define
class BusyCounts:
    """In-flight requests per ``node:local:lane``, and the predicted seconds of those priced."""

    _counts: dict[str, int] = attrs.field(factory=dict)
    _seconds: dict[str, float] = attrs.field(factory=dict)

    def count(self, record: ModelRecord, lane: RuntimeKind) -> int:
        return self._counts.get(busy_key(record, lane), 0)

    def seconds(self, record: ModelRecord, lane: RuntimeKind) -> float:
        """The predicted seconds of the reserved requests on ``record`` that were priced."""
        return self._seconds.get(busy_key(record, lane), 0.0)

    def reserve(self, record: ModelRecord, lane: RuntimeKind, *, local: bool,
                seconds: float = 0.0) -> Reservation:
        key = busy_key(record, lane)
        self._counts[key] = self._counts.get(key, 0) + 1
        if seconds > 0:
            self._seconds[key] = self._seconds.get(key, 0.0) + seconds
        return Reservation(record=record, lane=lane, local=local, counts=self, seconds=max(0.0, seconds))

    def _release(self, key: str, seconds: float) -> None:
        count_down(self._counts, key)
        if seconds > 0 and key in self._seconds:
            left = self._seconds[key] - seconds
            if key not in self._counts or left <= 1e-9:
                del self._seconds[key]
            else:
                self._seconds[key] = left

    def snapshot(self) -> dict[str, int]:
        return dict(self._counts)

    def seconds_snapshot(self) -> dict[str, float]:
        """The reserved predicted seconds per ``node:local:lane`` (the priced ones only)."""
        return dict(self._seconds)


@attrs.define(eq=False)
class Reservation:
    """One reserved replica; :meth:`release` is idempotent."""

    record: ModelRecord
    lane: RuntimeKind
    local: bool
    counts: BusyCounts = attrs.field(repr=False)
    seconds: float = 0.0
    released: bool = False

    @property
    def key(self) -> str:
        return busy_key(self.record, self.lane)

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self.counts._release(self.key, self.seconds)


@attrs.define
class RoundRobin:
    """One rotation counter per key."""

    _counters: dict[str, int] = attrs.field(factory=dict)

    def take(self, key: str) -> int:
        value = self._counters.get(key, 0)
        self._counters[key] = value + 1
        return value


def choose_replica(
    replicas: Sequence[ModelRecord],
    *,
    name: str,
    lane: RuntimeKind,
    own_node_id: str,
    busy: BusyCounts,
    local_ready: LocalReady,
    rotation: RoundRobin,
) -> ModelRecord:
    """The replica a request for ``name`` on ``lane`` goes to (not yet reserved).

    ``replicas`` are the candidates already filtered to ``name`` and ``lane``; disabled and
    unavailable ones are skipped here.  Raises :class:`NoReplica`.
    """
    ordered = sorted((r for r in replicas if not r.disabled), key=replica_order)
    local = [r for r in ordered if r.node_id == own_node_id and _usable(r, lane, own_node_id, local_ready)]
    for record in local:
        if busy.count(record, lane) == 0:
            return record
    remote = [r for r in ordered if r.node_id != own_node_id and _usable(r, lane, own_node_id, local_ready)]
    if remote:
        return remote[rotation.take(f"{lane}:{name}") % len(remote)]
    if local:
        return local[0]
    raise NoReplica(name, lane)


def _usable(record: ModelRecord, lane: RuntimeKind, own_node_id: str, local_ready: LocalReady) -> bool:
    """Whether a replica may take a request now: enabled and available, and, on this node, its
    lane ready (remote replicas are judged by node health, which ``available`` carries)."""
    if record.disabled or not record.available:
        return False
    return record.node_id != own_node_id or local_ready(lane, record)


def usable_replicas(replicas: Sequence[ModelRecord], *, lane: RuntimeKind, own_node_id: str,
                    local_ready: LocalReady) -> list[ModelRecord]:
    """The replicas that may take a request now, local and remote alike, by :func:`replica_order`
    (what ``least_loaded`` and ``affinity`` choose among)."""
    return sorted((r for r in replicas if _usable(r, lane, own_node_id, local_ready)), key=replica_order)
