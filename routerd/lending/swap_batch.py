"""The swap-avoiding order on a shared runtime (contract "The swap-avoiding order",
``scheduling.swap_batch``).

A lane's runtime serves one model at a time: when the request the class order would admit next is
of another model than the one the runtime will hold by then, admitting it switches the runtime
(stop, load the other weights).  With ``swap_batch`` N > 0 the lane queue admits instead, up to N
times since the runtime last switched, the request of the loaded model that model's own order
serves first, in the same effective class as the one passed over, so the other model's requests
are served together later (``A B A A C`` runs as ``A A A B C``).

The starvation bound: a waiting request is *overtaken* when a request behind it is admitted first
this way (the one passed over, and whatever else waits ahead of the request admitted); from the
first time, it carries that instant (``Entry.overtaken_ms``).  No request is admitted out of order
when one it would overtake was first overtaken ``scheduling.swap_max_wait`` ago (never more than
``queue.aging``, the period after which a waiting request rises a class): so a request waits at most
that bound plus the one job admitted last before it longer than the class order makes it wait.  (A
request behind the one admitted first is not delayed by it: it does not count.)
The clock starts when a request is first overtaken, not when it arrived: on a runtime too slow for
its traffic every waiting request is older than any bound, and a bound from arrival would switch
the order off exactly when the runtime spends its time loading (benchmarks/swap_batch.py).

The model the runtime will hold is the model of the last request admitted to the backend while
one is there (the runtime serves them in admission order); else the one the caller says the
runtime holds or is loading (:attr:`SwapBatch.loaded`, data the node keeps up to date; None:
nothing loaded, so nothing to keep and no pass).

Within one model the order is unchanged (the loaded model's request taken is the one its own
order serves first), so the request lending takes from a model is still the one that model would
serve first, the one waiting longest.  Pure: no Twisted, no clock of its own.  With N = 0 nothing
here is asked.
"""

from __future__ import annotations

from collections.abc import Sequence

from routerd.lending.priority import FairOrder, effective_rank
from routerd.lending.queue_entries import Entry, SwapPass


class SwapBatch:
    """The rule's settings, the runtime's model, and the passes since the runtime last switched."""

    __slots__ = ("limit", "max_wait_ms", "loaded", "_model", "_count", "_proposed", "_overtaken", "_now_ms",
                 "_passes", "tally")

    def __init__(self, limit: int = 0, max_wait_ms: int = 10_000) -> None:
        self.limit = 0
        self.max_wait_ms = 0
        self.configure(limit, max_wait_ms)
        #: The lane key of the model the runtime holds or is loading (None: nothing).
        self.loaded: str | None = None
        self._model: str | None = None  # the model the count below is of
        self._count = 0  # requests of it admitted ahead of a switch since the runtime switched to it
        self._proposed: SwapPass | None = None  # the pass :meth:`pick` answered, until admitted
        self._overtaken: list[Entry] = []  # what that pass overtakes, and when
        self._now_ms = 0
        self._passes: list[SwapPass] = []  # passes made since the caller last took them
        #: Per model kept loaded: (requests served ahead of a switch, switches avoided), cumulative.
        self.tally: dict[str, tuple[int, int]] = {}

    def configure(self, limit: int, max_wait_ms: int) -> None:
        """Apply ``scheduling.swap_batch`` and ``scheduling.swap_max_wait`` (ms) from the next pick."""
        self.limit = max(int(limit), 0)
        self.max_wait_ms = max(int(max_wait_ms), 0)

    def bound_ms(self, aging_ms: int) -> int:
        """How long after it was first overtaken a request may still be overtaken."""
        return min(self.max_wait_ms, aging_ms) if aging_ms > 0 else self.max_wait_ms

    def current(self, admitted: dict[str, Entry]) -> str | None:
        """The model the runtime will hold when the next admitted request reaches it."""
        last = next(reversed(admitted.values()), None)
        return last.model_id if last is not None else self.loaded

    def pick(self, waiting: Sequence[Entry], index: int, admitted: dict[str, Entry], now_ms: int,
             order: FairOrder, uniform: bool) -> int:
        """Where in ``waiting`` the request to admit is, given that the class order picks ``index``
        (``uniform``: one class and one key wait, the order is the list's)."""
        self._proposed = None
        head = waiting[index]
        current = self.current(admitted)
        if current is None or head.model_id == current:
            return index
        if current != self._model:
            self._model, self._count = current, 0
        if self._count >= self.limit:
            return index
        mine = [i for i, e in enumerate(waiting) if e.model_id == current and e.borrowed == head.borrowed]
        if not mine:
            return index
        if uniform:
            chosen = mine[0]
        else:
            found = order.first([waiting[i] for i in mine], now_ms)
            assert found is not None
            chosen = mine[found]
            aging = order.aging_ms
            if effective_rank(waiting[chosen].priority, waiting[chosen].arrived_ms, now_ms, aging) != \
                    effective_rank(head.priority, head.arrived_ms, now_ms, aging):
                return index  # it would pass a higher class
        # what it would overtake: the one passed over, and every other model's request ahead of it
        overtaken = [head, *(e for e in waiting[:chosen] if e.model_id != current and e is not head)]
        since = now_ms - self.bound_ms(order.aging_ms)  # first overtaken then or before: its bound is up
        if any(e.overtaken_ms is not None and e.overtaken_ms <= since for e in overtaken):
            return index
        self._proposed = SwapPass(
            served=waiting[chosen].request_id, passed=head.request_id, model_id=current,
            passed_model_id=head.model_id, waited_ms=max(now_ms - head.arrived_ms, 0),
            avoided=_switches_saved(waiting, chosen, current))
        self._overtaken, self._now_ms = overtaken, now_ms
        return chosen

    def admitted(self, entry: Entry, current: str | None) -> None:
        """``entry`` was admitted while the runtime was to hold ``current``: count the pass
        :meth:`pick` proposed for it, or a switch."""
        proposed, self._proposed = self._proposed, None
        if proposed is not None and proposed.served == entry.request_id:
            for e in self._overtaken:
                if e.overtaken_ms is None:
                    e.overtaken_ms = self._now_ms
            self._count += 1
            self._passes.append(proposed)
            served, avoided = self.tally.get(proposed.model_id, (0, 0))
            self.tally[proposed.model_id] = (served + 1, avoided + proposed.avoided)
        elif entry.model_id != current:
            self._model, self._count = entry.model_id, 0

    def take_passes(self) -> tuple[SwapPass, ...]:
        """The passes made since the last call (the caller's decision-log rows)."""
        if not self._passes:
            return ()
        passes, self._passes = tuple(self._passes), []
        return passes


def _switches_saved(waiting: Sequence[Entry], chosen: int, current: str) -> int:
    """How many fewer model switches the runtime makes serving ``waiting`` in list order after the
    loaded model ``current`` once ``waiting[chosen]`` (of ``current``) goes first: taken from between
    its neighbours, they follow each other (0, 1 or 2; never fewer, as a switch is never added)."""
    before = waiting[chosen - 1].model_id if chosen > 0 else current
    after = waiting[chosen + 1].model_id if chosen + 1 < len(waiting) else None
    return (before != current) + (after is not None and after != current) - \
        (after is not None and before != after)


__all__ = ["SwapBatch", "SwapPass"]
