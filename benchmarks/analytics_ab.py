"""Analytics on against off, in one routerd process (run by ``benchmarks/overhead.py``).

The node ``overhead.py`` measures is switched between ``analytics.enabled: false`` and ``true`` by
rewriting its YAML and reloading it (``analytics.*`` applies live), cell by cell, off then on, so
both sides of a ratio share the process, its backend, its connections and the moment.  The reload
and what it starts in the background happen before a cell's CPU is read; the rows an ``on`` cell
buffered are written (``POST /router/v1/site/analytics/flush``, with their rollups) inside it, so
its CPU includes writing what it recorded.  Rounds alternate the order (off, on; then on, off) so
neither side always follows the other.  Target: CPU per request with analytics on <= 1.10 x off.

Run alone (a node of its own, more rounds): .venv/bin/python benchmarks/analytics_ab.py
[--seconds 5] [--rounds 10] [--streams 300] [--concurrency 1,16] [--python]
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
from zero_cells import BODY, ZERO, measure_cell, stream_cell

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
            if rnd % 2:
                off = await cpu_per_request(analytics, pid, False, load)
                on = await cpu_per_request(analytics, pid, True, load)
            else:
                on = await cpu_per_request(analytics, pid, True, load)
                off = await cpu_per_request(analytics, pid, False, load)
            ratio = on / off if off else float("nan")
            ratios.setdefault(name, []).append(ratio)
            print(f"{name:>8} {rnd:>3} {off * 1000:8.3f} {on * 1000:8.3f} {ratio:6.2f}")
    analytics.switch(False)
    for name, values in ratios.items():
        print(f"{name:>8} median {statistics.median(values):.2f} "
              f"(min {min(values):.2f}, max {max(values):.2f})")


def cells_of(http_client: Callable[[], Any], url: str, args: Any,
             levels: list[int]) -> list[tuple[str, Load]]:
    """overhead.py's cells at each concurrency, and its streams (a fresh client each time: pooled
    connections go stale while the other cells run)."""
    def cell(conc: int) -> Load:
        async def load() -> int:
            return (await measure_cell(http_client(), url, conc, args, None)).count
        return load

    async def streams() -> int:
        await stream_cell(http_client(), url, args.streams, None)
        return int(args.streams)

    return [*((f"c={conc}", cell(conc)) for conc in levels), ("stream", streams)]


def main() -> None:
    import argparse
    import shutil

    from _harness import NodeProcess, client, free_port, run, run_load, tempdir, write_node

    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5, help="seconds per wrk cell")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--requests", type=int, default=2000, help="requests per cell (Python client)")
    parser.add_argument("--streams", type=int, default=300)
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--python", action="store_true", help="use the Python client even if wrk exists")
    args = parser.parse_args()
    args.wrk = not args.python and shutil.which("wrk") is not None
    root, port = tempdir(), free_port()
    cfg = write_node(root, port, {"zero": {"model": "../weights/zero.sim.json", "contextsize": 4096,
                                           "parallel": 64}}, {"zero": ZERO})
    node = NodeProcess(cfg, port)
    try:
        node.wait_ready()
        load = json.dumps({"model": "zero"}).encode()
        request = urllib.request.Request(node.url + "/router/v1/load", data=load)
        urllib.request.urlopen(request, timeout=60).read()
        url = node.url + "/v1/chat/completions"

        async def measure() -> None:
            await run_load(client(), url, BODY, 8, 300)  # warm
            print(f"load: {'wrk' if args.wrk else 'python client'}; {args.rounds} rounds")
            levels = [int(c) for c in args.concurrency.split(",")]
            await compare(Analytics(cfg, node.url), node.proc.pid, cells_of(client, url, args, levels),
                          args.rounds)

        run(measure)
    finally:
        node.stop()


if __name__ == "__main__":
    main()


__all__ = ["Analytics", "cells_of", "compare", "cpu_per_request"]
