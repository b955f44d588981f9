"""The master's merged model registry (cluster spec "Registration and health", "Model identity").

A pure object: it is fed the master's own records (:meth:`Registry.update_local`), node snapshots
(:meth:`Registry.update_node`, from registration or polling) and health results
(:meth:`Registry.mark_unhealthy` / :meth:`Registry.mark_healthy`), and answers listings, replica
sets and reservations.  Nodes are never forgotten: the records of an unhealthy node stay listed
in :meth:`Registry.records` with ``available=False`` until a poll or registration succeeds.

Every change bumps :attr:`Registry.revision`; a refused snapshot changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import attrs

from routerd.catalog.model import RuntimeKind
from routerd.registry.identity import PublicIdStore, assign_public_ids
from routerd.registry.records import (
    DuplicateNode,
    IncompatibleProtocol,
    InvalidNode,
    NodeEntry,
    NodeInfo,
)
from routerd.registry.replicas import (
    BusyCounts,
    LocalReady,
    NoReplica,
    Reservation,
    RoundRobin,
    choose_replica,
    fits_context,
    replica_order,
    usable_replicas,
)
from routerd.urls import URLError, normalise_url
from routerd.wire.records import MINIMUM_PROTOCOL_VERSION, ModelRecord, Snapshot

__all__ = ["Registry"]


def _always_ready(_kind: RuntimeKind, _record: ModelRecord) -> bool:
    return True


def _try_normalise(url: str) -> str | None:
    try:
        return normalise_url(url)
    except URLError:
        return None


class Registry:
    """Local and remote model records with cluster-wide public IDs.

    ``own_url`` may be empty (a master needs no ``public_url``).  ``local_ready(kind, record)``
    says whether a local record's runtime lane can take a request now; it defaults to always.
    """

    def __init__(self, own_node_id: str, own_url: str, public_ids: PublicIdStore, *,
                 local_ready: LocalReady | None = None) -> None:
        self.own_node_id = own_node_id.strip()
        stripped = own_url.strip()
        self.own_url = (_try_normalise(stripped) or stripped) if stripped else ""
        self._public_ids = public_ids
        self._local_ready: LocalReady = local_ready or _always_ready
        self._local: tuple[ModelRecord, ...] = ()
        self._nodes: dict[str, NodeEntry] = {}
        self._by_url: dict[str, str] = {}
        self._records: list[ModelRecord] = []
        #: Records by public ID and by public image ID, in ``_records`` order (rebuilt with it):
        #: a request looks up its model's replicas without scanning the cluster's records.
        self._by_name: dict[str, list[ModelRecord]] = {}
        self._busy = BusyCounts()
        self._rotation = RoundRobin()
        self._batching = 0
        self._dirty = False
        self.revision = 0

    # -- feeding ----------------------------------------------------------------

    def update_local(self, records: Iterable[ModelRecord]) -> None:
        """Replace the master's own records (node identity and source are set here)."""
        self._local = tuple(
            attrs.evolve(r, node_id=self.own_node_id, node_url=self.own_url, source="local")
            for r in records)
        self._changed()

    def update_node(self, snapshot: Snapshot, url: str) -> None:
        """Accept (or refresh) a remote node's snapshot, reached at ``url``.

        Raises :class:`InvalidNode` (no node_id, bad URL), :class:`IncompatibleProtocol`
        (``protocol_version`` missing or too old) or :class:`DuplicateNode` (the node_id is
        ours, the URL is ours, the node_id is known at another URL, or another node owns the
        URL).  The same node_id at the same normalised URL is a refresh.  On success the node
        is healthy again.
        """
        node_id = snapshot.node_id.strip()
        if not node_id:
            raise InvalidNode("node_id is required")
        if not url.strip():
            raise InvalidNode("node url is required")
        try:
            node_url = normalise_url(url)
        except URLError as exc:
            raise InvalidNode(f"node_url is invalid: {exc.reason}") from None
        if snapshot.protocol_version < MINIMUM_PROTOCOL_VERSION:
            raise IncompatibleProtocol(node_id, snapshot.build_version, snapshot.protocol_version)
        if node_id == self.own_node_id:
            raise DuplicateNode(f'node_id "{node_id}" is the master\'s own node_id')
        if self.own_url and node_url == self.own_url:
            raise DuplicateNode(f'node url "{node_url}" is the master\'s own URL')
        known = self._nodes.get(node_id)
        if known is not None and known.node_url != node_url:
            raise DuplicateNode(
                f'node "{node_id}" is already registered at {known.node_url}, not {node_url}')
        owner = self._by_url.get(node_url)
        if owner is not None and owner != node_id:
            raise DuplicateNode(f'node url "{node_url}" is already registered to node "{owner}"')
        snapshot = attrs.evolve(snapshot, node_id=node_id, node_url=node_url)
        if known is not None and known.healthy and known.snapshot == snapshot:
            # an unchanged refresh: public IDs and records stay as they are; only its telemetry (which
            # a snapshot's equality leaves out) is the newest, and that is no registry change
            known.snapshot = snapshot
            return
        if known is None:
            self._nodes[node_id] = NodeEntry(node_id, node_url, snapshot)
            self._by_url[node_url] = node_id
        else:
            known.snapshot = snapshot
            known.healthy = True
        self._changed()

    def mark_unhealthy(self, url: str) -> bool:
        """Mark the node at ``url`` unhealthy; ``False`` if no node is known there."""
        return self._set_health(url, False)

    def mark_healthy(self, url: str) -> bool:
        """Mark the node at ``url`` healthy; ``False`` if no node is known there."""
        return self._set_health(url, True)

    def _set_health(self, url: str, healthy: bool) -> bool:
        node_url = _try_normalise(url)
        node_id = self._by_url.get(node_url) if node_url else None
        if node_id is None:
            return False
        entry = self._nodes[node_id]
        if entry.healthy != healthy:
            entry.healthy = healthy
            self._changed()
        return True

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Apply the updates made inside as one change: records and public IDs are rebuilt once,
        on leaving (rebuilding is linear in the cluster's records, so a poll cycle that rebuilt per
        node was quadratic: 200 new slaves took ~0.5 s of CPU).  Models of different nodes that
        conflict for one public ID and first appear in the same batch are suffixed by node id,
        as they are within one rebuild."""
        self._batching += 1
        try:
            yield
        finally:
            self._batching -= 1
            if not self._batching and self._dirty:
                self._changed()

    def _changed(self) -> None:
        if self._batching:
            self._dirty = True
            return
        self._dirty = False
        merged: list[ModelRecord] = list(self._local)
        for node_id in sorted(self._nodes):
            entry = self._nodes[node_id]
            for record in entry.snapshot.models:
                merged.append(attrs.evolve(
                    record, node_id=entry.node_id, node_url=entry.node_url, source="slave",
                    available=record.available and entry.healthy))
        self._records = assign_public_ids(merged, self.own_node_id, self._public_ids)
        by_name: dict[str, list[ModelRecord]] = {}
        for record in self._records:
            by_name.setdefault(record.public_id, []).append(record)
            if record.public_image_id and record.public_image_id != record.public_id:
                by_name.setdefault(record.public_image_id, []).append(record)
        self._by_name = by_name
        self.revision += 1

    # -- nodes ------------------------------------------------------------------

    def nodes(self) -> list[NodeInfo]:
        """Every remote node ever accepted, sorted by node_id."""
        return [self._nodes[n].info() for n in sorted(self._nodes)]

    def node(self, node_id: str) -> NodeInfo | None:
        entry = self._nodes.get(node_id)
        return entry.info() if entry is not None else None

    def node_for_url(self, url: str) -> str | None:
        node_url = _try_normalise(url)
        return self._by_url.get(node_url) if node_url else None

    def node_urls(self) -> dict[str, str]:
        """``node_id -> node_url`` for this node and every known remote node."""
        out = {self.own_node_id: self.own_url}
        out.update({n: e.node_url for n, e in self._nodes.items()})
        return out

    # -- models -----------------------------------------------------------------

    def records(self) -> list[ModelRecord]:
        """Every record (local first, then nodes by node_id) with public IDs and availability."""
        return list(self._records)

    def named(self, name: str) -> list[ModelRecord]:
        """Records whose public ID or public image ID is ``name``, in :meth:`records` order."""
        return list(self._by_name.get(name, ()))

    def find(self, node_id: str, *, local_id: str | None = None,
             filename: str | None = None) -> ModelRecord | None:
        """The record of one config on one node, by local ID or by filename."""
        for record in self._records:
            if record.node_id != node_id:
                continue
            if local_id is not None and record.local_id != local_id:
                continue
            if filename is not None and record.filename != filename:
                continue
            return record
        return None

    def listing(self, kind: RuntimeKind | None = None) -> list[ModelRecord]:
        """One record per public ID, sorted by it: available, non-disabled records only.

        With ``kind="image"`` the key is the public image ID (records without one are left
        out); with another ``kind`` only records serving that runtime count.  The record shown
        is the first replica (local first, then by node and local ID), ``loaded`` if any
        replica is.
        """
        groups: dict[str, list[ModelRecord]] = {}
        for record in sorted(self._records, key=self._preference):
            if record.disabled or not record.available:
                continue
            if kind is not None and not record.capabilities.serves(kind):
                continue
            key = record.public_image_id if kind == "image" else record.public_id
            if not key:
                continue
            groups.setdefault(key, []).append(record)
        return [attrs.evolve(group[0], loaded=any(r.loaded for r in group))
                for _key, group in sorted(groups.items())]

    def _preference(self, record: ModelRecord) -> tuple[int, str]:
        return (0 if record.node_id == self.own_node_id else 1, replica_order(record))

    def replicas(self, public_id: str, lane: RuntimeKind, *, min_context: int = 0) -> list[ModelRecord]:
        """Non-disabled records named ``public_id`` that serve ``lane``, by node and local ID.

        On the image lane the name is matched against the public image ID first, then the
        public ID.  ``min_context`` > 0 keeps only records whose context window holds it.
        Unavailable records are included (the choice skips them).
        """
        serving = [r for r in self._by_name.get(public_id, ())
                   if not r.disabled and r.capabilities.serves(lane)
                   and fits_context(r.capabilities.context, min_context)]
        named: list[ModelRecord] = []
        if lane == "image":
            named = [r for r in serving if r.public_image_id == public_id]
        if not named:
            named = [r for r in serving if r.public_id == public_id]
        return sorted(named, key=replica_order)

    def pick(self, public_id: str, lane: RuntimeKind, *, min_context: int = 0) -> ModelRecord:
        """The replica a request naming ``public_id`` on ``lane`` goes to, not yet reserved (the
        rotation among remote replicas moves on).  Raises :class:`NoReplica` (502) when none is
        available."""
        return choose_replica(
            self.replicas(public_id, lane, min_context=min_context), name=public_id, lane=lane,
            own_node_id=self.own_node_id, busy=self._busy, local_ready=self._local_ready,
            rotation=self._rotation)

    def acquire(self, public_id: str, lane: RuntimeKind, *, min_context: int = 0) -> Reservation:
        """Choose (:meth:`pick`) and reserve a replica for a request naming ``public_id`` on ``lane``."""
        return self.reserve(self.pick(public_id, lane, min_context=min_context), lane)

    def usable(self, public_id: str, lane: RuntimeKind, *, min_context: int = 0) -> list[ModelRecord]:
        """The replicas of ``public_id`` on ``lane`` that may take a request now (local and remote
        alike), for a choice other than rotation."""
        return usable_replicas(self.replicas(public_id, lane, min_context=min_context), lane=lane,
                               own_node_id=self.own_node_id, local_ready=self._local_ready)

    def take_turn(self, key: str) -> int:
        """The next value of the rotation counter ``key`` (moves it on)."""
        return self._rotation.take(key)

    def reserve(self, record: ModelRecord, lane: RuntimeKind, *, seconds: float = 0.0) -> Reservation:
        """Reserve exactly ``record`` on ``lane`` (e.g. the STT scheduler's choice), with the
        request's predicted ``seconds`` when its choice priced it."""
        return self._busy.reserve(record, lane, local=record.node_id == self.own_node_id, seconds=seconds)

    def exact(self, node_id: str, filename: str, lane: RuntimeKind) -> ModelRecord:
        """The record of config ``filename`` on ``node_id``, not yet reserved; :class:`NoReplica` if
        it is unknown, disabled, unavailable, does not serve ``lane``, or is local and its lane is
        not ready."""
        record = self.find(node_id, filename=filename)
        if record is None or record.disabled or not record.available or \
                not record.capabilities.serves(lane) or \
                (record.node_id == self.own_node_id and not self._local_ready(lane, record)):
            raise NoReplica(f"{node_id}/{filename}", lane)
        return record

    def reserve_exact(self, node_id: str, filename: str, lane: RuntimeKind) -> Reservation:
        """Reserve exactly the record :meth:`exact` names."""
        return self.reserve(self.exact(node_id, filename, lane), lane)

    def busy(self, record: ModelRecord, lane: RuntimeKind) -> int:
        """How many reserved requests ``record`` has on ``lane``."""
        return self._busy.count(record, lane)

    def busy_seconds(self, record: ModelRecord, lane: RuntimeKind) -> float:
        """The predicted seconds of the priced requests reserved on ``record`` on ``lane``."""
        return self._busy.seconds(record, lane)

    def reserved_seconds(self) -> dict[str, float]:
        """Every replica's reserved predicted seconds, by :func:`busy_key` (a snapshot)."""
        return self._busy.seconds_snapshot()
