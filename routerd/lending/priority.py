"""Priority classes, aging and per-key fair share: the order a node's router queue serves (issue 23).

Pure: no clock of its own, no Twisted.  The queue (:mod:`routerd.lending.queue`) asks
:meth:`FairOrder.pick` which waiting entry goes next and tells :meth:`FairOrder.charge` when one is
admitted.

* **Classes** ``interactive`` (rank 0) > ``standard`` (1, the default) > ``batch`` (2).  A request's
  class is its key's; ``X-Routerd-Priority`` may lower it, never raise it (:func:`requested_class`).
* **Aging**: a waiting entry rises one class per ``aging_ms`` it has waited (from its first arrival),
  so a batch request is served like an interactive one after ``2 × aging``.
* **Fair share** within the highest class that has waiting work: each key has a served counter that
  grows by ``1 / weight`` per admitted request; the key with the lowest counter goes next, and a key
  that starts waiting again is lifted to the lowest counter of the keys already waiting (an idle key
  banks no credit).  Ties go to the entry first in the queue's own order.

With every entry in one class and of one key the pick is always the first entry of the queue's list:
exactly the order the queue kept before classes existed (arrival order, returned entries first).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from routerd.config.keys import DEFAULT_CLASS, PRIORITY_CLASSES, PriorityClass, PriorityError, requested_class

CLASSES: tuple[PriorityClass, ...] = PRIORITY_CLASSES
RANK: dict[PriorityClass, int] = {name: rank for rank, name in enumerate(CLASSES)}
DEFAULT_AGING_MS = 30_000


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

    def served(self, key_name: str) -> float:
        return self._served.get(key_name, 0.0)

    def waiting_again(self, key_name: str, waiting: Sequence[Ordered]) -> None:
        """``key_name`` had nothing waiting and now has: lift its counter to the lowest counter of
        the keys in ``waiting`` (the other entries waiting), so an idle spell banks no credit."""
        others = {e.key_name for e in waiting if e.key_name != key_name}
        if others:
            floor = min(self.served(k) for k in others)
            if self.served(key_name) < floor:
                self._served[key_name] = floor

    def charge(self, entry: Ordered) -> None:
        """``entry`` was admitted: its key has been served one more request."""
        self._served[entry.key_name] = self.served(entry.key_name) + 1.0 / max(entry.weight, 1e-9)

    def reset(self) -> None:
        """Nothing is queued any more: every key starts even again (keeps the map small)."""
        self._served.clear()

    def pick(self, waiting: Sequence[Ordered], now_ms: int, skip: frozenset[int] = frozenset()) -> int | None:
        """The index in ``waiting`` of the entry to serve next (None when nothing is eligible):
        highest effective class, then the key served least, then the queue's own order.  ``skip``
        lists indices not eligible (already taken by a simulation)."""
        return self._pick(waiting, now_ms, skip, self._served)

    def _pick(self, waiting: Sequence[Ordered], now_ms: int, skip: frozenset[int] | set[int],
              served: dict[str, float]) -> int | None:
        best: tuple[int, float, int] | None = None
        for i, e in enumerate(waiting):
            if i in skip:
                continue
            rank = effective_rank(e.priority, e.arrived_ms, now_ms, self.aging_ms)
            candidate = (rank, served.get(e.key_name, 0.0), i)
            if best is None or candidate < best:
                best = candidate
        return None if best is None else best[2]

    def service_order(self, waiting: Sequence[Ordered], now_ms: int) -> list[int]:
        """Indices of ``waiting`` in the order they would be served if nothing else arrived and the
        clock stood at ``now_ms`` (the queue position, and what lending takes last)."""
        served = dict(self._served)
        taken: set[int] = set()
        order: list[int] = []
        while len(order) < len(waiting):
            i = self._pick(waiting, now_ms, taken, served)
            if i is None:
                break
            e = waiting[i]
            served[e.key_name] = served.get(e.key_name, 0.0) + 1.0 / max(e.weight, 1e-9)
            taken.add(i)
            order.append(i)
        return order


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
    "requested_class",
]
