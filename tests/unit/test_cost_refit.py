"""The node's periodic cost refit (assembly.refit): how many samples it reads (issue 21 §3)."""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock

from routerd.assembly.refit import FIT_SAMPLES, CostRefit, fit_sample_bound
from routerd.config.lending import LendingSettings
from routerd.lending.service import LendingService
from routerd.store.samples import RequestSample
from routerd.store.store import Store
from tests.support import fired


def refit_with(min_samples: int, count: int) -> LendingService:
    clock = Clock()
    clock.advance(10_000)
    store = Store.open_sync(clock=clock)
    for i in range(count):
        prompt, gen = float(10 + i % 50), float(5 + i % 17)
        sample = RequestSample("llama", "llm", (prompt, gen), 20.0 + 0.5 * prompt + 8.0 * gen, "ok",
                               9_000_000 + i)
        store.record_request_sample(sample)
    lending = LendingService(node_id="n", settings=LendingSettings(scheduling_min_samples=min_samples),
                             clock=clock)

    def run_in_thread(f: Any, *args: Any) -> Deferred[Any]:
        return succeed(f(*args))

    refit = CostRefit(clock, store=lambda: store, lending=lending, run_in_thread=run_in_thread, interval=60)
    fired(Deferred.fromCoroutine(refit.refit()))
    return lending


def test_the_refit_reads_at_least_scheduling_min_samples_so_a_bound_above_4000_still_prices() -> None:
    """``scheduling_min_samples`` accepts up to 100,000 but the refit read only the newest 4,000
    samples, so 4,500 left every model unpriced forever: with 5,000 samples it now prices."""
    assert fit_sample_bound(20) == FIT_SAMPLES
    assert fit_sample_bound(4_500) == 4_500
    priced = refit_with(4_500, 5_000).costs.models
    assert [(m.model_id, m.samples) for m in priced] == [("llama", 4_500)]
    assert refit_with(20, 5_000).costs.models[0].samples == FIT_SAMPLES  # the usual bound stays
