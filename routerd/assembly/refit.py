"""The node's periodic cost refit: its own coefficients fitted from its own samples, the fit itself
off the reactor thread (``lending.pricing.fit_node``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from routerd.lending.pricing import fit_node
from routerd.lending.service import LendingService
from routerd.services import IntervalService
from routerd.store.store import Store

#: The newest samples of each (model, section) a fit reads: the window may hold millions
#: on a busy node (24 h at 1,000 requests/s); a robust linear fit of the latest few thousand is as
#: tight, and a refit then costs the same at every load instead of growing with the window.
FIT_SAMPLES = 4000


def fit_sample_bound(min_samples: int) -> int:
    """How many of the newest samples of each (model, section) a refit reads: ``FIT_SAMPLES``, or
    ``scheduling_min_samples`` when that is higher (it accepts up to 100,000; a lower read would
    leave every model unpriced for good)."""
    return max(FIT_SAMPLES, int(min_samples))


class CostRefit(IntervalService):
    """Runs :meth:`refit` now and every ``scheduling_refresh_interval`` (set again on a settings
    change through ``set_interval``)."""

    def __init__(self, clock: Any, *, store: Callable[[], Store | None], lending: LendingService,
                 run_in_thread: Callable[..., Any], interval: float) -> None:
        super().__init__("cost refit", self.refit, interval, clock, now=True)
        self.store, self.lending, self.run_in_thread = store, lending, run_in_thread

    async def refit(self) -> None:
        """Fit this node's own cost coefficients from its own samples (off the reactor thread)."""
        store = self.store()
        if store is None:
            return
        lending = self.lending
        settings = lending.settings
        now_ms = int(self.clock.seconds() * 1000)
        since = now_ms - int(settings.scheduling_sample_window * 1000)
        samples = []
        newest = fit_sample_bound(settings.scheduling_min_samples)
        for section in ("image", "llm"):
            samples.extend(await store.request_samples(None, section, since, newest=newest))
        loads = await store.load_samples(since)
        lending.update_costs(await self.run_in_thread(fit_node, samples, loads, settings, now_ms))
