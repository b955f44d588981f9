"""Stopping a node loses nothing and logs nothing critical: samples are written before the store
closes, and a refit under way is waited for before what it reads is closed."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.logger import LogLevel, globalLogPublisher

from routerd.services import IntervalService
from routerd.store.runner import SyncRunner
from routerd.store.samples import RequestSample
from routerd.store.store import Store, _prepare
from tests.support import fired


class HeldRunner:
    """A runner whose jobs wait until ``release()`` (a write that is still under way)."""

    def __init__(self) -> None:
        self.sync = SyncRunner()
        self.jobs: list[tuple[Callable[[sqlite3.Connection], Any], bool, Deferred[Any]]] = []
        self.closed = False

    def run(self, fn: Callable[[sqlite3.Connection], Any], *, transaction: bool = True) -> Deferred[Any]:
        assert not self.closed, "a job was submitted after close()"
        d: Deferred[Any] = Deferred()
        self.jobs.append((fn, transaction, d))
        return d

    def release(self) -> None:
        while self.jobs:
            fn, transaction, d = self.jobs.pop(0)
            self.sync.run(fn, transaction=transaction).chainDeferred(d)

    def close(self) -> Deferred[None]:
        self.closed = True
        return self.sync.close()


def _sample(model: str) -> RequestSample:
    return RequestSample(model, "llm", (10.0, 5.0), 100.0, "ok", 1000)


def _store() -> tuple[Store, HeldRunner]:
    runner = HeldRunner()
    runner.sync.run(_prepare, transaction=False)
    return Store(runner, Clock()), runner  # type: ignore[arg-type]


def test_close_writes_samples_that_queued_behind_a_write_under_way() -> None:
    store, runner = _store()
    first = store.record_request_sample(_sample("a"))  # write 1 under way
    second = store.record_request_sample(_sample("b"))  # waits for the next batch
    closed = store.close()
    assert not closed.called and not runner.closed
    runner.release()  # write 1 done -> batch 2 submitted -> released below
    runner.release()
    assert first.called and second.called and closed.called and runner.closed


def test_a_sample_after_close_is_dropped_at_info_not_failed() -> None:
    store, runner = _store()
    fired(store.close())
    seen: list[dict[str, Any]] = []
    globalLogPublisher.addObserver(seen.append)
    try:
        assert fired(store.record_request_sample(_sample("late"))) is None
    finally:
        globalLogPublisher.removeObserver(seen.append)
    assert [e["log_level"] for e in seen if e.get("log_namespace", "").startswith("routerd.store")] == \
        [LogLevel.info]


def test_stopping_an_interval_service_waits_for_the_call_under_way() -> None:
    clock = Clock()
    running: list[Deferred[None]] = []

    def work() -> Deferred[None]:
        running.append(Deferred())
        return running[-1]

    service = IntervalService("cost refit", work, 60.0, clock, now=True)
    service.startService()
    assert len(running) == 1
    stopped = service.stopService()
    assert stopped is not None and not stopped.called  # the refit still reads the store
    running[0].callback(None)
    assert stopped.called
    clock.advance(120)
    assert len(running) == 1  # no call after the stop


def test_stopping_an_idle_interval_service_is_immediate() -> None:
    service = IntervalService("cost refit", lambda: None, 60.0, Clock(), now=True)
    service.startService()
    assert service.stopService() is None
