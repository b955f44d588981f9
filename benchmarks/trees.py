"""Routerd's own CPU per request, source tree against source tree, beside the naive floor, in one run.

Each ``--tree NAME=DIR`` is a checkout (a git worktree of any commit) whose ``routerd`` package is
run: one node per tree, started through ``benchmarks/tree_node.py`` with DIR first on ``sys.path``,
each with the shape ``benchmarks/overhead.py`` uses (one node, the embedded default config plus a
models folder, every feature on its default, one zero-delay simulator model ``zero``).  Every
node's backend is the simulator of the venv running this script (the same code for every tree,
so only routerd differs).  The naive Klein + treq proxy (``benchmarks/naive_proxy.py``) runs in
front of the first tree's backend as the floor.

Cells: 1, 16 and 64 concurrent clients of non-streaming chat, and one client of 20-chunk streams.
Load comes from ``wrk`` (one thread, keep-alive; streams too) when it is installed, else from the
Python client (``--python`` forces it). CPU is the proxy process's own run time, every thread, from
/proc/PID/task/*/schedstat (nanoseconds; the backend children are not counted). Within a cell,
rounds alternate the paths (A B C floor A B C floor ...) so the machine's drifting load hits each
alike, and every ratio is taken inside one round: each tree ÷ the first tree (the reference) and
each ÷ the floor; the summary gives each ratio's median and min-max over the rounds. On a shared,
loaded machine read the ratios, not the absolute times.

``--profile DIR`` adds a pass after the timed rounds: every node was started with cProfile
windows armed (``ROUTERD_BENCH_PROFILE``), each cell is run again per tree inside windows,
and the top functions by own time are printed per request (calls/request, own µs/request), then
the entries whose own time differs most between each tree and the reference.  The raw stats stay
in DIR (``NAME.N``, N in cell order) for ``python -m pstats``.  The profiler's clock is the node's
main-thread CPU time (``benchmarks/tree_node.py``), so time spent waiting for a core on a loaded
machine is charged to no function; the clock's own cost is measured and taken off every entry.
Profiled runs are several times slower than the timed rounds: compare them with each other only.

Run: .venv/bin/python benchmarks/trees.py --tree before-wave=/work/wt/t4a8d --tree now=/work/wt/t98f9 \
         [--seconds 5] [--rounds 3] [--concurrency 1,16,64] [--python] [--profile /tmp/prof] [--top 20]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (  # noqa: E402
    NodeProcess,
    client,
    free_port,
    have_wrk,
    measure,
    run,
    run_load,
    tempdir,
    write_node,
)
from overhead import BODY, NAIVE, STREAM, ZERO, stream_cell  # noqa: E402
from profile_tables import report  # noqa: E402

WRAPPER = Path(__file__).resolve().parent / "tree_node.py"
MODELS = {"zero": {"model": "../weights/zero.sim.json", "contextsize": 4096, "parallel": 64}}
FLOOR = "floor"


class TreeNode(NodeProcess):
    """One routerd node run from the source tree ``tree`` (its own ``routerd`` package and twistd
    plugin), in a folder of its own under ``root``."""

    def __init__(self, name: str, tree: Path, root: Path, profile: Path | None, logs: bool,
                 launch: tuple[str, ...] = (), env_extra: dict[str, str] | None = None) -> None:
        """``launch``: a command the node runs under (``benchmarks/work.py``: valgrind);
        ``env_extra``: more environment for it."""
        port = free_port()
        folder = root / name
        cfg = write_node(folder, port, MODELS, {"zero": ZERO})
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        if profile is not None:
            env["ROUTERD_BENCH_PROFILE"] = str(profile / name)
        env.update(env_extra or {})
        out = (folder / "node.log").open("wb") if logs else subprocess.DEVNULL
        self.name, self.port, self.url = name, port, f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen([*launch, sys.executable, str(WRAPPER), str(tree), "-n", "--pidfile=",
                                      "routerd", "--config", str(cfg)],
                                     cwd=folder, stdout=out, stderr=subprocess.STDOUT, env=env)
        self.windows = 0

    def load_backend(self) -> str:
        """Load the model ``zero``; the URL of the backend the node started for it."""
        load = json.dumps({"model": "zero"}).encode()
        req = urllib.request.Request(self.url + "/router/v1/load", data=load)
        urllib.request.urlopen(req, timeout=60).read()
        state = json.loads(urllib.request.urlopen(self.url + "/router/v1/state", timeout=10).read())
        return f"http://127.0.0.1:{[r for r in state['runtimes'] if r['kind'] == 'text'][0]['port']}"

    def profiled(self, prefix: Path) -> Path:
        """The stats file the next profile window writes."""
        return prefix / f"{self.name}.{self.windows + 1}"


# (label, body, concurrency)
CellSpec = tuple[str, dict[str, Any], int]


def _specs(levels: list[int]) -> list[CellSpec]:
    return [(f"c={c}", BODY, c) for c in levels] + [("stream", STREAM, 1)]


def run_seconds(pid: int) -> float:
    """CPU seconds of every thread of ``pid``, to the nanosecond: the scheduler's run time
    (/proc/PID/task/*/schedstat).  utime+stime (``_harness.cpu_seconds``) are counted in 10 ms clock
    ticks charged to whoever runs at the tick: over a few seconds of a cell that sampling alone
    moves a figure by ten per cent."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
    return total / 1e9


async def cpu_of(http: Any, url: str, pid: int, spec: CellSpec,
                 args: argparse.Namespace) -> tuple[float, int, int]:
    """(CPU seconds per request, requests, non-2xx) of one run of one cell against one path."""
    label, body, conc = spec
    start = run_seconds(pid)
    if args.wrk or label != "stream":
        cell = await measure(http, url, body, conc, pid=None, seconds=args.seconds if args.wrk else None,
                             requests=args.requests)
        count, errors = cell.count, cell.errors
    else:
        _ttfc, _cpu, errors = await stream_cell(http, url, args.streams, None)
        count = args.streams
    return (run_seconds(pid) - start) / max(1, count), count, errors


def _span(values: list[float]) -> str:
    return f"{statistics.median(values):5.2f} ({min(values):.2f}-{max(values):.2f})"


async def timed(http: Any, paths: dict[str, tuple[str, int]], trees: list[str], specs: list[CellSpec],
                args: argparse.Namespace) -> None:
    ref = trees[0]
    cpus: dict[tuple[str, str], list[float]] = {}
    ratios: dict[tuple[str, str, str], list[float]] = {}  # (cell, tree, "ref"|"floor") -> per round
    names = [*trees, FLOOR]
    print(f"load: {'wrk' if args.wrk else 'python client'}; {args.rounds} rounds; CPU = the proxy process "
          "alone (/proc schedstat run time), ms per request (per stream for 'stream')")
    heads = "".join(f" {n[:12]:>12}" for n in names)
    heads += "".join(f" {n[:9] + '÷ref':>13}" for n in trees[1:])
    heads += "".join(f" {n[:8] + '÷floor':>14}" for n in trees)
    print(f"{'cell':>6} {'rnd':>3}{heads}")
    for spec in specs:
        label = spec[0]
        for rnd in range(1, args.rounds + 1):
            got: dict[str, float] = {}
            bad: list[str] = []
            for name in names:
                url, pid = paths[name]
                cpu, count, errors = await cpu_of(http, url, pid, spec, args)
                got[name] = cpu
                cpus.setdefault((label, name), []).append(cpu)
                if errors:
                    bad.append(f"{name}: {errors} of {count} failed")
            row = "".join(f" {got[n] * 1000:12.3f}" for n in names)
            for name in trees[1:]:
                ratios.setdefault((label, name, "ref"), []).append(got[name] / got[ref])
                row += f" {got[name] / got[ref]:13.2f}"
            for name in trees:
                ratios.setdefault((label, name, "floor"), []).append(got[name] / got[FLOOR])
                row += f" {got[name] / got[FLOOR]:14.2f}"
            print(f"{label:>6} {rnd:>3}{row}" + (f"   ({'; '.join(bad)})" if bad else ""))
    print(f"summary: median over {args.rounds} rounds (min-max); reference = {ref}")
    for spec in specs:
        label = spec[0]
        parts = [f"{n} {statistics.median(cpus[(label, n)]) * 1000:.3f} ms" for n in names]
        print(f"  {label:>6}: " + ", ".join(parts))
        for name in trees:
            ref_part = f"÷{ref} {_span(ratios[(label, name, 'ref')])}, " if name != ref else ""
            print(f"  {'':>6}  {name:>14}: {ref_part}÷floor {_span(ratios[(label, name, 'floor')])}")


def idle(paths: dict[str, tuple[str, int]], seconds: float) -> None:
    """Each process's CPU at rest (its timers and loops), measured side by side: a cell's CPU per
    request includes this much per second of the cell, spread over its requests."""
    if seconds <= 0:
        return
    before = {name: run_seconds(pid) for name, (_url, pid) in paths.items()}
    time.sleep(seconds)
    rates = [f"{name} {(run_seconds(pid) - before[name]) * 1000 / seconds:.2f}"
             for name, (_url, pid) in paths.items()]
    print(f"idle CPU (ms per second, no load, {seconds:g} s): " + ", ".join(rates))


def _thread_cpu(pid: int) -> float:
    """CPU seconds (scheduler run time) of the process's threads other than the main one."""
    return run_seconds(pid) - int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9


async def profile(http: Any, nodes: dict[str, TreeNode], specs: list[CellSpec],
                  args: argparse.Namespace) -> None:
    """``--profile-rounds`` profile windows per cell and tree (trees alternating), listed in
    ``DIR/windows.json``; then the tables of ``benchmarks/profile_tables.py``."""
    prefix: Path = args.profile
    windows: list[dict[str, Any]] = []
    print(f"profile pass (cProfile windows on the main thread's CPU clock, stats in {prefix})")
    for spec in specs:
        for name, node in [item for _ in range(args.profile_rounds) for item in nodes.items()]:
            pid = node.proc.pid
            target = node.profiled(prefix)
            threads0 = _thread_cpu(pid)
            os.kill(pid, signal.SIGUSR1)
            time.sleep(0.2)
            cpu, count, errors = await cpu_of(http, node.url + "/v1/chat/completions", pid, spec, args)
            os.kill(pid, signal.SIGUSR2)
            node.windows += 1
            for _ in range(300):
                if target.exists() and target.stat().st_size:
                    break
                time.sleep(0.1)
            time.sleep(0.5)  # let the dump finish
            threads = (_thread_cpu(pid) - threads0) / max(1, count)
            print(f"[{spec[0]}] {name}: {count} requests, {errors} failed; threads other than the main one "
                  f"{threads * 1e6:.0f} µs/request (not profiled)")
            windows.append({"cell": spec[0], "tree": name, "stats": str(target), "requests": count,
                            "cpu_ms": cpu * 1000})
    (prefix / "windows.json").write_text(json.dumps(windows, indent=1))
    report(windows, args.top, args.top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=DIR",
                        help="a source tree to run (repeat; the first is the reference)")
    parser.add_argument("--seconds", type=float, default=5, help="seconds per wrk cell")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every cell")
    parser.add_argument("--requests", type=int, default=2000, help="requests per cell (Python client)")
    parser.add_argument("--streams", type=int, default=300, help="streams per stream cell (Python client)")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--python", action="store_true", help="use the Python client even if wrk exists")
    parser.add_argument("--profile", type=Path, default=None, metavar="DIR",
                        help="after the timed rounds, profile each tree per cell; stats written to DIR")
    parser.add_argument("--idle", type=float, default=10,
                        help="seconds of the idle CPU measurement (0: none)")
    parser.add_argument("--profile-rounds", type=int, default=2,
                        help="profile windows per cell and tree (trees alternating; added up)")
    parser.add_argument("--top", type=int, default=20, help="profile entries printed per table")
    parser.add_argument("--node-logs", action="store_true", help="keep each node's log in its folder")
    args = parser.parse_args()
    args.wrk = not args.python and have_wrk()
    trees: dict[str, Path] = {}
    for item in args.tree:
        name, _, folder = item.partition("=")
        if not folder or not (Path(folder) / "routerd" / "__init__.py").exists() or name in (*trees, FLOOR):
            parser.error(f"--tree {item!r}: want a new NAME=DIR, DIR holding a routerd package")
        trees[name] = Path(folder).resolve()
    specs = _specs([int(c) for c in args.concurrency.split(",")])
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    root = tempdir()
    nodes: dict[str, TreeNode] = {}
    naive: subprocess.Popen[bytes] | None = None
    try:
        for name, folder in trees.items():
            nodes[name] = TreeNode(name, folder, root, args.profile, args.node_logs)
        backends = {}
        for name, node in nodes.items():
            node.wait_ready()
            backends[name] = node.load_backend()
        naive_port = free_port()
        naive = subprocess.Popen([sys.executable, str(NAIVE), str(naive_port), next(iter(backends.values()))],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        NodeProcess.wait_url(f"http://127.0.0.1:{naive_port}/health")
        paths = {name: (node.url + "/v1/chat/completions", node.proc.pid) for name, node in nodes.items()}
        paths[FLOOR] = (f"http://127.0.0.1:{naive_port}/v1/chat/completions", naive.pid)
        print("trees: " + ", ".join(f"{n}={d}" for n, d in trees.items()) + f"; floor in front of {backends}")

        async def go() -> None:
            http = client()
            for url, _pid in paths.values():  # warm every path
                await run_load(http, url, BODY, 8, 300)
                await stream_cell(http, url, 20, None)
            idle(paths, args.idle)
            if args.rounds:
                await timed(http, paths, list(trees), specs, args)
            if args.profile is not None:
                await profile(client(), nodes, specs, args)

        run(go)
    finally:
        if naive is not None:
            naive.terminate()
            naive.wait(10)
        for node in nodes.values():
            node.stop()


if __name__ == "__main__":
    main()
