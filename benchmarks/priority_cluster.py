"""Priority classes and fair share on a real cluster with lending (issue 23), next to the queue-only
figures of ``benchmarks/priority.py``.

One process, one reactor: a master with named keys, an owner slave serving ``alpha`` and a helper
slave serving ``beta`` (``alpha`` lends to ``beta``), simulator backends, ``scheduling_backend_depth``
``--depth`` on the slaves.  J = one request's time alone (measured).  Every request goes to the master.

1. **Interactive under a flood**: key ``flood`` (batch) posts ``--flood`` requests at once; a chat
   user (key ``chat``, interactive) sends ``--chats`` requests one at a time, 2-4 J apart.  Wait =
   its latency - J.  Target: p99 wait ≤ 1.2 J (at depth 1).
2. **Fair share**: four batch keys post 20 requests each, 1 J apart.  Jain's index of the requests
   each key has had answered when half of all are.  Target ≥ 0.95.
3. **Throughput**: the flood of (1) plus 20 of a second batch key, makespan with those keys ÷ the
   same requests sent with one plain key (FIFO).  Target ≤ 1.02 (noise on a busy machine ~±3 %).
4. The same flood with an interactive request every 3 J meanwhile (its cost: while interactive work
   is about, batch work reaches the backend one at a time) ÷ the same requests all on one plain key.
   With ``--no-lending`` nothing is linked: every request runs on the owner, so (4) is what the
   second-place class rule costs the owner's backend alone (lending aside).

Run: ``PYTHONPATH=$PWD python benchmarks/priority_cluster.py [--depth 1] [--flood 60] [--chats 10]``.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from twisted.internet import defer, reactor, task

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _harness import run, tempdir  # noqa: E402
from priority import jain, percentile  # noqa: E402

from tests.integration.lending_support import JOB, ask_chat, start_trio, text_models, warm_and_link  # noqa: E402

KEYS = {name: f"sk-{name}-0123456789" for name in ("flood", "chat", "b1", "b2", "b3", "b4", "plain")}
CLASSES = {"flood": "batch", "chat": "interactive", "b1": "batch", "b2": "batch", "b3": "batch",
           "b4": "batch", "plain": "standard"}


async def timed(url: str, key: str) -> float:
    started = time.perf_counter()
    code, _, _ = await ask_chat(url, "alpha", key=KEYS[key])
    assert code == 200, code
    return time.perf_counter() - started


async def sleep(seconds: float) -> None:
    await task.deferLater(reactor, seconds, lambda: None)


def spawn(url: str, key: str, n: int) -> list[defer.Deferred[float]]:
    return [defer.Deferred.fromCoroutine(timed(url, key)) for _ in range(n)]


async def interactive(url: str, job_s: float, flood: int, chats: int, rng: random.Random) -> list[float]:
    pending = spawn(url, "flood", flood)
    await sleep(2 * job_s)
    waits = []
    for _ in range(chats):
        waits.append(await timed(url, "chat") - job_s)
        await sleep(rng.uniform(2, 4) * job_s)
    await defer.gatherResults(pending)
    return waits


async def fair(url: str, job_s: float) -> list[int]:
    done: dict[str, list[float]] = {k: [] for k in ("b1", "b2", "b3", "b4")}
    sent: list[defer.Deferred[float]] = []
    start = time.perf_counter()
    for key in done:
        for d in spawn(url, key, 20):
            d.addCallback(lambda s, k=key: done[k].append(time.perf_counter()) or s)
            sent.append(d)
        await sleep(job_s)
    await defer.gatherResults(sent)
    half = sorted(t for times in done.values() for t in times)[len(sent) // 2 - 1]
    assert half > start
    return [sum(1 for t in times if t <= half) for times in done.values()]


async def makespan(url: str, flood: int, keys: Sequence[str], chat_every: float = 0.0) -> float:
    """The flood's makespan; with ``chat_every`` a request of ``keys[2]`` every that many seconds
    meanwhile (interactive: at depth 2 batch work then reaches the backend one at a time)."""
    started = time.perf_counter()
    sent = spawn(url, keys[0], flood) + spawn(url, keys[1], 20)
    done = defer.gatherResults(sent)
    chats = []
    while chat_every and not done.called:
        chats.append(defer.Deferred.fromCoroutine(timed(url, keys[2])))
        await sleep(chat_every)
    await done
    took = time.perf_counter() - started
    await defer.gatherResults(chats)
    return took


async def main_async(args: argparse.Namespace) -> None:
    root = tempdir()
    depth = {"scheduling_min_samples": 2, "offload_probe_idle": "100ms", "scheduling_refresh_interval": "10m",
             "scheduling_backend_depth": args.depth}
    keys = [{"name": name, "key": key, "class": CLASSES[name]} for name, key in KEYS.items()]
    trio = await start_trio(root, text_models(alpha=JOB), text_models(beta=JOB), master_extra=depth,
                            slave_extra=depth, master_sections={"auth": {"inference_keys": keys}})
    try:
        url = trio.master.url
        if args.no_lending:  # the owner alone: (4) then measures what the class rule costs its backend
            for _ in range(3):
                await timed(url, "plain")
            await trio.owner.node._refit()
        else:
            await warm_and_link(trio, key=KEYS["plain"])
        job_s = sorted([await timed(url, "plain") for _ in range(5)])[2]
        print(f"depth {args.depth}, J = {job_s * 1000:.0f} ms (median of 5 alone)", flush=True)
        waits = await interactive(url, job_s, args.flood, args.chats, random.Random(1))
        in_jobs = [round(w / job_s, 2) for w in waits]
        print(f"1. interactive under a flood of {args.flood}: waits {in_jobs} J; "
              f"p50 {percentile(waits, 0.5) / job_s:.2f} J, p99 {percentile(waits, 0.99) / job_s:.2f} J "
              "(target ≤ 1.20 J)", flush=True)
        served = await fair(url, job_s)
        print(f"2. four batch keys, answered at half-time {served}: Jain {jain(served):.3f} (target ≥ 0.95)",
              flush=True)
        fifo = await makespan(url, args.flood, ("plain", "plain"))
        prio = await makespan(url, args.flood, ("flood", "b1"))
        fifo2 = await makespan(url, args.flood, ("plain", "plain"))
        base = (fifo + fifo2) / 2
        print(f"3. makespan: keys {prio:.2f} s, one plain key {fifo:.2f} s / {fifo2:.2f} s: "
              f"ratio {prio / base:.3f} (target ≤ 1.02)", flush=True)
        chatty = await makespan(url, args.flood, ("flood", "b1", "chat"), chat_every=3 * job_s)
        plain = await makespan(url, args.flood, ("plain", "plain", "plain"), chat_every=3 * job_s)
        print(f"4. makespan of (3) with a request every 3 J meanwhile: interactive {chatty:.2f} s, "
              f"all one plain key {plain:.2f} s: ratio {chatty / plain:.3f}", flush=True)
    finally:
        await trio.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--depth", type=int, default=1)
    parser.add_argument("--flood", type=int, default=60)
    parser.add_argument("--chats", type=int, default=10)
    parser.add_argument("--no-lending", action="store_true",
                        help="no link: every request runs on the owner (its backend's busy-ness alone)")
    args = parser.parse_args()
    run(lambda: main_async(args))


if __name__ == "__main__":
    main()
