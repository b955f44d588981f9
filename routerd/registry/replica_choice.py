"""Replica choice beyond rotation (``routing.replica_choice``): pure functions of (key,
replicas' load, history).

Every candidate is one replica of the public ID a request names, with its *load*: the queued plus
running work it holds, in predicted seconds, and the predicted seconds of *this* request there
(``cost``).  Nothing here reads a clock, a socket or the registry.

``least_loaded``
    The candidate with the least load.  Candidates whose loads are equal (within
    :data:`TIE_TOLERANCE_S`) are tied, and the tie is broken by the rotation counter ``turn``
    (modulo the tied count, in the candidates' sorted order): never by list order alone, so equal
    replicas share the work instead of the first listed taking all of it.

``affinity`` (consistent hashing with bounded loads)
    A session key (its hash; the raw key never reaches this module) goes to the replica that served
    it last when that replica is still a candidate and within the load bound; otherwise to the first
    replica of the key's rendezvous order (highest random weight, :func:`rendezvous_order`) that is
    within the bound.  The bound: with ``L`` the candidates' total load and ``n`` their number, a
    replica may take the request when ``load + cost`` stays within ``c × (L + cost) / n`` (``c`` =
    ``routing.load_bound``, the mean counting this request) rounded up to a whole number of this
    request's cost: the ``⌈c·m/n⌉`` capacity of the integral algorithm (Mirrokni, Thorup and
    Zadimoghaddam), which it is exactly when every job costs the same, so one replica may hold one
    job more than the mean allows where the jobs do not divide evenly (an idle site's first request
    still goes to one replica of two).  The least loaded replica always qualifies, so a request is
    never refused.  A key whose replica was over the bound moves, and the caller records the new
    replica as the one that served it: the key stays moved.

    Properties (``tests/unit/test_replica_choice_properties.py``): the chosen replica never ends
    above the bound; with equal loads a key always lands on the same replica; removing a replica
    moves only the keys that were on it.

:class:`AffinityHistory` is the bounded key → replica map (least recently used keys dropped past
``routing.affinity_history``); the choice only reads the key's entry, the caller writes it.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import Literal, get_args

import attrs

from routerd.replica_modes import MODES, Mode

__all__ = ["AffinityHistory", "Candidate", "Choice", "MODES", "Mode", "REASONS", "Reason", "TIE_TOLERANCE_S",
           "affinity", "capacity", "key_hash", "least_loaded", "rendezvous_order", "within_bound"]

#: Why a replica was chosen (the ``reason`` of a ``replica_choice`` decision row).
Reason = Literal[
    "least_loaded",  # least_loaded: the one replica with the least load
    "tie_rotation",  # least_loaded: several tied for the least load, the rotation picked
    "affinity_hit",  # affinity: the replica that served the key last, within the bound
    "affinity_new",  # affinity: a key with no history, placed by its rendezvous order
    "affinity_gone",  # affinity: the key's replica is no longer a candidate, placed again
    "affinity_moved",  # affinity: the key's replica was over the load bound, the key moved
]
REASONS: tuple[Reason, ...] = get_args(Reason)

#: Loads closer than this (seconds) are equal for ``least_loaded`` (float sums of predictions).
TIE_TOLERANCE_S = 1e-6


@attrs.frozen
class Candidate:
    """One replica: its ``id`` (stable across requests, e.g. ``node:local``), its ``load`` and the
    predicted ``cost`` of this request on it (both seconds, ≥ 0)."""

    id: str
    load: float
    cost: float = 0.0


@attrs.frozen
class Choice:
    """The chosen replica, why, its load before this request, the candidates' mean load (counting
    this request) and the replica the key left (``affinity_moved`` only)."""

    id: str
    reason: Reason
    load: float
    mean: float
    left: str = ""


def key_hash(key: str) -> str:
    """The hash a session key is known by (the first 16 hex digits of its SHA-256): the decision
    log, the history and the rendezvous order see only this."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _weight(hashed: str, replica: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{hashed}\0{replica}".encode()).digest()[:8], "big")


def rendezvous_order(hashed: str, ids: Sequence[str]) -> list[str]:
    """``ids`` by the key's rendezvous weight, highest first (ties, never in practice, by id)."""
    return sorted(ids, key=lambda replica: (-_weight(hashed, replica), replica))


def _mean(candidates: Sequence[Candidate], cost: float) -> float:
    return (sum(c.load for c in candidates) + cost) / len(candidates)


def capacity(candidates: Sequence[Candidate], cost: float, c: float) -> float:
    """The load a replica may reach by taking a request of ``cost``: ``c`` × the mean load counting
    the request, rounded up to a whole number of ``cost`` (see the module)."""
    bound = c * _mean(candidates, cost)
    if cost <= 0:
        return bound
    return math.ceil(bound / cost - TIE_TOLERANCE_S) * cost


def within_bound(candidate: Candidate, candidates: Sequence[Candidate], c: float) -> bool:
    """Whether ``candidate`` may take the request under the load bound ``c`` (see the module)."""
    if candidate.load + candidate.cost <= capacity(candidates, candidate.cost, c) + TIE_TOLERANCE_S:
        return True
    return candidate.load <= min(other.load for other in candidates) + TIE_TOLERANCE_S


def least_loaded(candidates: Sequence[Candidate], turn: int) -> Choice:
    """The least loaded candidate; a tie broken by ``turn`` (see the module).  ``candidates`` must
    not be empty."""
    ordered = sorted(candidates, key=lambda c: c.id)
    low = min(c.load for c in ordered)
    tied = [c for c in ordered if c.load <= low + TIE_TOLERANCE_S]
    chosen = tied[turn % len(tied)]
    reason: Reason = "tie_rotation" if len(tied) > 1 else "least_loaded"
    return Choice(chosen.id, reason, chosen.load, _mean(ordered, chosen.cost))


def affinity(hashed: str, candidates: Sequence[Candidate], last: str | None, c: float) -> Choice:
    """The replica for the key ``hashed`` whose last replica was ``last`` (None: no history), under
    the load bound ``c`` (see the module).  ``candidates`` must not be empty."""
    by_id = {candidate.id: candidate for candidate in candidates}
    previous = by_id.get(last) if last is not None else None
    if previous is not None and within_bound(previous, candidates, c):
        return Choice(previous.id, "affinity_hit", previous.load, _mean(candidates, previous.cost))
    reason: Reason = "affinity_new" if last is None else (
        "affinity_gone" if previous is None else "affinity_moved")
    for replica in rendezvous_order(hashed, list(by_id)):
        candidate = by_id[replica]
        if within_bound(candidate, candidates, c):
            return Choice(candidate.id, reason, candidate.load, _mean(candidates, candidate.cost),
                          left=previous.id if previous is not None else "")
    raise AssertionError("the least loaded replica is always within the bound")  # pragma: no cover


class AffinityHistory:
    """Key hash → the replica that served it last, at most ``cap`` keys (least recently used
    dropped first)."""

    def __init__(self, cap: int) -> None:
        self.cap = max(1, cap)
        self._entries: OrderedDict[str, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, hashed: str) -> str | None:
        replica = self._entries.get(hashed)
        if replica is not None:
            self._entries.move_to_end(hashed)
        return replica

    def put(self, hashed: str, replica: str) -> None:
        self._entries[hashed] = replica
        self._entries.move_to_end(hashed)
        while len(self._entries) > self.cap:
            self._entries.popitem(last=False)

    def resize(self, cap: int) -> None:
        self.cap = max(1, cap)
        while len(self._entries) > self.cap:
            self._entries.popitem(last=False)
