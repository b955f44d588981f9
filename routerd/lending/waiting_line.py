"""The waiting entries of one lane queue and the orders they are taken in.

A lane queue (:mod:`routerd.lending.queue`) keeps its waiting entries here, in a list in arrival
order (a returned entry at the head), with a count of the entries of each (class, key).  With one
class and one key waiting, every order is the list's (the fast path: no scan per pick, the order
before classes existed); otherwise admission follows :class:`~routerd.lending.priority.FairOrder`
(classes with aging, then fair share among keys), and lending takes from the other end: what the
owner would serve last goes first.  Pure: no Twisted, no clock of its own.
"""

from __future__ import annotations

from collections.abc import Collection

from routerd.counts import count_down
from routerd.lending.priority import FairOrder, effective_rank
from routerd.lending.queue_entries import Entry
from routerd.lending.swap_batch import SwapBatch


class WaitingLine:
    """The waiting entries of one lane queue (see the module doc)."""

    __slots__ = ("entries", "order", "swap", "_mix")

    def __init__(self, aging_ms: int) -> None:
        #: The waiting entries in list order (read; change them through this object only).
        self.entries: list[Entry] = []
        self.order = FairOrder(aging_ms)
        self.swap = SwapBatch()  # the swap-avoiding order (off: limit 0)
        # how many waiting entries of each (class, key): with one kind only the order is the list's
        self._mix: dict[tuple[int, str], int] = {}

    def add(self, entry: Entry, head: bool = False) -> None:
        """Put ``entry`` among the waiting ones: last, or first (a returned one)."""
        if head:
            self.entries.insert(0, entry)
        else:
            self.entries.append(entry)
        kind = (entry.priority, entry.key_name)
        self._mix[kind] = self._mix.get(kind, 0) + 1

    def next_index(self, now_ms: int, admitted: dict[str, Entry] | None = None) -> int:
        """Where in :attr:`entries` the entry admitted next is (there is one), with the backend
        holding ``admitted`` (in admission order; the swap-avoiding order reads it)."""
        uniform = self.uniform()
        if uniform:
            index = 0
        else:
            found = self.order.pick(self.entries, now_ms)
            assert found is not None
            index = found
        if self.swap.limit and admitted is not None:
            return self.swap.pick(self.entries, index, admitted, now_ms, self.order, uniform)
        return index

    def admit(self, index: int) -> Entry:
        """Take the entry at ``index`` out of the line and charge its key's share."""
        entry = self.entries.pop(index)
        self._unmix(entry)
        self.order.charge(entry)
        return entry

    def remove(self, entry: Entry) -> None:
        """Take ``entry`` out (found by identity: Entry's generated == compares every field)."""
        entries = self.entries
        for i, e in enumerate(entries):
            if e is entry:
                del entries[i]
                break
        self._unmix(entry)

    def remove_all(self, taken: Collection[Entry]) -> None:
        """Take every entry of ``taken`` out (lent away), keeping the others' order."""
        ids = {e.request_id for e in taken}
        self.entries[:] = [e for e in self.entries if e.request_id not in ids]
        for e in taken:
            self._unmix(e)

    def uniform(self) -> bool:
        """Every waiting entry is of one class and one key: the serving order is the list's."""
        return len(self._mix) <= 1

    def serving_order(self, now_ms: int) -> list[Entry]:
        """Waiting entries in the order they would be admitted if nothing else arrived."""
        if self.uniform():
            return list(self.entries)
        return [self.entries[i] for i in self.order.service_order(self.entries, now_ms)]

    def lending_order(self, now_ms: int) -> list[Entry]:
        """Waiting entries in the order lending takes them: what the owner would serve last goes
        first — the lowest effective class first (batch before interactive) and, within a class,
        in the class's serving order (fair share, then oldest first)."""
        entries = self.entries
        if self.uniform():
            return list(entries)
        order = self.order.service_order(entries, now_ms)
        place = {index: n for n, index in enumerate(order)}
        aging = self.order.aging_ms

        def rank(index: int) -> tuple[int, int]:
            e = entries[index]
            return (-effective_rank(e.priority, e.arrived_ms, now_ms, aging), place[index])

        return [entries[i] for i in sorted(range(len(entries)), key=rank)]

    def position(self, entry: Entry, now_ms: int) -> int:
        """A waiting entry's place in the serving order (1 = admitted next): exact with one class
        and one key, else :meth:`FairOrder.place`'s one-pass count (the header of every arrival:
        no simulation of the whole queue)."""
        entries = self.entries
        index = next(i for i in range(len(entries) - 1, -1, -1) if entries[i] is entry)  # new: last
        return index + 1 if self.uniform() else self.order.place(entries, index, now_ms)

    def _unmix(self, entry: Entry) -> None:
        count_down(self._mix, (entry.priority, entry.key_name))


__all__ = ["WaitingLine"]
