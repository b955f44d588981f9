"""Selector-less embeddings scheduling (reference cluster.md §6.7), the embeddings counterpart of
STT scheduling.

An embeddings request that names no model goes to a config that already holds its embeddings
model loaded, spreading requests round-robin over those: candidates are the records that are not
disabled, available, embeddings-capable and loaded; one per (node, backend mode, file, local ID),
preferring the record whose public ID is its local ID, then the smaller public ID; ordered by that
key.  The caller tries them from a global round-robin start with an exact reservation (a local
one also needs its lane ready) and skips stale ones; with none loaded it falls back to the
default model.  Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from routerd.wire.records import ModelRecord

__all__ = ["embeddings_candidates", "rotated"]


def _key(record: ModelRecord) -> tuple[str, str, str, str]:
    return (record.node_id, record.backend_mode, record.filename, record.local_id)


def embeddings_candidates(records: Iterable[ModelRecord], own_node_id: str,
                          local_loaded: Callable[[str], bool]) -> list[ModelRecord]:
    """The loaded embeddings configs, de-duplicated and in key order.  ``local_loaded(filename)``
    tells whether this node holds that config (a remote record's ``loaded`` is its own word)."""
    best: dict[tuple[str, str, str, str], ModelRecord] = {}
    for record in records:
        if record.disabled or not record.available or not record.capabilities.embeddings:
            continue
        loaded = local_loaded(record.filename) if record.node_id == own_node_id else record.loaded
        if not loaded:
            continue
        key = _key(record)
        held = best.get(key)
        if held is None or _preference(record) < _preference(held):
            best[key] = record
    return [best[key] for key in sorted(best)]


def _preference(record: ModelRecord) -> tuple[int, str]:
    return (0 if record.public_id == record.local_id else 1, record.public_id)


def rotated(candidates: Sequence[ModelRecord], start: int) -> list[ModelRecord]:
    """``candidates`` starting at ``start`` modulo their count."""
    if not candidates:
        return []
    first = start % len(candidates)
    return [*candidates[first:], *candidates[:first]]
