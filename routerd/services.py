"""Service-tree building blocks: a periodic loop whose interval can change, a start/stop hook, and a
``MultiService`` that stops its children one at a time, newest first.

A node is one tree of these (``Node.services``): the order children are added is the start order,
and the reverse is the stop order, so "flush the decision log, then stop the backends, then close
the store" is written once, as the tree.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from twisted.application.service import MultiService, Service
from twisted.internet import defer, task
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

log = Logger()


class IntervalService(Service):
    """Runs ``work`` every ``interval`` seconds on ``clock`` while running.

    A failing or slow call is logged and never stops the loop (``LoopingCall`` waits for a
    Deferred the call returns before the next one).  ``set_interval`` applies a new interval at once.
    """

    def __init__(self, name: str, work: Callable[[], Any], interval: float, clock: IReactorTime, *,
                 now: bool = False) -> None:
        self.setName(name)  # type: ignore[no-untyped-call]
        self.work = work
        self.interval = interval
        self.clock = clock
        self.now = now
        self._loop: task.LoopingCall | None = None
        self._current: defer.Deferred[None] | None = None

    def _call(self) -> defer.Deferred[None]:
        d = defer.maybeDeferred(self.work)
        d.addCallbacks(lambda _: None, lambda f: log.failure("{name} failed", failure=f, name=self.name))
        if not d.called:
            self._current = d
            d.addBoth(self._done)
        return d

    def _done(self, result: object) -> object:
        self._current = None
        return result

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        self._start(self.now)

    def _start(self, now: bool) -> None:
        self._loop = task.LoopingCall(self._call)
        self._loop.clock = self.clock
        self._loop.start(self.interval, now=now)

    def stopService(self) -> defer.Deferred[None] | None:
        """Stop the loop; a call under way is waited for (what it uses is stopped after it)."""
        super().stopService()  # type: ignore[no-untyped-call]
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        if self._current is None:
            return None
        waiting: defer.Deferred[None] = defer.Deferred()

        def finished(result: object) -> object:
            waiting.callback(None)
            return result

        self._current.addBoth(finished)
        return waiting

    def set_interval(self, interval: float) -> None:
        if interval == self.interval:
            return
        self.interval = interval
        if self.running and self._loop is not None and self._loop.running:
            self._loop.stop()
            self._start(False)


class HookService(Service):
    """Calls ``on_start`` when started and awaits ``on_stop`` when stopped."""

    def __init__(self, name: str, *, on_start: Callable[[], Any] | None = None,
                 on_stop: Callable[[], Awaitable[Any] | None] | None = None) -> None:
        self.setName(name)  # type: ignore[no-untyped-call]
        self.on_start = on_start
        self.on_stop = on_stop

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        if self.on_start is not None:
            self.on_start()

    def stopService(self) -> defer.Deferred[None] | None:
        super().stopService()  # type: ignore[no-untyped-call]
        if self.on_stop is None:
            return None
        return defer.ensureDeferred(_await(self.on_stop()))


async def _await(value: Awaitable[Any] | None) -> None:
    if value is not None:
        await value


class OrderedServices(MultiService):
    """Stops its children in reverse order, each after the previous one has finished stopping."""

    def stopService(self) -> defer.Deferred[None]:
        Service.stopService(self)
        return defer.ensureDeferred(self._stop_in_order())

    async def _stop_in_order(self) -> None:
        for child in reversed(list(self)):
            if not child.running:
                continue
            try:
                await defer.maybeDeferred(child.stopService)
            except Exception:  # noqa: BLE001 - one child's failure must not leave the rest running
                log.failure("stopping {name} failed", name=getattr(child, "name", "?"))
