"""Tables of the profile windows ``benchmarks/trees.py --profile DIR`` wrote: where each tree spends.

Per cell and tree: the top functions by own time per request (calls/request, own µs/request), then,
against the first tree, the entries whose own time differs most, then every ``routerd`` module with
the time of the library code it calls (built-ins, attrs-generated methods, json, prometheus_client,
Twisted calls made from routerd code) charged to it, so a module's figure is what it costs whoever
does the work.  Time no routerd frame asked for (the reactor's loop, socket calls the reactor makes)
stays under ``(framework)``.

The profiler's clock is the node's main-thread CPU time (``benchmarks/tree_node.py``); its own cost
per profiled interval, measured at each window's start, is taken off every entry, the same figure
(the median of the pass's windows) for every tree so their totals compare.  Profiled time is several
times the unprofiled cost: read the shares and the differences, not the absolute µs.

Run: .venv/bin/python benchmarks/profile_tables.py DIR [--top 20] [--modules 25]
(DIR holds ``windows.json`` and the stats ``trees.py`` wrote)
"""

from __future__ import annotations

import argparse
import json
import pstats
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

Entry = tuple[float, float]  # calls per request, own µs per request
FRAMEWORK = "(framework)"


def where(filename: str) -> str:
    """A profile entry's file, shortened the same way for every tree (``routerd/serve/front.py``,
    ``twisted/web/http.py``, ``~`` for built-ins)."""
    if filename == "~":
        return "~"
    for mark in ("/site-packages/", "/lib/python3"):
        if mark in filename:
            tail = filename.split(mark, 1)[1]
            return tail.split("/", 1)[1] if mark == "/lib/python3" and "/" in tail else tail
    if "/routerd/" in filename:
        return "routerd/" + filename.rsplit("/routerd/", 1)[1]
    return filename


def _module(filename: str) -> str | None:
    """The routerd module an entry belongs to (attrs-generated methods to their class's module)."""
    if filename.startswith("<attrs generated") and " routerd." in filename:
        dotted = filename.split(" routerd.", 1)[1].rstrip(">").rsplit(".", 1)[0]
        return "routerd/" + dotted.replace(".", "/") + ".py"
    short = where(filename)
    return short if short.startswith("routerd/") else None


def clock_cost(paths: list[Path]) -> float:
    """The pass's profiler clock cost (ns per interval): the median of its windows'."""
    found = [float(Path(f"{p}.cal").read_text()) for p in paths if Path(f"{p}.cal").exists()]
    return statistics.median(found) if found else 0.0


def _net(stats: dict[Any, Any], clock_ns: float) -> dict[Any, float]:
    """Each entry's own seconds less the clock's cost: one interval per call of its own plus one
    after each call it makes."""
    made: dict[Any, int] = defaultdict(int)
    for _cc, _nc, _tt, _ct, callers in stats.values():
        for caller, (_ccc, ncalls, *_rest) in callers.items():
            made[caller] += ncalls
    cost = clock_ns * 1e-9
    return {entry: max(0.0, row[2] - (row[1] + made[entry]) * cost) for entry, row in stats.items()}


def _stats(paths: list[Path]) -> dict[Any, Any]:
    """The windows' stats, added up."""
    return pstats.Stats(*[str(p) for p in paths]).stats  # type: ignore[attr-defined, no-any-return]


def functions(paths: list[Path], requests: int, clock_ns: float) -> dict[str, Entry]:
    """Calls and own µs per request, keyed ``file:function`` (same names in one file summed: line
    numbers differ between trees)."""
    stats = _stats(paths)
    net = _net(stats, clock_ns)
    out: dict[str, Entry] = {}
    for entry, row in stats.items():
        key = f"{where(entry[0])}:{entry[2]}"
        calls, own = out.get(key, (0.0, 0.0))
        out[key] = (calls + row[1] / requests, own + net[entry] * 1e6 / requests)
    return out


def modules(paths: list[Path], requests: int, clock_ns: float) -> dict[str, float]:
    """µs per request per routerd module, with the library code it calls (split among an entry's
    callers by the time each call took, up the stack to the first routerd frame)."""
    stats = _stats(paths)
    net = _net(stats, clock_ns)
    out: dict[str, float] = defaultdict(float)
    pending: dict[Any, float] = {}
    for entry, seconds in net.items():
        module = _module(entry[0])
        if module is not None:
            out[module] += seconds
        else:
            pending[entry] = seconds
    for _ in range(30):  # up the stack; what is left after that many hops is the framework's
        pushed: dict[Any, float] = defaultdict(float)
        for entry, seconds in pending.items():
            callers = stats[entry][4]
            weights = {c: v[2] for c, v in callers.items()}
            total = sum(weights.values())
            if not total:
                weights = {c: float(v[1]) for c, v in callers.items()}
                total = sum(weights.values())
            if not total:
                out[FRAMEWORK] += seconds
                continue
            for caller, weight in weights.items():
                share = seconds * weight / total
                module = _module(caller[0])
                if module is not None:
                    out[module] += share
                else:
                    pushed[caller] += share
        pending = pushed
        if not pending:
            break
    out[FRAMEWORK] += sum(pending.values())
    return {k: v * 1e6 / requests for k, v in out.items()}


def report(windows: list[dict[str, Any]], top: int, rows: int) -> None:
    """Print the tables of ``windows`` (``cell``, ``tree``, ``stats``, ``requests``, ``cpu_ms``), the
    first tree of each cell as the reference; the windows of one cell and tree are added up."""
    clock_ns = clock_cost([Path(w["stats"]) for w in windows])
    print(f"profiler clock cost taken off: {clock_ns:.0f} ns per interval (median of the windows)")
    cells = list(dict.fromkeys(w["cell"] for w in windows))
    for cell in cells:
        names = list(dict.fromkeys(w["tree"] for w in windows if w["cell"] == cell))
        ref = names[0]
        tables: dict[str, dict[str, Entry]] = {}
        mods: dict[str, dict[str, float]] = {}
        for name in names:
            mine = [w for w in windows if w["cell"] == cell and w["tree"] == name]
            paths = [Path(w["stats"]) for w in mine]
            requests = sum(w["requests"] for w in mine)
            tables[name] = table = functions(paths, requests, clock_ns)
            mods[name] = modules(paths, requests, clock_ns)
            total = sum(own for _calls, own in table.values())
            calls = sum(c for c, _own in table.values())
            cpu = sum(w["cpu_ms"] * w["requests"] for w in mine) / max(1, requests)
            print(f"\n[{cell}] {name}: {requests} requests in {len(mine)} windows; {cpu:.3f} ms CPU/request "
                  f"under the profiler; profiled {total:.0f} µs and {calls:.0f} calls per request")
            print(f"  {'calls':>7} {'own µs':>8}  function")
            for key, (c, own) in sorted(table.items(), key=lambda kv: -kv[1][1])[:top]:
                print(f"  {c:7.2f} {own:8.2f}  {key}")
        for name in names[1:]:
            a, b = tables[ref], tables[name]
            keys = sorted(set(a) | set(b), key=lambda k: -abs(b.get(k, (0, 0))[1] - a.get(k, (0, 0))[1]))
            print(f"\n[{cell}] {name} against {ref}: largest differences in own µs/request")
            print(f"  {'calls ' + ref[:8]:>14} {'calls ' + name[:8]:>14} {'µs ' + ref[:8]:>11} "
                  f"{'µs ' + name[:8]:>11} {'Δ µs':>7}  function")
            for key in keys[:top]:
                ca, ta = a.get(key, (0.0, 0.0))
                cb, tb = b.get(key, (0.0, 0.0))
                print(f"  {ca:14.2f} {cb:14.2f} {ta:11.2f} {tb:11.2f} {tb - ta:+7.2f}  {key}")
        every = sorted(set().union(*mods.values()),
                       key=lambda m: -max(abs(mods[n].get(m, 0.0) - mods[ref].get(m, 0.0)) for n in names))
        print(f"\n[{cell}] µs/request per module with the library code it calls (Δ against {ref})")
        totals = {n: sum(mods[n].values()) for n in names}
        print("  " + "".join(f"{n[:11]:>12}" for n in names)
              + "".join(f"{'Δ ' + n[:9]:>12}" for n in names[1:]) + "  module")
        print("  " + "".join(f"{totals[n]:12.1f}" for n in names)
              + "".join(f"{totals[n] - totals[ref]:+12.1f}" for n in names[1:]) + "  (all)")
        for m in every[:rows]:
            print("  " + "".join(f"{mods[n].get(m, 0.0):12.1f}" for n in names)
                  + "".join(f"{mods[n].get(m, 0.0) - mods[ref].get(m, 0.0):+12.1f}" for n in names[1:])
                  + f"  {m}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("folder", type=Path, help="the --profile DIR of a trees.py run")
    parser.add_argument("--top", type=int, default=20, help="functions per table")
    parser.add_argument("--modules", type=int, default=25, help="modules per table")
    args = parser.parse_args()
    report(json.loads((args.folder / "windows.json").read_text()), args.top, args.modules)


if __name__ == "__main__":
    main()
