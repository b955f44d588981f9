"""Replica choice: ``affinity`` against ``rotation`` (``routing.replica_choice``) on a master with two slaves
serving the same ``chat`` (one public ID, two replicas), every node a real routerd node in this process.

1. **Chat replay**: 16 sessions of 10 turns, the sessions concurrent, each turn sent when the session's
   previous answer came back, with the whole conversation so far (``X-Session-Id`` names the session).
   Per mode: prompt-cache hits (the answers' ``usage.prompt_tokens_details.cached_tokens``, else
   ``timings.cache_n``, over their prompt tokens, turns 2-10) and their ceiling (the previous turn's
   whole prompt over this one's: what a server holding every prefix could serve), the share of
   turns 2-10 served by the replica that served the session's previous turn ("warm"), the keys moved
   by the load bound, the time of turns 2-10 relative to turn 1, and the replicas' load: max/mean of
   the requests each replica had in flight, sampled every 20 ms while both had any, and the max/mean
   of the requests each served over the run.
2. **One hot session among 50 cold ones** (affinity only): the hot session keeps 6 turns in flight
   for the whole run while 50 cold sessions send 3 turns each.  The bound is checked at every placement
   the decision log recorded: the chosen replica's load plus the request against ``load_bound`` × the
   mean load rounded up to a whole job (``placements_over_bound`` must be 0; ``on_the_floor`` counts
   placements above it on the least loaded replica, which always qualifies), and the in-flight
   max/mean is sampled.

The simulator does not model a prompt cache (its answers report ``cached_tokens`` 0), so on it the
cache figure is 0 for both modes and "warm" stands in for it; ``--backend real`` runs the slaves on
the real ``llama-server`` (``python -m tests.real_servers install``) with the tiny test model, whose
answers report the cache.  Each figure is given as mean ± sd [min, max] over ``--runs`` runs.

Run: ``PYTHONPATH=$PWD .venv/bin/python benchmarks/affinity.py [--runs 3] [--backend sim|real|both]``.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from twisted.internet import defer, task

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _harness import run, tempdir  # noqa: E402

from routerd.registry.replica_choice import key_hash  # noqa: E402
from tests.integration.nodes import (  # noqa: E402
    Cluster,
    plan_cluster,
    post,
    sim_model,
    start_cluster,
    write_models,
)

SLAVES = ["left", "right"]
#: The simulated model: 1 ms a prompt word, 5 ms a token, two requests at once.
SIM_TEXT = {"kind": "text", "load_ms": 40, "prompt_tokens_per_s": 1000, "gen_tokens_per_s": 200,
            "context": 8192}
#: Fits from a few samples (the warm-up's), refitted when the benchmark asks.
LENDING = {"scheduling_min_samples": 8, "scheduling_refresh_interval": "10m"}


def stats(values: Sequence[float]) -> str:
    if not values:
        return "n/a"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {sd:.3f} [{min(values):.3f}, {max(values):.3f}]"


@attrs.frozen
class Setup:
    """What one measurement runs on: ``backend`` ``sim`` or ``real``, the bound ``c``, and for the
    real server its slots (``parallel``) and its RAM prompt cache (``cache_ram`` MiB; 0: only the
    slots' own KV cache, as a server of a large model has room for)."""

    backend: str
    bound: float = 1.25
    parallel: int = 4
    cache_ram: int | None = None

    def label(self) -> str:
        cache = "default" if self.cache_ram is None else self.cache_ram
        real = "" if self.backend == "sim" else f", parallel {self.parallel}, cache-ram {cache}"
        return f"{self.backend}, c = {self.bound}{real}"


async def start_site(root: Path, mode: str, setup: Setup) -> Cluster:
    plan = plan_cluster(root, SLAVES)
    write_models(plan.root / "master", {}, {})
    routing = {"routing": {"replica_choice": mode, "load_bound": setup.bound}}
    if setup.backend == "real":
        from tests.integration.real_backends import (
            LLAMA_FLAGS,
            real_node_config,
            real_servers_or_skip,
            tiny_models_in,
        )

        servers = real_servers_or_skip()
        tiny = tiny_models_in(root / "tiny")
        flags = (*LLAMA_FLAGS, *(() if setup.cache_ram is None else ("--cache-ram", str(setup.cache_ram))))
        slaves = {name: real_node_config(root / name, servers, {
            "chat": {"model": tiny.tiny, "contextsize": 2048 * setup.parallel, "parallel": setup.parallel}},
            plan.slave_sections(name, extra_cluster=LENDING), llama_flags=flags) for name in SLAVES}
    else:
        for name in SLAVES:
            write_models(plan.root / name, {"chat": sim_model("chat", parallel=2)}, {"chat": SIM_TEXT})
        slaves = {name: plan.slave_config(name, extra_cluster=LENDING) for name in SLAVES}
    cluster = await start_cluster(plan, master=plan.master_config(LENDING, sections=routing), slaves=slaves,
                                  ready=lambda r: all(r.find(n, local_id="chat") is not None for n in SLAVES)
                                  and all(n.healthy for n in r.nodes()))
    await warm_up(cluster)
    return cluster


async def warm_up(cluster: Cluster) -> None:
    """Sixteen requests of varied sizes sent to each slave itself, the slaves in turn (the fits'
    samples, taken under the same contention), a refit on each slave and a fresh status poll: the
    loads are priced in predicted seconds from the first replayed request on."""
    for i in range(16):
        for name in SLAVES:
            words = " ".join(["warm"] * (5 + 40 * (i % 4)))
            code, answer, _ = await post(cluster.slaves[name].url + "/v1/chat/completions", {
                "model": "chat", "messages": [{"role": "user", "content": words}],
                "max_tokens": 4 + 3 * (i % 5), "ignore_eos": True})
            assert code == 200, answer
    for name in SLAVES:
        await cluster.slaves[name].node._refit()
    statuses = await cluster.master.node.master.statuses()  # type: ignore[union-attr]
    priced = [name for name in SLAVES if statuses[name].costs.model("chat", "llm") is not None]
    if len(priced) < len(SLAVES):
        print(f"  (warm-up: only {priced} have a fit; the others are priced with theirs)")
    for name in priced:
        fit = statuses[name].costs.model("chat", "llm")
        assert fit is not None
        print(f"  (fit of {name}: {fit.base_ms:.1f} ms + {fit.slopes_ms[0]:.3f} ms/prompt token"
              f" + {fit.slopes_ms[1]:.3f} ms/output token)")


class LoadSampler:
    """Every 20 ms: max/mean of the requests each replica has in flight on the master (while both
    have some), and of the predicted seconds reserved with them (what the bound governs; 0 under
    rotation, whose reservations are not priced)."""

    def __init__(self, cluster: Cluster) -> None:
        self.registry = cluster.registry
        self.ratios: list[float] = []
        self.seconds_ratios: list[float] = []
        self.loop = task.LoopingCall(self.sample)

    def sample(self) -> None:
        replicas = self.registry.usable("chat", "text")
        counts = [float(self.registry.busy(r, "text")) for r in replicas]
        seconds = [self.registry.busy_seconds(r, "text") for r in replicas]
        for ratios, loads in ((self.ratios, counts), (self.seconds_ratios, seconds)):
            if len(loads) == len(SLAVES) and min(loads) > 0:
                ratios.append(max(loads) / (sum(loads) / len(loads)))

    def __enter__(self) -> LoadSampler:
        self.loop.start(0.02, now=False)
        return self

    def __exit__(self, *_exc: object) -> None:
        self.loop.stop()


def cached(answer: Mapping[str, Any]) -> tuple[int, int]:
    """(prompt tokens, of them served by the prompt cache) of one answer."""
    usage = answer.get("usage") or {}
    prompt = int(usage.get("prompt_tokens") or 0)
    details = usage.get("prompt_tokens_details") or {}
    hit = details.get("cached_tokens")
    if hit is None:
        hit = (answer.get("timings") or {}).get("cache_n", 0)
    return prompt, int(hit or 0)


#: Words of filler in each session's system prompt (``--system-words``: an agent's long instructions).
SYSTEM_WORDS = [8]


async def session(url: str, name: str, turns: int, out: list[dict[str, Any]], rng: random.Random) -> None:
    words = ("answer", "briefly", "and", "politely", "always")
    filler = " ".join(rng.choice(words) for _ in range(SYSTEM_WORDS[0]))
    messages: list[dict[str, Any]] = [{"role": "system", "content": f"You are assistant {name}. {filler}"}]
    for turn in range(turns):
        words = " ".join(rng.choice(("tell", "me", "more", "about", "the", "sea", "and", "sky"))
                         for _ in range(12))
        messages.append({"role": "user", "content": f"turn {turn}: {words}"})
        started = time.perf_counter()
        code, answer, response = await post(url + "/v1/chat/completions", {
            "model": "chat", "messages": messages, "max_tokens": 8, "temperature": 0, "ignore_eos": True},
            headers={"X-Session-Id": [name]})
        elapsed = time.perf_counter() - started
        assert code == 200, (code, answer)
        node = response.headers.getRawHeaders(b"x-routerd-node")[0].decode()
        prompt, hit = cached(answer)
        out.append({"session": name, "turn": turn, "node": node, "prompt": prompt, "cached": hit,
                    "seconds": elapsed})
        reply = answer["choices"][0]["message"].get("content") or ""
        messages.append({"role": "assistant", "content": reply})


async def replay(root: Path, mode: str, setup: Setup, seed: int) -> dict[str, float]:
    cluster = await start_site(root, mode, setup)
    decisions: list[Mapping[str, Any]] = []
    cluster.master.node.decisions.observe(lambda row, _count: decisions.append(dict(row)))
    try:
        rows: list[dict[str, Any]] = []
        rng = random.Random(seed)
        with LoadSampler(cluster) as sampler:
            await defer.gatherResults([defer.ensureDeferred(
                session(cluster.master.url, f"s{i}-{seed}", 10, rows, random.Random(rng.random())))
                for i in range(16)])
    finally:
        await cluster.stop()
    later = [r for r in rows if r["turn"] > 0]
    previous = {(r["session"], r["turn"]): r["node"] for r in rows}
    warm = sum(1 for r in later if previous[(r["session"], r["turn"] - 1)] == r["node"]) / len(later)
    prompt = sum(r["prompt"] for r in later)
    hits = sum(r["cached"] for r in later) / prompt if prompt else 0.0
    prompts = {(r["session"], r["turn"]): r["prompt"] for r in rows}
    # the most a server could serve from its cache: the previous turn's whole prompt
    ideal = sum(prompts[(r["session"], r["turn"] - 1)] for r in later) / prompt if prompt else 0.0
    first = statistics.median(r["seconds"] for r in rows if r["turn"] == 0)
    rest = statistics.median(r["seconds"] for r in later)
    served = [sum(1 for r in rows if r["node"] == n) for n in SLAVES]
    return {"cache_hits": hits, "cache_ceiling": ideal, "warm": warm, "turns_2_10_vs_1": rest / first,
            "inflight_max_over_mean": max(sampler.ratios, default=1.0),
            "inflight_p99_over_mean": _p99(sampler.ratios),
            "seconds_p50_over_mean": _p50(sampler.seconds_ratios),
            "seconds_p99_over_mean": _p99(sampler.seconds_ratios),
            "served_max_over_mean": max(served) / (sum(served) / len(served)),
            "moved_by_bound": float(sum(1 for d in decisions if d.get("reason") == "affinity_moved"))}


def _p50(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 1.0


def _p99(values: Sequence[float]) -> float:
    if not values:
        return 1.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


async def hot_and_cold(root: Path, setup: Setup, seed: int) -> dict[str, float]:
    """One hot session keeping 6 turns in flight, 50 cold sessions of 3 turns (affinity)."""
    cluster = await start_site(root, "affinity", setup)
    decisions: list[Mapping[str, Any]] = []
    cluster.master.node.decisions.observe(lambda row, _count: decisions.append(dict(row)))
    done = {"cold": False}
    rows: list[dict[str, Any]] = []
    try:
        rng = random.Random(seed)

        async def hot_worker() -> None:
            while not done["cold"]:
                await session(cluster.master.url, f"hot-{seed}", 1, rows, random.Random(rng.random()))

        async def colds() -> None:
            await defer.gatherResults([defer.ensureDeferred(
                session(cluster.master.url, f"cold{i}-{seed}", 3, rows, random.Random(rng.random())))
                for i in range(50)])
            done["cold"] = True

        with LoadSampler(cluster) as sampler:
            await defer.gatherResults([defer.ensureDeferred(colds()),
                                       *(defer.ensureDeferred(hot_worker()) for _ in range(6))])
    finally:
        await cluster.stop()
    choices = [d for d in decisions if d.get("kind") == "replica_choice"]
    over = [d for d in choices if _over_bound(d, setup.bound)]
    hot_hash = _hot_hash(rows)
    moves = sum(1 for d in choices if d["key_hash"] == hot_hash and d["reason"] == "affinity_moved")
    floor = [d for d in choices if _after(d) > _capacity(d, setup.bound) + 1e-6 and d not in over]
    return {"placements": float(len(choices)), "placements_over_bound": float(len(over)),
            "placements_on_the_floor": float(len(floor)),
            "inflight_max_over_mean": max(sampler.ratios, default=1.0),
            "inflight_p99_over_mean": _p99(sampler.ratios),
            "seconds_p50_over_mean": _p50(sampler.seconds_ratios),
            "seconds_p99_over_mean": _p99(sampler.seconds_ratios), "hot_moves": float(moves),
            "hot_requests": float(sum(1 for r in rows if r["session"].startswith("hot")))}


def _after(row: Mapping[str, Any]) -> float:
    return float(row["load_ms"]) + float(row["service_ms"])


def _capacity(row: Mapping[str, Any], bound: float) -> float:
    """The bound at one placement: ``bound`` × the mean load counting the request, rounded up to a
    whole number of the request's cost (as ``routerd.registry.replica_choice`` defines it)."""
    cost = float(row["service_ms"])
    return math.ceil(bound * float(row["mean_load_ms"]) / cost - 1e-9) * cost if cost > 0 else 0.0


def _over_bound(row: Mapping[str, Any], bound: float) -> bool:
    """A placement that broke the bound: above it and not on the least loaded replica (the row does
    not carry the least load; a replica above the mean is never the least loaded, so this is exact
    for two replicas)."""
    return _after(row) > _capacity(row, bound) + 1e-6 and float(row["load_ms"]) > float(row["mean_load_ms"])


def _hot_hash(rows: Sequence[Mapping[str, Any]]) -> str:
    hot = next((r["session"] for r in rows if r["session"].startswith("hot")), "")
    return key_hash("header:" + hot) if hot else ""


async def measure(setup: Setup, runs: int) -> None:
    print(f"== {setup.label()} ==")
    figures: dict[str, dict[str, list[float]]] = {}
    for i in range(runs):
        for mode in ("rotation", "affinity"):
            result = await replay(tempdir(), mode, setup, seed=i)
            for key, value in result.items():
                figures.setdefault(mode, {}).setdefault(key, []).append(value)
            print(f"  run {i + 1} {mode:>9}: " + ", ".join(f"{k} {v:.3f}" for k, v in result.items()))
    print("chat replay, 16 sessions x 10 turns, 2 replicas (mean ± sd [min, max] over the runs):")
    for key in figures["rotation"]:
        print(f"  {key:>24}: rotation {stats(figures['rotation'][key])}  |  affinity "
              f"{stats(figures['affinity'][key])}")
    for key in ("cache_hits", "warm"):
        ratio = [a / r for a, r in zip(figures["affinity"][key], figures["rotation"][key], strict=True) if r]
        print(f"  {key}, affinity / rotation (same run): {stats(ratio)}")
    hot: dict[str, list[float]] = {}
    for i in range(runs):
        result = await hot_and_cold(tempdir(), setup, seed=100 + i)
        for key, value in result.items():
            hot.setdefault(key, []).append(value)
        print(f"  run {i + 1} hot+cold: " + ", ".join(f"{k} {v:.3f}" for k, v in result.items()))
    print(f"one hot session (6 in flight) among 50 cold ones (3 turns each), affinity, c = {setup.bound}:")
    for key, values in hot.items():
        print(f"  {key:>24}: {stats(values)}")


async def main(runs: int, setups: Sequence[Setup]) -> None:
    for setup in setups:
        await measure(setup, runs)


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--backend", choices=("sim", "real", "both"), default="sim")
    parser.add_argument("--bound", type=float, action="append", help="c (repeat for several; default 1.25)")
    parser.add_argument("--parallel", type=int, default=4, help="the real server's slots")
    parser.add_argument("--system-words", type=int, default=8, help="filler words in each system prompt")
    parser.add_argument("--cache-ram", type=int, action="append",
                        help="the real server's --cache-ram MiB (repeat for several; default: its own)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse()
    SYSTEM_WORDS[0] = args.system_words
    backends = ("sim", "real") if args.backend == "both" else (args.backend,)
    setups = [Setup(backend, bound, args.parallel, cache_ram)
              for backend in backends for bound in (args.bound or [1.25])
              for cache_ram in ((args.cache_ram or [None]) if backend == "real" else [None])]
    run(lambda: main(args.runs, setups))
