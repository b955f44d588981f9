"""Drive a simulated backend in-process: no sockets, no subprocess, time from a ``task.Clock``.

Usable from any test::

    sim = SimHarness(["llama-server", "-m", str(weights_path)])
    sim.start_loaded()
    response = await sim.settle(sim.stub.post(sim.url("/v1/chat/completions"), json=body))
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any, TypeVar

from treq.testing import StubTreq
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from routerd.sim.cli import SimServer, make_server
from routerd.sim.runtime import SimRuntime

__all__ = ["SimHarness"]

T = TypeVar("T")
R = TypeVar("R")


class SimHarness:
    """A simulated backend served through ``treq.testing.StubTreq`` on a ``task.Clock``.

    ``exit_codes`` collects the codes the process would have exited with; ``out``/``err`` hold
    what it would have printed.
    """

    def __init__(self, argv: Sequence[str], clock: Clock | None = None) -> None:
        self.clock = clock if clock is not None else Clock()
        self.exit_codes: list[int] = []
        self.out = io.StringIO()
        self.err = io.StringIO()
        self.server: SimServer = make_server(
            argv, clock=self.clock, on_exit=self.exit_codes.append, out=self.out, err=self.err
        )
        self.runtime: SimRuntime = self.server.runtime
        make_stub: Any = StubTreq  # untyped
        self.stub: Any = make_stub(self.server.app.resource())

    def url(self, path: str) -> str:
        return "http://sim.invalid" + path

    def start(self) -> Deferred[bool]:
        """Begin loading the startup weights (the process has just started listening)."""
        return self.runtime.start()

    @classmethod
    def loaded(cls, argv: list[str]) -> SimHarness:
        """A harness for ``argv`` (the program and its flags), started with its load finished."""
        sim = cls(argv)
        sim.start_loaded()
        return sim

    def start_loaded(self) -> None:
        """Start and let the load finish."""
        self.start()
        self.advance(self.runtime.weights.load_ms / 1000.0 * self.runtime.time_scale)
        assert not self.runtime.loading, "the startup load did not finish"

    def _timer_times(self) -> list[float]:
        calls: list[Any] = list(self.clock.getDelayedCalls())  # IDelayedCall is a zope interface
        return [float(call.getTime()) for call in calls]

    def flush(self) -> None:
        self.stub.flush()

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, firing every timer due on the way, in order."""
        end = self.clock.seconds() + seconds
        self.flush()
        while True:
            due = [t for t in self._timer_times() if t <= end]
            if not due:
                break
            self.clock.advance(max(0.0, min(due) - self.clock.seconds()))
            self.flush()
        self.clock.advance(max(0.0, end - self.clock.seconds()))
        self.flush()

    def step(self) -> bool:
        """Jump to the next timer and fire it; False if none is pending."""
        self.flush()
        times = self._timer_times()
        if not times:
            return False
        self.clock.advance(max(0.0, min(times) - self.clock.seconds()))
        self.flush()
        return True

    async def settle(self, d: Deferred[T], limit: float = 3600.0) -> T:
        """Run timers until ``d`` fires (at most ``limit`` simulated seconds), then return its
        result. The clock then shows how long the answer took."""
        fired: list[bool] = []

        def mark(result: R) -> R:
            fired.append(True)
            return result

        d.addBoth(mark)
        deadline = self.clock.seconds() + limit
        self.flush()
        while not fired and self.clock.seconds() <= deadline:
            if not self.step():
                break
        if not fired:
            raise AssertionError(f"no answer within {limit} simulated seconds")
        return await d
