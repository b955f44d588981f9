"""The swap-avoiding order on a real node (issue 33 item 2), next to the queue-only figures of
``benchmarks/swap_batch.py``.

One process, one reactor: a standalone node whose three text models (A, B, C) share its one
llama-server (the simulator: every switch stops the process and starts another, then waits its
``--load-ms``), ``scheduling_backend_depth`` ``--depth``.  The trace: ``--bursts`` bursts of
``--burst`` requests at once (``A B A A C …``: each of a model drawn from the mix 60/30/10 %),
Poisson-spaced ``--gap`` s apart on average, seeded; each request generates ``--tokens`` tokens.
The same trace runs on a fresh node with ``scheduling.swap_batch`` 0 (FIFO, today's order) and
``--batch`` N (``swap_max_wait`` ``--max-wait`` s).

Figures over ``--runs`` seeds (median [min, max]): model loads (``routerd_model_loads_total``) per
hour of the run and for the whole trace, swap_batch ÷ FIFO (target ≤ 50 %); the rarest model's p99
latency (send → answer) with both; the makespan.

Run: ``PYTHONPATH=$PWD python benchmarks/swap_batch_node.py [--runs 3] [--bursts 12] [--batch 8]``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import treq
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import defer, reactor, task

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _harness import run  # noqa: E402

from tests.integration.nodes import FAST_TEXT, sim_model, start_standalone  # noqa: E402

MODELS = ("A", "B", "C")
MIX = (0.6, 0.3, 0.1)


async def chat(url: str, model: str, tokens: int) -> tuple[str, float]:
    started = time.perf_counter()
    response = await treq.post(url + "/v1/chat/completions", json={
        "model": model, "max_tokens": tokens, "messages": [{"role": "user", "content": "hi"}]})
    await response.content()
    assert response.code == 200, response.code
    return model, time.perf_counter() - started


async def loads(url: str) -> float:
    response = await treq.get(url + "/metrics")
    text = (await response.content()).decode()
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "routerd_model_loads_total" and s.labels.get("status") == "ok")


async def one(root: Path, batch: int, args: argparse.Namespace,
              seed: int) -> tuple[float, float, dict[str, float]]:
    """Loads, makespan (s) and each model's p99 latency (s) of one trace on a fresh node."""
    weights = {name: {**FAST_TEXT, "load_ms": args.load_ms, "gen_tokens_per_s": 200} for name in MODELS}
    node = await start_standalone(root, {name: sim_model(name) for name in MODELS}, weights, extra={
        "scheduling": {"swap_batch": batch, "swap_max_wait": f"{args.max_wait}s"},
        "cluster": {"scheduling_backend_depth": args.depth}})
    try:
        await chat(node.url, "A", 1)  # A loaded
        before = await loads(node.url)
        rng = random.Random(seed)
        sent: list[defer.Deferred[tuple[str, float]]] = []
        started = time.perf_counter()
        for _ in range(args.bursts):
            for _ in range(args.burst):
                model = rng.choices(MODELS, weights=MIX)[0]
                sent.append(defer.Deferred.fromCoroutine(chat(node.url, model, args.tokens)))
            await task.deferLater(reactor, rng.expovariate(1 / args.gap), lambda: None)
        answers = await defer.gatherResults(sent)
        makespan = time.perf_counter() - started
        total = await loads(node.url) - before
    finally:
        await node.stop()
    p99: dict[str, float] = {}
    for model in MODELS:
        mine = sorted(t for m, t in answers if m == model)
        p99[model] = mine[min(len(mine) - 1, int(0.99 * len(mine)))] if mine else 0.0
    return total, makespan, p99


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}, {fmt.format(max(values))}]"


async def main_async(args: argparse.Namespace) -> None:
    print(f"one node, one llama-server (simulator) shared by A B C (mix {MIX}); {args.bursts} bursts of "
          f"{args.burst}, {args.gap} s apart on average; {args.tokens} tokens a request, "
          f"load {args.load_ms} ms; "
          f"depth {args.depth}; swap_batch {args.batch}, swap_max_wait {args.max_wait} s; {args.runs} runs")
    figures: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="swap-batch-") as tmp:
        for r in range(args.runs):
            got = {}
            for name, batch in (("fifo", 0), ("batch", args.batch)):
                got[name] = await one(Path(tmp) / f"{name}-{r}", batch, args, args.seed + r)
            fifo_loads, fifo_span, fifo_p99 = got["fifo"]
            batch_loads, batch_span, batch_p99 = got["batch"]
            for key, value in (("fifo loads", fifo_loads), ("batch loads", batch_loads),
                               ("ratio", batch_loads / fifo_loads),
                               ("per hour ratio", (batch_loads / batch_span) / (fifo_loads / fifo_span)),
                               ("fifo span", fifo_span), ("batch span", batch_span),
                               ("fifo C p99", fifo_p99["C"]), ("batch C p99", batch_p99["C"])):
                figures.setdefault(key, []).append(value)
            print(f"  run {r + 1}: loads FIFO {fifo_loads:.0f}, swap_batch {batch_loads:.0f}; makespan "
                  f"{fifo_span:.1f} s / {batch_span:.1f} s; C p99 {fifo_p99['C']:.2f} s / "
                  f"{batch_p99['C']:.2f} s")
    print(f"1. loads for the trace: FIFO {spread(figures['fifo loads'], '{:.0f}')}, swap_batch "
          f"{spread(figures['batch loads'], '{:.0f}')}; ratio {spread(figures['ratio'])} (target <= 0.50); "
          f"per hour of the run {spread(figures['per hour ratio'])}")
    print(f"2. rarest model (C) p99 latency: FIFO {spread(figures['fifo C p99'])} s, swap_batch "
          f"{spread(figures['batch C p99'])} s; makespan FIFO {spread(figures['fifo span'], '{:.1f}')} s, "
          f"swap_batch {spread(figures['batch span'], '{:.1f}')} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--bursts", type=int, default=12)
    parser.add_argument("--burst", type=int, default=5)
    parser.add_argument("--gap", type=float, default=1.5, help="mean seconds between bursts")
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--load-ms", type=int, default=300)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-wait", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    run(lambda: main_async(args))


if __name__ == "__main__":
    main()
