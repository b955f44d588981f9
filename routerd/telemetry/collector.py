"""A node's telemetry reading (:class:`~routerd.wire.telemetry.NodeTelemetry`), taken at the master's health
poll and on nothing else: no request pays for it.

:class:`Telemetry` reads the host (CPU, memory), the GPUs (NVML), each runtime (state, queue, loads) and the
counters of each ready llama-server (its ``/metrics``, at most :data:`SCRAPE_TIMEOUT_S`), and applies the
attention rules.  A master refreshes its own reading at each health poll (:meth:`Telemetry.refresh`, awaited
with the poll); a slave answers the poll's snapshot with its latest reading and starts the next
(:meth:`Telemetry.reading`), so the poll itself never waits for a backend.  A standalone node refreshes when
its site inventory is read.  A reader that fails (psutil, NVML, a backend) is reported in the reading and
never stops the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import attrs
from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from routerd.telemetry.attention import AttentionBook, RuntimeQueue
from routerd.telemetry.counters import METRICS_PATH, parse_llama_metrics
from routerd.wire.telemetry import (
    BackendCounters,
    GpuReport,
    HostReading,
    NodeTelemetry,
    RuntimeTelemetry,
    telemetry_to_json,
)

__all__ = ["MIN_GAP_S", "SCRAPE_TIMEOUT_S", "RuntimeInput", "Telemetry"]

log = Logger()

#: Longest a backend's ``/metrics`` may take before its counters are reported missing.
SCRAPE_TIMEOUT_S = 2.0
#: A reading asked for within this long of the previous one's start does not start another.
MIN_GAP_S = 1.0
#: The backends whose own counters are read (llama.cpp's server, started with ``--metrics``).
COUNTED_BACKENDS = frozenset({"llama-server"})


@attrs.frozen(kw_only=True)
class RuntimeInput:
    """One runtime slot as the node sees it now (``since``: the clock's seconds when it entered ``state``;
    ``waiting``: requests waiting for it, in the router's queue and at the slot)."""

    kind: str
    backend: str
    state: str
    model_id: str | None
    waiting: int
    since: float
    last_load_ms: int | None
    port: int | None


class _Reader(Protocol):
    def read(self) -> Any: ...


class _HTTPGetter(Protocol):
    def get(self, url: str, *, timeout: float | None = None) -> defer.Deferred[Any]: ...


class Telemetry:
    def __init__(self, *, clock: IReactorTime, host: _Reader | None, gpus: _Reader | None,
                 runtimes: Callable[[], Iterable[RuntimeInput]], http: _HTTPGetter,
                 failed_requests: Callable[[], int], book: AttentionBook | None = None) -> None:
        self.clock = clock
        self.host = host
        self.gpus = gpus
        self.runtimes = runtimes
        self.http = http
        self.failed_total = failed_requests
        self.book = book if book is not None else AttentionBook(clock)
        self.latest: NodeTelemetry | None = None
        self._counters: dict[str, BackendCounters | str] = {}
        self._running: defer.Deferred[NodeTelemetry] | None = None
        self._started_at: float | None = None

    # -- readings --------------------------------------------------------------------------------

    def refresh(self) -> defer.Deferred[NodeTelemetry]:
        """Take a reading now (the one already running, if any)."""
        if self._running is not None:
            return self._running
        self._started_at = self.clock.seconds()
        running = self._running = defer.Deferred.fromCoroutine(self._refresh())

        def done(result: Any) -> Any:
            self._running = None
            return result

        running.addBoth(done)
        return running

    def current(self) -> NodeTelemetry:
        """The latest reading (taken now, without backend counters, if there is none yet)."""
        if self.latest is None:
            self.latest = self._read(self.runtime_inputs())
        return self.latest

    def reading(self) -> NodeTelemetry:
        """:meth:`current`, and the next reading started unless one started within :data:`MIN_GAP_S`."""
        latest = self.current()
        started = self._started_at
        if self._running is None and (started is None or self.clock.seconds() - started >= MIN_GAP_S):
            self.refresh().addErrback(lambda f: log.failure("telemetry reading failed", failure=f))
        return latest

    def reading_json(self) -> dict[str, Any]:
        return telemetry_to_json(self.reading())

    def runtime_inputs(self) -> list[RuntimeInput]:
        return list(self.runtimes())

    async def _refresh(self) -> NodeTelemetry:
        runtimes = self.runtime_inputs()
        counted = [r for r in runtimes if r.backend in COUNTED_BACKENDS and r.state == "ready" and r.port]
        answers = await defer.DeferredList([defer.Deferred.fromCoroutine(self._scrape(r.port or 0))
                                            for r in counted], consumeErrors=True)
        self._counters = {r.kind: (value if ok else "reading failed")
                          for r, (ok, value) in zip(counted, answers, strict=True)}
        self.latest = self._read(runtimes)
        return self.latest

    async def _scrape(self, port: int) -> BackendCounters | str:
        try:
            response = await self.http.get(f"http://127.0.0.1:{port}{METRICS_PATH}", timeout=SCRAPE_TIMEOUT_S)
            body = bytes(await response.content())
        except Exception as exc:  # noqa: BLE001 - a backend that does not answer reads as no counters
            return f"no answer from /metrics: {exc.__class__.__name__}"
        if response.code == 501:
            return "the backend was started without --metrics"
        if response.code != 200:
            return f"/metrics answered {response.code}"
        try:
            return parse_llama_metrics(body.decode("utf-8", "replace"))
        except ValueError as exc:
            return f"/metrics is not Prometheus text: {exc}"

    def _read(self, runtimes: list[RuntimeInput]) -> NodeTelemetry:
        now = self.clock.seconds()
        host: HostReading | None = None
        host_error = "" if self.host is not None else "host telemetry is unavailable (psutil)"
        if self.host is not None:
            try:
                host = self.host.read()
            except Exception as exc:  # noqa: BLE001 - reported, never stops the reading
                host_error = f"{exc.__class__.__name__}: {exc}"
        gpu = GpuReport(state="none", reason="GPU telemetry is unavailable (nvidia-ml-py)")
        if self.gpus is not None:
            try:
                gpu = self.gpus.read()
            except Exception as exc:  # noqa: BLE001 - reported, never stops the reading
                gpu = GpuReport(state="error", reason=f"{exc.__class__.__name__}: {exc}")
        failed = self.book.failed_requests(self.failed_total())
        views = [self._runtime(r, self._counters) for r in runtimes]
        flags = self.book.flags((RuntimeQueue(r.kind, r.queue_depth) for r in views), failed)
        return NodeTelemetry(taken_ms=int(now * 1000), window_s=self.book.window_s, host=host,
                             host_error=host_error, gpu=gpu, runtimes=tuple(views), failed_requests=failed,
                             attention=flags)

    def _runtime(self, r: RuntimeInput, counters: Mapping[str, BackendCounters | str]) -> RuntimeTelemetry:
        counts = self.book.counts(r.kind)
        found = counters.get(r.kind) if r.state == "ready" else None
        return RuntimeTelemetry(
            kind=r.kind, backend=r.backend, state=r.state, model_id=r.model_id, queue_depth=r.waiting,
            loaded_since_ms=int(r.since * 1000) if r.state == "ready" else None, last_load_ms=r.last_load_ms,
            loads=counts.loads, failed_loads=counts.failed_loads,
            counters=found if isinstance(found, BackendCounters) else None,
            counters_error=found if isinstance(found, str) else "")
