"""State shared by every simulated backend: weights, knobs, counters, loading, slots, exit."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, NoReturn, Protocol, TextIO

from twisted.internet.defer import Deferred, DeferredSemaphore
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.server import Request

from routerd.sim.control import Counters, Knobs
from routerd.sim.web import HttpError, send_json
from routerd.sim.weights import Weights

__all__ = ["Clock", "Handler", "LoadingReply", "SimRuntime", "WeightsServer"]

Handler = Callable[[Request], Coroutine[Any, Any, bytes | None]]
#: The answer to a request that arrives while the model loads, or None to serve it (it then waits its turn).
LoadingReply = Callable[[Request], bytes | None]


class Clock(Protocol):
    """What the simulator needs of a reactor: the global reactor or a ``task.Clock``."""

    def seconds(self) -> float: ...

    def callLater(
        self, delay: float, callable: Callable[..., object], *args: object, **kw: object
    ) -> Any: ...


class SimRuntime:
    """One simulated backend process: everything the HTTP handlers of a family share.

    ``clock`` drives every wait (a ``task.Clock`` in unit tests); ``on_exit(code)`` is called once
    when the process should end (failed load: 1, simulated crash: 3).
    """

    log = Logger()

    def __init__(
        self,
        *,
        family: str,
        weights: Weights,
        weights_path: str,
        clock: Clock,
        on_exit: Callable[[int], None],
        knobs: Knobs | None = None,
        time_scale: float = 1.0,
        slots: int = 1,
        out: TextIO | None = None,
        err: TextIO | None = None,
    ) -> None:
        self.family = family
        self.weights = weights
        self.weights_path = weights_path
        self.clock = clock
        self.knobs = knobs if knobs is not None else Knobs()
        self.time_scale = time_scale
        self.total_slots = slots
        self.counters = Counters()
        self.loading = True
        self.exiting = False
        self.exit_code: int | None = None
        self._on_exit = on_exit
        self._slots = DeferredSemaphore(slots)
        self._out = out
        self._err = err

    # -- output --------------------------------------------------------------------------------

    def say(self, line: str) -> None:
        """A line on stdout, flushed at once (launchers watch for these)."""
        stream = self._out if self._out is not None else sys.stdout
        stream.write(line + "\n")
        stream.flush()

    def complain(self, line: str) -> None:
        stream = self._err if self._err is not None else sys.stderr
        stream.write(line + "\n")
        stream.flush()

    # -- time ----------------------------------------------------------------------------------

    def now(self) -> float:
        return self.clock.seconds()

    def sleep(self, seconds: float) -> Deferred[None]:
        """Wait ``seconds`` of (already scaled) time; cancellable."""
        def cancel(_: Deferred[None]) -> None:
            if call.active():
                call.cancel()

        done: Deferred[None] = Deferred(cancel)
        call = self.clock.callLater(max(0.0, seconds), done.callback, None)
        return done

    def job_seconds(self, raw_seconds: float) -> float:
        """A job duration after the slowdown and time-scale knobs."""
        return raw_seconds * self.knobs.slowdown * self.time_scale

    def work(self, raw_seconds: float) -> Deferred[None]:
        return self.sleep(self.job_seconds(raw_seconds))

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one of the parallel slots; waiters are served first come, first served."""
        self.counters.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.counters.waiting -= 1
        self.counters.running += 1
        try:
            yield
        finally:
            self.counters.running -= 1
            self._slots.release()

    # -- loading -------------------------------------------------------------------------------

    async def load(self, weights: Weights, path: str) -> bool:
        """Take ``load_ms`` (time-scaled) to load ``weights``; a failed load ends the process."""
        self.loading = True
        self.log.info("loading {path} ({label})", path=path, label=weights.label)
        await self.sleep(weights.load_ms / 1000.0 * self.time_scale)
        if self.knobs.fail_next_load:
            self.knobs.fail_next_load = False
            self.complain(f"error: failed to load model '{path}' (simulated load failure)")
            self.exit(1)
            return False
        self.weights = weights
        self.weights_path = path
        self.loading = False
        self.say("model loaded")
        return True

    def start(self) -> Deferred[bool]:
        """Load the startup weights (``crash_after`` 0 then exits at once)."""
        return Deferred.fromCoroutine(self._start())

    async def _start(self) -> bool:
        loaded = await self.load(self.weights, self.weights_path)
        if loaded:
            self.check_crash()
        return loaded

    # -- requests ------------------------------------------------------------------------------

    def serve(
        self,
        request: Request,
        handler: Handler,
        *,
        work: bool,
        loading_reply: LoadingReply | None,
    ) -> Deferred[bytes | None] | bytes:
        """Run ``handler`` unless the process is exiting, hung or still loading.

        ``work`` marks inference requests: they are counted in flight (hung ones included) and,
        once answered, as served, which is what ``crash_after`` counts.
        """
        if self.exiting:
            return Deferred()  # a dying process: the connection drops when it exits
        if self.knobs.hang:
            self.log.info("hanging {method} {path}", method=request.method, path=request.path)
            if work:
                self._track(request)
            return Deferred()  # never answers; cancelled when the client goes away
        if self.loading and loading_reply is not None:
            reply = loading_reply(request)
            if reply is not None:
                return reply
        if work:
            self._track(request)
        return Deferred.fromCoroutine(self._answer(request, handler))

    async def _answer(self, request: Request, handler: Handler) -> bytes | None:
        try:
            return await handler(request)
        except HttpError as exc:
            return send_json(request, exc.status, exc.body)

    def _track(self, request: Request) -> None:
        self.counters.in_flight += 1
        finished: Deferred[None] = request.notifyFinish()
        finished.addCallbacks(self._served, self._dropped)

    def _served(self, _: None) -> None:
        self.counters.in_flight -= 1
        self.counters.requests_served += 1
        if self.knobs.crash_after is not None:
            self.knobs.crash_after = max(0, self.knobs.crash_after - 1)
        self.check_crash()

    def _dropped(self, failure: Failure) -> None:
        self.counters.in_flight -= 1

    def check_crash(self) -> None:
        if self.knobs.crash_after == 0 and not self.exiting:
            self.complain(
                f"error: simulated crash after serving {self.counters.requests_served} requests"
            )
            self.exit(3)

    async def die(self, code: int) -> NoReturn:
        """End the process and never answer the current request (its connection drops)."""
        self.exit(code)
        await Deferred()
        raise AssertionError("unreachable: a dying process never answers")

    def exit(self, code: int) -> None:
        if self.exiting:
            return
        self.exiting = True
        self.exit_code = code
        self.log.info("exiting with code {code}", code=code)
        self._on_exit(code)


class WeightsServer:
    """A family's request handlers over one runtime, answering with the weights ``weights`` gives:
    the process's own, or (koboldcpp, which holds several) the ones of one lane."""

    def __init__(self, runtime: SimRuntime, weights: Callable[[], Weights] | None = None) -> None:
        self.rt = runtime
        self._weights = weights if weights is not None else (lambda: runtime.weights)

    @property
    def weights(self) -> Weights:
        return self._weights()
