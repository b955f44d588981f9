"""Where a node's measurements go: request and load samples into the router database (the cost fits
read them), the metrics and analytics' load rows, and the clock of this node's own work (its idle
time, which lending's probes read; borrowed work does not reset it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from routerd.backends.runtimes import LoadEvent
from routerd.metrics import NodeMetrics
from routerd.routing.call import Call
from routerd.store.samples import LoadSample, RequestSample

log = Logger()


class _SampleStore(Protocol):
    def add_request_sample(self, sample: RequestSample) -> object: ...

    def record_load_sample(self, sample: LoadSample) -> object: ...

    def save_public_id(self, identity: str, base: str, public_id: str) -> object: ...


class _LoadRecorder(Protocol):
    def load(self, *, model_id: str, config_filename: str, runtime: str, ok: bool, duration_ms: float,
             reason: str) -> None: ...


class Measurements:
    """The sample sink ``LocalInference`` and ``Runtimes`` report to."""

    def __init__(self, clock: IReactorTime, metrics: NodeMetrics,
                 store: Callable[[], _SampleStore | None], analytics: _LoadRecorder | None = None) -> None:
        self.clock = clock
        self.metrics = metrics
        self.store = store
        self.analytics = analytics  # analytics rows and the failed-load list (inference.analytics)
        #: When this node's own work last ended (or a non-borrowed load); idle-for counts from it.
        self.own_work_at = clock.seconds()
        #: Told of each load as it ends (the rack telemetry's attention rules).
        self.load_observers: list[Callable[[LoadEvent], None]] = []

    def own_work_done(self) -> None:
        self.own_work_at = self.clock.seconds()

    def finished(self, call: Call) -> None:
        """A request left the backend; own work (not borrowed) resets the idle clock."""
        if not call.borrowed:
            self.own_work_done()

    def record_request_sample(self, sample: RequestSample) -> None:
        """A finished request: its text metrics, and its sample into the router database (written
        in the store's next batch; nobody waits for it)."""
        if sample.section == "llm" and sample.status == "ok" and len(sample.work) == 2:
            self.metrics.observe_text_request(sample.model_id, sample.work[0], sample.work[1],
                                              sample.duration_ms / 1000)
        store = self.store()
        if store is not None:
            store.add_request_sample(sample)

    def save_public_id(self, identity: str, base: str, public_id: str) -> None:
        store = self.store()
        if store is not None:
            store.save_public_id(identity, base, public_id)

    def on_load(self, event: LoadEvent) -> None:
        """A backend load ended: metrics, a log line and a load sample (its duration prices switches)."""
        status = "ok" if event.ok else "failed"
        self.metrics.loads.labels(event.model_id, event.kind, status).inc()
        if event.ok:
            self.metrics.load_duration.labels(event.model_id, event.kind).observe(event.duration_ms / 1000)
            log.info("loaded {model} on the {runtime} runtime in {duration_ms} ms",
                     model=event.model_id, runtime=event.kind, duration_ms=event.duration_ms)
        else:
            log.warn("loading {model} on the {runtime} runtime failed: {reason}",
                     model=event.model_id, runtime=event.kind, reason=event.reason)
        if self.analytics is not None:
            self.analytics.load(model_id=event.model_id, config_filename=event.config_filename,
                                runtime=event.kind, ok=event.ok, duration_ms=event.duration_ms,
                                reason=event.reason)
        for observer in self.load_observers:
            observer(event)
        store = self.store()
        if store is not None:
            store.record_load_sample(LoadSample(
                config_filename=event.config_filename, model_id=event.model_id, runtime=event.kind,
                duration_ms=event.duration_ms, status=status,
                finished_at_ms=int(self.clock.seconds() * 1000), reason=event.reason))


__all__ = ["Measurements"]
