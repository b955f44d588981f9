"""The node's telemetry (:mod:`routerd.telemetry`) over its runtimes, router queues and request counters,
and its host gauges in /metrics."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from twisted.logger import Logger

from routerd.backends.runtimes import LoadEvent
from routerd.metrics import NodeMetrics
from routerd.telemetry.collector import RuntimeInput, Telemetry
from routerd.telemetry.gauges import HostGauges
from routerd.telemetry.host import HostReader, NvmlGpus

__all__ = ["build_telemetry", "runtime_inputs"]

log = Logger()


class _Slot(Protocol):
    name: str

    def status(self) -> Any: ...


def runtime_inputs(slots: Iterable[_Slot], held: Iterable[dict[str, Any]]) -> list[RuntimeInput]:
    """Each slot now; its queue is the requests waiting at the slot and those the router holds for its
    lane (queued or held here, not those lent to a helper)."""
    waiting = Counter(str(row.get("lane")) for row in held if row.get("state") in ("queued", "held"))
    out = []
    for slot in slots:
        s = slot.status()
        out.append(RuntimeInput(kind=s.kind, backend=slot.name, state=s.state, model_id=s.model_id,
                                waiting=s.waiters + waiting.get(s.kind, 0), since=s.since,
                                last_load_ms=s.last_load_ms, port=s.port))
    return out


def _reader(make: Callable[[], Any], what: str) -> Any:
    try:
        return make()
    except Exception as exc:  # noqa: BLE001 - the reading says it is missing; the node runs on
        log.warn("{what} telemetry is unavailable: {reason}", what=what, reason=str(exc))
        return None


def build_telemetry(*, clock: Any, slots: Callable[[], Iterable[_Slot]],
                    held: Callable[[], Iterable[dict[str, Any]]], http: Any, metrics: NodeMetrics,
                    observe_loads: list[Callable[[LoadEvent], None]]) -> Telemetry:
    """The node's telemetry: fed each load as it ends, its host figures in /metrics."""
    telemetry = Telemetry(clock=clock, host=_reader(HostReader, "host"), gpus=_reader(NvmlGpus, "GPU"),
                          runtimes=lambda: runtime_inputs(slots(), held()), http=http,
                          failed_requests=metrics.failed_requests)
    book = telemetry.book
    observe_loads.append(lambda event: book.load(event.kind, event.model_id, event.ok))
    metrics.registry.register(HostGauges(lambda: telemetry.latest))
    return telemetry
