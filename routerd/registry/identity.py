"""Public model IDs across the cluster (cluster spec "Model identity"; reference §5.1).

Records are grouped by ``local_id`` (the *base* ID).  Within a base, records with the same
*identity* (``model_hash + ":" + config_hash``) are one public model with several replicas;
different identities get different public IDs:

* the master's own (local) identity always owns the bare base ID;
* every other identity keeps the public ID it was given before, read from the
  :class:`PublicIdStore`, so a suffix never moves when nodes leave and come back;
* an identity seen for the first time gets the bare base ID when nobody holds it (no local
  identity, nothing persisted), else the smallest free ``<base>-k`` (k >= 2) that no other
  identity holds in the store and that is not a real ``local_id`` of any record;
* a persisted ID that a local identity now needs (the master gained a config with that name)
  is replaced by a fresh suffix.

A record whose ``model_hash`` is still empty (its node has not hashed the weights yet) is
*provisional*: it gets an ID by the same rules, but nothing is persisted for it, so the hashed
identity it turns into later is not pushed onto a suffix by its own earlier self.

Every ID handed to a remote identity is written to the store (``assign`` is an upsert keyed by
``(identity, base)``).  The local identity's bare ID is written only when remote replicas share
that identity (so they keep it if the master's own copy goes away); otherwise it is implicit, and
a stale master config leaves no row behind.  The public image ID follows the public ID (reference
§5.1 step 5).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import attrs

from routerd.wire.records import ModelRecord

__all__ = [
    "MemoryPublicIdStore",
    "PublicIdStore",
    "PublicIdTaken",
    "assign_public_ids",
    "public_image_id",
]


class PublicIdTaken(ValueError):
    """``assign`` was asked to give one public ID to a second (identity, base)."""


class PublicIdStore(Protocol):
    """Persisted ``(identity, base) -> public_id`` assignments; ``public_id`` is unique.

    Backed in production by the ``public_ids(identity, base_id, public_id UNIQUE, assigned_at)``
    table.  Calls are synchronous: back it with rows loaded at start-up and write through.
    """

    def get(self, identity: str, base: str) -> str | None:
        """The public ID stored for ``identity`` under ``base``, if any."""

    def holder(self, public_id: str) -> tuple[str, str] | None:
        """The ``(identity, base)`` that holds ``public_id``, if any."""

    def assign(self, identity: str, base: str, public_id: str) -> None:
        """Store (or replace) the public ID of ``(identity, base)``.

        Raises :class:`PublicIdTaken` if another ``(identity, base)`` holds ``public_id``.
        """


@attrs.define
class MemoryPublicIdStore:
    """An in-memory :class:`PublicIdStore`.

    ``rows`` seeds it with ``(identity, base, public_id)`` triples (e.g. loaded from SQLite);
    ``on_assign`` is called with every new or changed row (e.g. to write it through).
    """

    rows: Iterable[tuple[str, str, str]] = ()
    on_assign: Callable[[str, str, str], None] | None = None
    _by_key: dict[tuple[str, str], str] = attrs.field(init=False, factory=dict)
    _by_id: dict[str, tuple[str, str]] = attrs.field(init=False, factory=dict)

    def __attrs_post_init__(self) -> None:
        for identity, base, public_id in self.rows:
            self._put(identity, base, public_id)
        self.rows = ()

    def seed(self, rows: Iterable[tuple[str, str, str]]) -> None:
        """Load persisted rows (no write-through): used once the database is open."""
        for identity, base, public_id in rows:
            self._put(identity, base, public_id)

    def get(self, identity: str, base: str) -> str | None:
        return self._by_key.get((identity, base))

    def holder(self, public_id: str) -> tuple[str, str] | None:
        return self._by_id.get(public_id)

    def assign(self, identity: str, base: str, public_id: str) -> None:
        if self._by_key.get((identity, base)) == public_id:
            return
        self._put(identity, base, public_id)
        if self.on_assign is not None:
            self.on_assign(identity, base, public_id)

    def _put(self, identity: str, base: str, public_id: str) -> None:
        key = (identity, base)
        current = self._by_id.get(public_id)
        if current is not None and current != key:
            raise PublicIdTaken(f"public ID {public_id!r} is already held by {current!r}")
        old = self._by_key.get(key)
        if old is not None:
            del self._by_id[old]
        self._by_key[key] = public_id
        self._by_id[public_id] = key

    def items(self) -> list[tuple[str, str, str]]:
        """Every stored ``(identity, base, public_id)``, sorted."""
        return sorted((i, b, p) for (i, b), p in self._by_key.items())


def public_image_id(local_id: str, public_id: str, image_id: str | None) -> str | None:
    """The image ID clients see for a record whose public ID is ``public_id``.

    ``same-dream`` of ``same`` becomes ``same-2-dream`` under ``same-2``; an image ID that does not
    start with the local ID stays as it is under the bare ID and is prefixed otherwise.
    """
    if not image_id:
        return None
    if image_id.startswith(local_id + "-"):
        return public_id + image_id[len(local_id):]
    if public_id == local_id:
        return image_id
    return f"{public_id}-{image_id}"


def _provisional(identity: str) -> bool:
    # A record whose weights are not hashed yet (``model_hash`` empty) will change identity
    # once they are; its ID is computed by the same rules but never persisted.
    return identity.startswith(":")


def _order(record: ModelRecord, own_node_id: str) -> tuple[int, str]:
    local = record.node_id == own_node_id
    return (0 if local else 2, f"{record.node_id}:{record.local_id}")


_Group = tuple[str, str]  # (identity, base)


@attrs.define
class _Allocator:
    store: PublicIdStore
    reserved: frozenset[str]  # real local IDs of the present records
    given: dict[str, _Group] = attrs.field(factory=dict)  # public ID -> group, this pass

    def free(self, public_id: str, group: _Group) -> bool:
        owner = self.given.get(public_id)
        if owner is not None:
            return owner == group
        holder = self.store.holder(public_id)
        return holder is None or holder == group

    def fresh_suffix(self, group: _Group) -> str:
        base = group[1]
        k = 2
        while True:
            candidate = f"{base}-{k}"
            if candidate not in self.reserved and self.free(candidate, group):
                return candidate
            k += 1

    def give(self, group: _Group, public_id: str, *, persist: bool = True) -> str:
        self.given[public_id] = group
        if persist and not _provisional(group[0]):
            holder = self.store.holder(public_id)
            if holder is not None and holder != group:
                # Only a local identity claims an ID persisted for someone else: move them on.
                self.store.assign(holder[0], holder[1], self.fresh_suffix(holder))
            self.store.assign(group[0], group[1], public_id)
        return public_id


def assign_public_ids(records: Sequence[ModelRecord], own_node_id: str,
                      store: PublicIdStore) -> list[ModelRecord]:
    """``records`` with ``public_id`` and ``public_image_id`` set, in the same order.

    Records on ``own_node_id`` are the master's own.  New assignments are written to ``store``.
    """
    bases: dict[str, list[ModelRecord]] = {}
    for record in records:
        bases.setdefault(record.local_id, []).append(record)
    alloc = _Allocator(store, frozenset(bases))
    chosen: dict[_Group, str] = {}
    # First the master's own identities: each owns its bare base ID.  It is persisted only when
    # remote replicas share it, so they keep the ID if the master's copy goes away.
    local_identity: dict[str, str] = {}
    for base in sorted(bases):
        for record in bases[base]:
            if record.node_id == own_node_id and base not in local_identity:
                local_identity[base] = record.identity
                shared = any(r.node_id != own_node_id and r.identity == record.identity
                             for r in bases[base])
                chosen[(record.identity, base)] = alloc.give((record.identity, base), base,
                                                             persist=shared)
    for base in sorted(bases):
        groups: list[_Group] = []
        for record in sorted(bases[base], key=lambda r: _order(r, own_node_id)):
            group = (record.identity, base)
            if group not in groups and group not in chosen:
                groups.append(group)
        pending: list[_Group] = []
        for group in groups:
            stored = store.get(*group)
            if stored is not None and alloc.free(stored, group):
                chosen[group] = alloc.give(group, stored)
            else:
                pending.append(group)
        for group in pending:
            public_id = base if alloc.free(base, group) else alloc.fresh_suffix(group)
            chosen[group] = alloc.give(group, public_id)
    out = []
    for record in records:
        public_id = chosen[(record.identity, record.local_id)]
        out.append(attrs.evolve(record, public_id=public_id,
                                public_image_id=public_image_id(record.local_id, public_id,
                                                                record.image_id)))
    return out
