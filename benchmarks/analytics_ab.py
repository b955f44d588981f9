"""Analytics on against off, in one routerd process (issue 22; run by ``benchmarks/overhead.py``).

The node ``overhead.py`` measures is switched between ``analytics.enabled: false`` and ``true`` by
rewriting its YAML and reloading it (``analytics.*`` applies live), cell by cell, off then on, so
both sides of a ratio share the process, its backend, its connections and the moment.  The reload
and what it starts in the background happen before a cell's CPU is read; the rows an ``on`` cell
buffered are written (``POST /router/v1/site/analytics/flush``, with their rollups) inside it, so
its CPU includes writing what it recorded.  Target: CPU per request with analytics on <= 1.10 x off.
"""

from __future__ import annotations

import json
import statistics
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from _harness import cpu_seconds

#: Seconds a reload is given to settle (asset index, resolve) before a cell starts.
SETTLE_S = 2.0

Load = Callable[[], Awaitable[int]]  # one cell's load on the node; returns the requests it made


class Analytics:
    """Switches a node's ``analytics.enabled`` through its YAML and a reload; writes its rows."""

    def __init__(self, cfg: Path, url: str) -> None:
        self.cfg, self.url = cfg, url

    def _post(self, path: str) -> Any:
        request = urllib.request.Request(self.url + path, data=b"{}", method="POST")
        return json.loads(urllib.request.urlopen(request, timeout=60).read())

    def switch(self, on: bool) -> None:
        data = json.loads(self.cfg.read_text())
        data["analytics"] = {"enabled": on}
        self.cfg.write_text(json.dumps(data))
        answer = self._post("/router/v1/reload")
        if answer.get("restart_required"):
            raise RuntimeError(f"analytics did not apply live: {answer}")
        time.sleep(SETTLE_S)

    def flush(self) -> None:
        self._post("/router/v1/site/analytics/flush")


async def cpu_per_request(analytics: Analytics, pid: int, on: bool, load: Load) -> float:
    """CPU seconds per request of one cell with analytics ``on`` or off."""
    analytics.switch(on)
    cpu0 = cpu_seconds(pid)
    count = await load()
    if on:
        analytics.flush()  # writing what the cell recorded is the cell's cost
    return (cpu_seconds(pid) - cpu0) / max(1, count)


async def compare(analytics: Analytics, pid: int, cells: list[tuple[str, Load]], rounds: int) -> None:
    """Print, per cell and round, CPU per request off and on and their ratio; then each cell's median."""
    print("analytics on ÷ off, same routerd process (CPU per request, ms; issue 22 target <= 1.10):")
    print(f"{'cell':>8} {'rnd':>3} {'off':>8} {'on':>8} {'ratio':>6}")
    ratios: dict[str, list[float]] = {}
    for name, load in cells:
        for rnd in range(1, rounds + 1):
            off = await cpu_per_request(analytics, pid, False, load)
            on = await cpu_per_request(analytics, pid, True, load)
            ratio = on / off if off else float("nan")
            ratios.setdefault(name, []).append(ratio)
            print(f"{name:>8} {rnd:>3} {off * 1000:8.3f} {on * 1000:8.3f} {ratio:6.2f}")
    analytics.switch(False)
    for name, values in ratios.items():
        print(f"{name:>8} median {statistics.median(values):.2f} "
              f"(min {min(values):.2f}, max {max(values):.2f})")


__all__ = ["Analytics", "compare", "cpu_per_request"]
