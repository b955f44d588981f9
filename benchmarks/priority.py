"""Priority classes and per-key fair share in the router queue (issue 23): the targets' figures.

A discrete-event run of the real :class:`~routerd.lending.queue.LaneQueue` (the order a node
serves) in front of one backend that runs the admitted jobs one at a time in admission order, on a
simulated clock.  Job times are ``J`` ms ± ``--jitter`` (seeded).  Against the same runs with every
request in one class and of one key — exactly the FIFO order of before (the Hypothesis property in
``tests/unit/test_queue_priority.py``).  The end-to-end check on real nodes with lending is
``tests/integration/test_priority_flow.py``.

1. **Interactive under a flood**: a batch key posts 300 jobs at t = 0; a chat user's interactive
   requests arrive one at a time, 3 to 9 jobs apart (random), while it runs.  Wait = arrival →
   the backend starts it.
   Target: p99 ≤ 1.2 × J (with ``scheduling_backend_depth`` 1; with depth *d* a request also waits
   for the d - 1 jobs admitted before it arrived: reported too).
2. **Fair share**: 4 batch keys flood the same model, 60 jobs each, key *k* from t = 5·k·J.
   Jain's index of the jobs each key got served while all four had work waiting.  Target ≥ 0.95.
3. **Throughput**: makespan of the flood of (1) with priorities ÷ the FIFO makespan.  Target ≤ 1.02.
4. **The backend as busy as with one class** (depth 2): the same, with a router round trip of 2, 5
   and 20 % of J between admission and the backend, without a cost fit (the waiting place stays
   empty while interactive work is about: the backend idles a round trip per job) and with one
   (the place opens for the running job's last fifth); with ``queue.aging`` 30 J (most of the flood
   ages into the interactive class, as in (1)) and with no aging (the rule holds throughout, as on a
   cluster whose jobs are short next to ``queue.aging``).

Run: ``PYTHONPATH=$PWD python benchmarks/priority.py [--job-ms 1000] [--jitter 0.1] [--seed 1]``.
"""

from __future__ import annotations

import argparse
import heapq
import random
from collections.abc import Sequence

import attrs

from routerd.lending.queue import LaneQueue

INTERACTIVE, STANDARD, BATCH = 0, 1, 2


@attrs.frozen
class Job:
    request_id: str
    arrives_ms: int
    priority: int
    key_name: str
    duration_ms: int


@attrs.define
class Result:
    started: dict[str, int]
    finished: dict[str, int]


def run(jobs: Sequence[Job], depth: int, fifo: bool, aging_ms: int = 30_000, gap_ms: int = 0,
        predict_ms: float | None = None) -> Result:
    """Serve ``jobs``; ``fifo``: every job in one class and of one key (today's order).

    ``gap_ms``: an admitted job reaches the backend that much later (the router's round trip: with
    the backend's waiting place empty, the backend idles that long between jobs).  ``predict_ms``:
    the fits' prediction of a job's time as the node measures it (its duration plus the gap), which
    opens the waiting place for the running job's last fifth; None: no fit.  The queue's requests to
    be pumped again (``recheck_ms``) are served as the node's timer serves them."""
    queue = LaneQueue("text", depth, enrolled={"m"}, owners={"m"}, aging_ms=aging_ms)
    if predict_ms is not None:
        queue.predict_ms = lambda entry: predict_ms
    by_id = {j.request_id: j for j in jobs}
    events: list[tuple[int, int, str, str]] = []  # (time, order, kind, request id)
    for n, job in enumerate(sorted(jobs, key=lambda j: j.arrives_ms)):
        heapq.heappush(events, (job.arrives_ms, n, "arrive", job.request_id))
    backlog: list[str] = []  # admitted and arrived at the backend, waiting for it (admission order)
    busy_until: int | None = None
    running: str | None = None
    started: dict[str, int] = {}
    finished: dict[str, int] = {}
    order = len(jobs)

    def push(at: int, kind: str, rid: str) -> None:
        nonlocal order
        order += 1
        heapq.heappush(events, (at, order, kind, rid))

    def start_next(now: int) -> None:
        nonlocal busy_until, running
        if running is None and backlog:
            running = backlog.pop(0)
            started[running] = now
            busy_until = now + by_id[running].duration_ms
            push(busy_until, "finish", running)

    while events:
        now, _, kind, rid = heapq.heappop(events)
        if kind == "reach":
            backlog.append(rid)
            start_next(now)
            continue
        if kind == "arrive":
            job = by_id[rid]
            effects = queue.arrive(rid, "m", now, priority=STANDARD if fifo else job.priority,
                                   key_name="" if fifo else job.key_name)
        elif kind == "pump":
            effects = queue.pump(now)
        else:
            running = None
            finished[rid] = now
            effects = queue.finished(rid, now)
            start_next(now)
        for admitted in effects.admit:
            push(now + gap_ms, "reach", admitted)
        if effects.recheck_ms is not None:
            push(max(effects.recheck_ms, now), "pump", "")
    return Result(started, finished)


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    index = min(len(ordered) - 1, max(0, int(round(q * (len(ordered) - 1)))))
    return ordered[index]


def jain(values: Sequence[float]) -> float:
    total = sum(values)
    squares = sum(v * v for v in values)
    return (total * total) / (len(values) * squares) if squares else 1.0


def duration(rng: random.Random, job_ms: int, jitter: float) -> int:
    return max(1, int(job_ms * (1 + rng.uniform(-jitter, jitter))))


def flood_with_interactive(rng: random.Random, job_ms: int, jitter: float) -> list[Job]:
    """300 batch jobs at t = 0; a chat user's requests, 3 to 9 jobs apart (one at a time)."""
    jobs = [Job(f"b{i}", 0, BATCH, "flood", duration(rng, job_ms, jitter)) for i in range(300)]
    t = 0.0
    n = 0
    while True:
        t += rng.uniform(3 * job_ms, 9 * job_ms)
        if t > 280 * job_ms:
            break
        jobs.append(Job(f"i{n}", int(t), INTERACTIVE, "chat", duration(rng, job_ms, jitter)))
        n += 1
    return jobs


def four_keys(rng: random.Random, job_ms: int, jitter: float) -> list[Job]:
    return [Job(f"k{k}-{i}", 5 * k * job_ms, BATCH, f"key{k}", duration(rng, job_ms, jitter))
            for k in range(4) for i in range(60)]


def fair_window(jobs: Sequence[Job], result: Result) -> list[int]:
    """Jobs served per key while every key had work waiting (from the last key's first arrival to
    the first time a key has nothing left waiting)."""
    keys = sorted({j.key_name for j in jobs})
    opens = max(min(j.arrives_ms for j in jobs if j.key_name == k) for k in keys)
    closes = min(max(result.started[j.request_id] for j in jobs if j.key_name == k) for k in keys)
    return [sum(1 for j in jobs if j.key_name == k and opens <= result.started[j.request_id] < closes)
            for k in keys]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--job-ms", type=int, default=1000)
    parser.add_argument("--jitter", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    job_ms, jitter = args.job_ms, args.jitter

    print(f"job {job_ms} ms ± {jitter:.0%}, seed {args.seed}")
    for depth in (1, 2):
        jobs = flood_with_interactive(random.Random(args.seed), job_ms, jitter)
        interactive = [j for j in jobs if j.priority == INTERACTIVE]
        for fifo in (False, True):
            result = run(jobs, depth, fifo)
            waits = [result.started[j.request_id] - j.arrives_ms for j in interactive]
            label = "FIFO    " if fifo else "priority"
            target = "  (target p99 ≤ 1.20 J)" if depth == 1 and not fifo else ""
            print(f"1. depth {depth} {label}: {len(interactive)} interactive under a flood of 300: "
                  f"p50 {percentile(waits, 0.5) / job_ms:.2f} J, "
                  f"p99 {percentile(waits, 0.99) / job_ms:.2f} J, max {max(waits) / job_ms:.2f} J{target}")
        makespans = [max(run(jobs, depth, fifo).finished.values()) for fifo in (False, True)]
        ratio = makespans[0] / makespans[1]
        print(f"3. depth {depth}: makespan priority / FIFO = {ratio:.4f}  (target ≤ 1.02)")
    jobs = flood_with_interactive(random.Random(args.seed), job_ms, jitter)
    interactive = [j for j in jobs if j.priority == INTERACTIVE]
    for aging, aging_label in ((30_000, "aging 30 J"), (10**9, "no aging")):
        for share in (0.02, 0.05, 0.2):
            gap = int(share * job_ms)
            fifo_end = max(run(jobs, 2, True, aging, gap_ms=gap).finished.values())
            for label, predict in (("no fit  ", None), ("with fit", job_ms + gap)):
                result = run(jobs, 2, False, aging, gap_ms=gap, predict_ms=predict)
                waits = [result.started[j.request_id] - j.arrives_ms for j in interactive]
                print(f"4. depth 2, {aging_label}, round trip {share:.0%} of J, {label}: makespan "
                      f"priority / FIFO = {max(result.finished.values()) / fifo_end:.4f}; interactive p99 "
                      f"{percentile(waits, 0.99) / job_ms:.2f} J, max {max(waits) / job_ms:.2f} J")
    jobs = four_keys(random.Random(args.seed), job_ms, jitter)
    for fifo in (False, True):
        served = fair_window(jobs, run(jobs, 2, fifo))
        label = "FIFO    " if fifo else "priority"
        print(f"2. {label}: 4 keys, jobs served while all wait {served}: Jain {jain(served):.3f}"
              + ("" if fifo else "  (target ≥ 0.95)"))


if __name__ == "__main__":
    main()
