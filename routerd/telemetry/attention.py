"""The "needs attention" rules of the rack view (contract §6 "Telemetry"), over a sliding window.

A pure object fed by the node: each backend load as it ends (:meth:`AttentionBook.load`, per load, never per
request) and, at each telemetry reading, the node's count of failed requests so far
(:meth:`AttentionBook.failed_requests`, read from the request counters /metrics already keeps).  Time comes
from the injected clock.  The rules, each over the last :data:`WINDOW_S`:

* ``swap_thrash``: a runtime loaded :data:`THRASH_LOADS` times or more, switching between two models or
  more (the demo's master loaded 33 times in about 7 minutes, swapping two models);
* ``failed_loads``: a runtime had a load fail;
* ``failed_requests``: requests failed on this node (a backend error, a broken stream, a 5xx answer; a
  client's own mistakes and disconnects are not counted);
* ``long_queue``: a runtime has :data:`LONG_QUEUE` requests or more waiting for it right now.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import attrs
from twisted.internet.interfaces import IReactorTime

from routerd.wire.telemetry import Attention

__all__ = ["LONG_QUEUE", "THRASH_LOADS", "WINDOW_S", "AttentionBook", "RuntimeQueue"]

#: The window every rule counts over, seconds.
WINDOW_S = 600.0
#: Loads of one runtime within the window, of two models or more, that make swap thrash.
THRASH_LOADS = 6
#: Requests waiting for one runtime that make a long queue.
LONG_QUEUE = 8
#: Most loads remembered per runtime (far more than a window holds at any sane load time).
_LOADS_KEPT = 1000


@attrs.frozen
class _Load:
    at: float
    model_id: str
    ok: bool


@attrs.frozen
class RuntimeQueue:
    """One runtime as the rules see it now."""

    kind: str
    queue_depth: int


@attrs.frozen
class RuntimeCounts:
    loads: int
    failed_loads: int
    models: tuple[str, ...]


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:g} min"


class AttentionBook:
    def __init__(self, clock: IReactorTime, window_s: float = WINDOW_S) -> None:
        self.clock = clock
        self.window_s = window_s
        self._loads: dict[str, deque[_Load]] = {}
        #: (when, failed requests so far) at each reading, oldest first
        self._failed: deque[tuple[float, int]] = deque()

    # -- feeding -------------------------------------------------------------------------------

    def load(self, runtime: str, model_id: str, ok: bool) -> None:
        """A load of ``runtime`` ended now."""
        self._loads.setdefault(runtime, deque(maxlen=_LOADS_KEPT)).append(
            _Load(self.clock.seconds(), model_id, ok))

    def failed_requests(self, total: int) -> int:
        """Record the node's failed requests so far; answers how many failed within the window (to one
        reading: the baseline is the newest reading at or before the window's start, 0 before any)."""
        now = self.clock.seconds()
        start = now - self.window_s
        failed = self._failed
        failed.append((now, total))
        while len(failed) > 1 and failed[1][0] <= start:
            failed.popleft()
        baseline = failed[0][1] if failed[0][0] <= start else 0
        return max(0, total - baseline)

    # -- reading -------------------------------------------------------------------------------

    def counts(self, runtime: str) -> RuntimeCounts:
        """The loads of ``runtime`` within the window."""
        start = self.clock.seconds() - self.window_s
        loads = self._loads.get(runtime)
        if loads is None:
            return RuntimeCounts(0, 0, ())
        while loads and loads[0].at < start:
            loads.popleft()
        models = tuple(dict.fromkeys(load.model_id for load in loads if load.ok))
        return RuntimeCounts(sum(1 for load in loads if load.ok), sum(1 for load in loads if not load.ok),
                             models)

    def flags(self, runtimes: Iterable[RuntimeQueue], failed_requests: int) -> tuple[Attention, ...]:
        """What needs attention now."""
        window = _minutes(self.window_s)
        out: list[Attention] = []
        for runtime in runtimes:
            counts = self.counts(runtime.kind)
            if counts.loads >= THRASH_LOADS and len(counts.models) >= 2:
                out.append(Attention(
                    code="swap_thrash", runtime=runtime.kind,
                    message=f"{runtime.kind} runtime loaded {counts.loads} times in {window}, swapping "
                            + ", ".join(counts.models)))
            if counts.failed_loads:
                out.append(Attention(
                    code="failed_loads", runtime=runtime.kind,
                    message=f"{counts.failed_loads} failed load(s) of the {runtime.kind} runtime "
                            f"in {window}"))
            if runtime.queue_depth >= LONG_QUEUE:
                out.append(Attention(
                    code="long_queue", runtime=runtime.kind,
                    message=f"{runtime.queue_depth} requests waiting for the {runtime.kind} runtime"))
        if failed_requests:
            out.append(Attention(code="failed_requests",
                                 message=f"{failed_requests} failed request(s) in {window}"))
        return tuple(out)
