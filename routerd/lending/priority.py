"""Priority classes, aging and per-key fair share: the order a node's router queue serves.

Pure: no clock of its own, no Twisted.  The queue (:mod:`routerd.lending.queue`) asks
:meth:`FairOrder.pick` which waiting entry goes next and tells :meth:`FairOrder.charge` when one is
admitted.

* **Classes** ``interactive`` (rank 0) > ``standard`` (1, the default) > ``batch`` (2).  A request's
  class is its key's; ``X-Routerd-Priority`` may lower it, never raise it (:func:`requested_class`).
* **Aging**: a waiting entry rises one class per ``aging_ms`` it has waited (from its first arrival),
  so a batch request is served like an interactive one after ``2 × aging``.
* **Fair share** within the highest class that has waiting work: each key has a served counter that
  grows by ``1 / weight`` per admitted request; the key with the lowest counter goes next.  A key's
  counter counts as at least one round below the most-served key competing with it, so a key
  back from idle (or from waiting behind a higher class) goes next in its class but banks no
  credit.  Ties go to the entry first in the queue's own order.

With every entry in one class and of one key the pick is always the first entry of the queue's list:
exactly the order the queue kept before classes existed (arrival order, returned entries first).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Protocol

from routerd.config.keys import DEFAULT_CLASS, PRIORITY_CLASSES, PriorityClass, PriorityError, requested_class

CLASSES: tuple[PriorityClass, ...] = PRIORITY_CLASSES
RANK: dict[PriorityClass, int] = {name: rank for rank, name in enumerate(CLASSES)}
DEFAULT_AGING_MS = 30_000


def effective_ranks(waiting: Sequence[Ordered], now_ms: int, aging_ms: int) -> list[int]:
    """:func:`effective_rank` of every entry (one tight loop: the queue may hold 10,000)."""
    if aging_ms <= 0:
        return [e.priority for e in waiting]
    return [max(e.priority - max(now_ms - e.arrived_ms, 0) // aging_ms, 0) if e.priority else 0
            for e in waiting]


def effective_rank(rank: int, arrived_ms: int, now_ms: int, aging_ms: int) -> int:
    """``rank`` lifted one class per ``aging_ms`` waited (never above interactive, 0)."""
    if aging_ms <= 0:
        return rank
    return max(rank - max(now_ms - arrived_ms, 0) // aging_ms, 0)


class Ordered(Protocol):
    """What the order reads of a waiting entry."""

    @property
    def priority(self) -> int: ...

    @property
    def key_name(self) -> str: ...

    @property
    def weight(self) -> float: ...

    @property
    def arrived_ms(self) -> int: ...


class FairOrder:
    """The served counters of the keys of one queue, and the pick they imply."""

    def __init__(self, aging_ms: int = DEFAULT_AGING_MS) -> None:
        self.aging_ms = aging_ms
        self._served: dict[str, float] = {}
        self._picked: tuple[str, float] | None = None  # the last pick's key and counter once charged

    def served(self, key_name: str) -> float:
        return self._served.get(key_name, 0.0)

    def charge(self, entry: Ordered) -> None:
        """``entry`` (the last :meth:`pick`) was admitted: its key has been served one more."""
        picked, self._picked = self._picked, None
        if picked is not None and picked[0] == entry.key_name:
            self._served[entry.key_name] = picked[1]
        else:
            self._served[entry.key_name] = self._served.get(entry.key_name, 0.0) + _cost(entry)

    def reset(self) -> None:
        """Nothing is queued any more: every key starts even again (keeps the map small)."""
        self._served.clear()
        self._picked = None

    def pick(self, waiting: Sequence[Ordered], now_ms: int) -> int | None:
        """The index in ``waiting`` of the entry to serve next (None when nothing waits)."""
        found = self._pick(waiting, now_ms, self._served)
        if found is None:
            return None
        index, counter = found
        self._picked = (waiting[index].key_name, counter)
        return index

    def first(self, waiting: Sequence[Ordered], now_ms: int) -> int | None:
        """The index :meth:`pick` would answer, not remembered for :meth:`charge`."""
        found = self._pick(waiting, now_ms, self._served)
        return None if found is None else found[0]

    def _pick(self, waiting: Sequence[Ordered], now_ms: int,
              served: dict[str, float]) -> tuple[int, float] | None:
        """Highest effective class first; in it, the key served least — a key's counter counted
        as at least one round (the largest ``1 / weight`` there) below the most-served key waiting
        there (a key back from idle, or from waiting behind a higher class, banks no credit and goes
        next); then the queue's own order.  Answers the index and the key's counter once charged."""
        if not waiting:
            return None
        ranks = effective_ranks(waiting, now_ms, self.aging_ms)
        top = min(ranks)
        firsts: dict[str, int] = {}
        for i, rank in enumerate(ranks):
            if rank == top:
                key = waiting[i].key_name
                if key not in firsts:
                    firsts[key] = i
        # one round below the most-served key: a backlogged key is never more than that behind
        floor = max(served.get(key, 0.0) for key in firsts) - max(_cost(waiting[i]) for i in firsts.values())
        best: tuple[float, int] | None = None
        for key, i in firsts.items():
            counter = max(served.get(key, 0.0), floor)
            if best is None or (counter, i) < best:
                best = (counter, i)
        assert best is not None
        return best[1], best[0] + _cost(waiting[best[1]])

    def service_order(self, waiting: Sequence[Ordered], now_ms: int) -> list[int]:
        """Indices of ``waiting`` in the order they would be served if nothing else arrived and the
        clock stood at ``now_ms`` (the queue position, and what lending takes last): what
        successive :meth:`pick` and :meth:`charge` calls would give, in O(entries × keys of a
        class) rather than O(entries²) (a queue may hold 10,000 requests)."""
        served = dict(self._served)
        classes: dict[int, dict[str, deque[int]]] = {}
        for i, rank in enumerate(effective_ranks(waiting, now_ms, self.aging_ms)):
            classes.setdefault(rank, {}).setdefault(waiting[i].key_name, deque()).append(i)
        order: list[int] = []
        for rank in sorted(classes):
            keys = classes[rank]
            while keys:
                floor = max(served.get(k, 0.0) for k in keys) - max(_cost(waiting[q[0]])
                                                                    for q in keys.values())
                key = min(keys, key=lambda k: (max(served.get(k, 0.0), floor), keys[k][0]))
                index = keys[key].popleft()
                served[key] = max(served.get(key, 0.0), floor) + _cost(waiting[index])
                order.append(index)
                if not keys[key]:
                    del keys[key]
        return order


    def place(self, waiting: Sequence[Ordered], index: int, now_ms: int) -> int:
        """About where ``waiting[index]`` would be served (1 = next), in one pass: after every
        entry of a higher effective class, its own key's entries ahead of it in its class, and, of
        each other key in its class, as many as its own key's turns until it (round robin)."""
        target = waiting[index]
        ranks = effective_ranks(waiting, now_ms, self.aging_ms)
        rank = ranks[index]
        higher = 0
        own_ahead = 0
        others: dict[str, int] = {}
        for i, r in enumerate(ranks):
            if r < rank:
                higher += 1
            elif r == rank and i != index:
                key = waiting[i].key_name
                if key == target.key_name:
                    own_ahead += i < index
                else:
                    others[key] = others.get(key, 0) + 1
        turns = own_ahead + 1
        return higher + own_ahead + sum(min(count, turns) for count in others.values()) + 1


def _cost(entry: Ordered) -> float:
    """What serving one request of ``entry``'s key adds to its counter: 1 / its weight."""
    return 1.0 / max(entry.weight, 1e-9)


__all__ = [
    "CLASSES",
    "DEFAULT_AGING_MS",
    "DEFAULT_CLASS",
    "RANK",
    "FairOrder",
    "Ordered",
    "PriorityClass",
    "PriorityError",
    "effective_rank",
    "effective_ranks",
    "requested_class",
]
