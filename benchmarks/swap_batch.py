"""The swap-avoiding order on a shared runtime (issue 33 item 2): the targets' figures.

A discrete-event run of the real :class:`~routerd.lending.queue.LaneQueue` (the order a node
serves, with ``scheduling.swap_batch``) in front of one runtime shared by three models: it runs the
admitted jobs one at a time in admission order and, when a job's model is not the one it holds,
loads that model first (``--load-ms``), telling the queue what it holds as the node does
(``routerd.assembly.ports.RuntimeModels``).  Job times are ``--job-ms`` ± ``--jitter``; arrivals are
a Poisson trace (``--rate`` requests a second) of the three models in the mix ``--mix`` (A the
busiest, C the rarest: ``A B A A C …``), seeded, for ``--hours`` of simulated time.  The same trace
is served with ``swap_batch`` 0 (FIFO, today's order) and ``--batch`` N.  ``--burst`` K: each arrival
brings K requests at once, each of a model drawn from the mix (a client's fan-out, an agent's steps).

1. **Loads per hour** with ``swap_batch`` ÷ with FIFO.  Target ≤ 50 %.
2. **Wait of the rarest model** (C): p99 of arrival → admission to the backend (the router queue's
   wait), with and without.  Target ≤ ``swap_max_wait`` + one job.  That bound is on what the order
   adds: a request is overtaken (a later request admitted first) only within ``swap_max_wait`` of the
   first time, so it waits at most that plus one job longer than the class order makes it wait; the
   longest span from a request's first overtaking to its last is shown.  The queue's own backlog
   (FIFO's wait) comes on top.  Also shown: p99 of arrival → the runtime starts it (a load
   included) for each model.

Each figure is given over ``--runs`` seeds: median and [min, max].  With FIFO the runtime spends
most of its time loading at these rates, so its queue grows for the whole run (its waits are
those of an overloaded runtime); the end-to-end check on a node is
``tests/integration/test_swap_batch_flow.py``.

Run: ``PYTHONPATH=$PWD python benchmarks/swap_batch.py [--rate 0.04] [--burst 5] [--batch 8] [--runs 5]``.
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
from collections.abc import Sequence

import attrs

from routerd.lending.queue import Effects, LaneQueue

MODELS = ("A", "B", "C")


@attrs.frozen
class Job:
    request_id: str
    model: str
    arrives_ms: int
    duration_ms: int


@attrs.define
class Result:
    loads: int
    admitted: dict[str, int]
    started: dict[str, int]
    end_ms: int
    #: request id -> when it was first and last overtaken (the swap-avoiding order admitted a later
    #: request first), and how many were
    overtaken: dict[str, tuple[int, int, int]] = attrs.Factory(dict)


def trace(rate: float, burst: int, mix: Sequence[float], hours: float, job_ms: int, jitter: float,
          rng: random.Random) -> list[Job]:
    """Poisson arrivals of ``rate`` bursts a second, each of ``burst`` requests at once, every one of a
    model drawn from ``mix`` (``A B A A C``: a client's fan-out, an agent's steps)."""
    jobs: list[Job] = []
    t = 0.0
    while t < hours * 3_600_000:
        t += rng.expovariate(rate) * 1000
        for _ in range(burst):
            model = rng.choices(MODELS, weights=mix)[0]
            duration = int(job_ms * rng.uniform(1 - jitter, 1 + jitter))
            jobs.append(Job(f"r{len(jobs)}", model, int(t), duration))
    return jobs


def run(jobs: Sequence[Job], batch: int, max_wait_ms: int, load_ms: int, depth: int) -> Result:
    """Serve ``jobs`` on one shared runtime behind the lane queue (``batch`` 0: today's order)."""
    queue = LaneQueue("text", depth)
    queue.swap.configure(batch, max_wait_ms)
    by_id = {j.request_id: j for j in jobs}
    events: list[tuple[int, int, str]] = [(j.arrives_ms, n, j.request_id) for n, j in enumerate(jobs)]
    heapq.heapify(events)
    result = Result(0, {}, {}, 0)
    backend: list[str] = []  # admitted, in admission order; the first runs once started
    busy_until: int | None = None
    loaded: str | None = None
    seq = len(jobs)

    def admit(effects: Effects, now: int, before: list[tuple[str, str]]) -> None:
        for p in effects.passed:  # what it overtook: every other model's request ahead of it
            for rid, model in before[:[r for r, _ in before].index(p.served)]:
                if model != p.model_id:
                    first, _, count = result.overtaken.get(rid, (now, now, 0))
                    result.overtaken[rid] = (first, now, count + 1)
        for rid in effects.admit:
            result.admitted[rid] = now
            backend.append(rid)

    now = 0
    while events or backend:
        if backend and busy_until is None:
            job = by_id[backend[0]]
            cost = job.duration_ms
            if job.model != loaded:
                loaded, cost = job.model, cost + load_ms
                result.loads += 1
            queue.swap.loaded = loaded
            result.started[job.request_id] = now + (cost - job.duration_ms)
            busy_until = now + cost
            heapq.heappush(events, (busy_until, seq, ""))
            seq += 1
        now, _, rid = heapq.heappop(events)
        if not rid:  # the running job ends
            busy_until = None
            done = backend.pop(0)
            before = [(e.request_id, e.model_id) for e in queue.pending()] if batch else []
            admit(queue.finished(done, now), now, before)
        else:
            before = [(e.request_id, e.model_id) for e in queue.pending()] if batch else []
            admit(queue.arrive(rid, by_id[rid].model, now), now, before)
    result.end_ms = now
    return result


def p99(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0.0


def spread(values: Sequence[float], fmt: str = "{:.1f}") -> str:
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}, {fmt.format(max(values))}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rate", type=float, default=0.04, help="arrivals (bursts) a second")
    parser.add_argument("--burst", type=int, default=5, help="requests an arrival brings at once")
    parser.add_argument("--mix", type=float, nargs=3, default=(0.6, 0.3, 0.1), help="shares of A, B, C")
    parser.add_argument("--job-ms", type=int, default=2000)
    parser.add_argument("--jitter", type=float, default=0.5)
    parser.add_argument("--load-ms", type=int, default=6000)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-wait-ms", type=int, default=10_000)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    one_job = args.job_ms * (1 + args.jitter)
    print(f"one runtime, models A B C in the mix {tuple(args.mix)}, {args.rate} arrivals/s of "
          f"{args.burst} requests "
          f"for {args.hours} h; "
          f"job {args.job_ms} ms ± {args.jitter:.0%}, load {args.load_ms} ms, depth {args.depth}; "
          f"swap_batch {args.batch}, swap_max_wait {args.max_wait_ms} ms; {args.runs} runs")
    ratios, fifo_loads, batch_loads, c_waits, c_fifo, bounds_ok = [], [], [], [], [], 0
    holds: list[float] = []  # the longest span of a request's overtakings, first to last (s)
    overtakes: list[float] = []  # the most requests admitted ahead of one out of order
    per_request: list[float] = []  # loads for the same requests served: swap_batch ÷ FIFO
    spans: list[tuple[float, float]] = []  # hours until the last request ended: FIFO, swap_batch
    starts: dict[tuple[str, str], list[float]] = {}
    for r in range(args.runs):
        rng = random.Random(args.seed + r)
        jobs = trace(args.rate, args.burst, args.mix, args.hours, args.job_ms, args.jitter, rng)
        fifo = run(jobs, 0, args.max_wait_ms, args.load_ms, args.depth)
        batch = run(jobs, args.batch, args.max_wait_ms, args.load_ms, args.depth)
        per_hour = [res.loads / (res.end_ms / 3_600_000) for res in (fifo, batch)]
        fifo_loads.append(per_hour[0])
        batch_loads.append(per_hour[1])
        ratios.append(per_hour[1] / per_hour[0])
        per_request.append(batch.loads / fifo.loads)
        spans.append((fifo.end_ms / 3_600_000, batch.end_ms / 3_600_000))
        rare = [j for j in jobs if j.model == "C"]
        c_waits.append(p99([(batch.admitted[j.request_id] - j.arrives_ms) / 1000 for j in rare]))
        c_fifo.append(p99([(fifo.admitted[j.request_id] - j.arrives_ms) / 1000 for j in rare]))
        bounds_ok += c_waits[-1] <= (args.max_wait_ms + one_job) / 1000
        holds.append(max([(last - first) / 1000 for first, last, _ in batch.overtaken.values()], default=0.0))
        overtakes.append(max([count for _, _, count in batch.overtaken.values()], default=0))
        for name, res in (("fifo", fifo), ("batch", batch)):
            for model in MODELS:
                mine = [(res.started[j.request_id] - j.arrives_ms) / 1000 for j in jobs if j.model == model]
                starts.setdefault((name, model), []).append(p99(mine))
    print(f"1. loads per hour: FIFO {spread(fifo_loads)}, swap_batch {spread(batch_loads)}; "
          f"ratio {spread(ratios, '{:.2f}')} (target <= 0.50)")
    print(f"   loads for the same requests: swap_batch / FIFO {spread(per_request, '{:.2f}')}; the last one "
          f"ended after FIFO {spread([s[0] for s in spans], '{:.2f}')} h, "
          f"swap_batch {spread([s[1] for s in spans], '{:.2f}')} h")
    print(f"2. rarest model (C) p99 wait in the router queue: swap_batch {spread(c_waits)} s, "
          f"FIFO {spread(c_fifo)} s; bound swap_max_wait + one job = "
          f"{(args.max_wait_ms + one_job) / 1000:.1f} s, met in {bounds_ok}/{args.runs} runs; "
          f"what the order added (any model): the longest span from a request's first overtaking to its "
          f"last {spread(holds)} s (bound {args.max_wait_ms / 1000:.1f} s: its added wait is at most that "
          f"plus one job), the most requests admitted ahead of one {spread(overtakes, '{:.0f}')}")
    for model in MODELS:
        print(f"   p99 arrival -> start (load included), {model}: FIFO {spread(starts[('fifo', model)])} s, "
              f"swap_batch {spread(starts[('batch', model)])} s")


if __name__ == "__main__":
    main()
