"""Memory of held requests (issue 14): 10,000 requests with 4 KB bodies queued on an enrolled model.

A master and two slaves run as separate processes: ``owner`` serves ``alpha`` (backend depth 2),
``helper`` serves ``bravo``, and ``alpha`` is linked to lend to ``bravo`` (so it is enrolled: its
requests wait in the lending queue).  Both backends are slowed (the simulator's ``slowdown``) so
nothing drains; N clients then send one 4 KB chat request each straight to the owner.  Printed:
the owner process's RSS before, while all N are held (the peak of the owner's in-flight gauge), and
after the backends are sped up again and every request was answered.  Target: growth <= 64 MB,
and back down after the drain.  The slaves allow ``--requests`` + 1000 connections
(``server.max_connections``, 4096 by default: past it the held requests and the ``/metrics`` polls
were refused 503).

The owner runs as shipped (``etc/routerd.service`` and the Dockerfile set ``PYTHONMALLOC=malloc``);
``--pymalloc`` runs it with CPython's default small-object allocator instead.  Its cost refit runs
every 5 s, so its first fit (numpy is imported then: ~12 MB once per process) is done before
"before" is read.  ``--trace`` runs the owner under ``tracemalloc`` (one frame; slower, and its
own bookkeeping adds to the RSS) and prints the allocation sites that grew between "before" and
"held", per held request: where the growth goes, in the real process with its sockets and channels.

Run: .venv/bin/python benchmarks/held.py [--requests 10000] [--body-bytes 4096] [--trace] [--pymalloc]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import NodeProcess, free_port, tempdir, write_node  # noqa: E402

TOKEN = "benchmark-held-token-0123456789abcdef"
SLOW = {"kind": "text", "load_ms": 0, "prompt_tokens_per_s": 1e6, "gen_tokens_per_s": 200, "context": 32768}
SPEC = {"contextsize": 32768, "parallel": 1}  # lending needs one request at a time


#: Installed as ``sitecustomize`` in the owner under ``--trace``: SIGUSR1 dumps a tracemalloc snapshot.
TRACE_HOOK = """
import os, signal, tracemalloc

def _dump(signum, frame):
    _dump.count += 1
    tracemalloc.take_snapshot().dump(os.environ["HELD_TRACE"] + str(_dump.count))

_dump.count = 0
signal.signal(signal.SIGUSR1, _dump)
"""


def traced(pid: int, prefix: Path, count: int) -> Any:
    """Ask the owner for its ``count``-th snapshot and load it (None without ``--trace``)."""
    import signal
    import tracemalloc

    os.kill(pid, signal.SIGUSR1)
    path = Path(f"{prefix}{count}")
    deadline = time.monotonic() + 120
    size = -1
    while time.monotonic() < deadline:  # written once the owner's reactor thread gets to it
        if path.exists() and path.stat().st_size == size and size > 0:
            return tracemalloc.Snapshot.load(str(path))
        size = path.stat().st_size if path.exists() else -1
        time.sleep(1)
    raise RuntimeError("the owner wrote no tracemalloc snapshot")


def print_growth(before: Any, during: Any, held: float, top: int = 20, when: str = "while held") -> None:
    stats = during.compare_to(before, "lineno")
    grown = sum(s.size_diff for s in stats)
    print(f"traced growth {when}: {grown / max(1.0, held):,.0f} B per held request; top sites:")
    for s in stats[:top]:
        frame = s.traceback[0]
        name = frame.filename
        for marker in ("/routerd/", "/site-packages/", "/lib/python3"):
            if marker in name:
                name = name[name.index(marker) + 1:]
                break
        print(f"  {s.size_diff / max(1.0, held):8,.0f} B  {s.count_diff / max(1.0, held):5.2f} blocks  "
              f"{name}:{frame.lineno}")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def get(url: str) -> bytes:
    return bytes(urllib.request.urlopen(url, timeout=30).read())


def post(url: str, body: dict[str, Any]) -> bytes:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    try:
        return bytes(urllib.request.urlopen(req, timeout=60).read())
    except urllib.error.HTTPError as err:
        raise RuntimeError(f"{url}: {err.code} {err.read()!r}") from None


def in_flight(node: NodeProcess) -> float:
    text = get(node.url + "/metrics").decode()
    return sum(float(v) for v in re.findall(r'^routerd_requests_in_flight\{lane="text"\} (\S+)$', text, re.M))


def backend(node: NodeProcess) -> str:
    state = json.loads(get(node.url + "/router/v1/state"))
    return f"http://127.0.0.1:{[r for r in state['runtimes'] if r['kind'] == 'text'][0]['port']}"


async def one(port: int, payload: bytes, statuses: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                 b"Content-Type: application/json\r\nContent-Length: " + str(len(payload)).encode()
                 + b"\r\n\r\n" + payload)
    await writer.drain()
    head = await reader.readline()
    await reader.read()
    writer.close()
    statuses.append(int(head.split()[1]) if head else 0)


async def hold(args: argparse.Namespace, owner: NodeProcess, backends: list[str]) -> None:
    payload = json.dumps({"model": "alpha", "max_tokens": 4, "messages": [
        {"role": "user", "content": "x" * (args.body_bytes - 80)}]}).encode()
    before = rss_mb(owner.proc.pid)
    trace = args.trace_prefix
    snap_before = await asyncio.to_thread(traced, owner.proc.pid, trace, 1) if trace else None
    statuses: list[int] = []
    start = time.monotonic()
    tasks: list[asyncio.Task[None]] = []
    for i in range(args.requests):
        tasks.append(asyncio.create_task(one(owner.port, payload, statuses)))
        if i % 200 == 199:
            await asyncio.sleep(0.05)  # no SYN flood: let the owner accept
    peak_rss, held = before, 0.0
    while time.monotonic() - start < args.timeout:
        held = await asyncio.to_thread(in_flight, owner)
        peak_rss = max(peak_rss, rss_mb(owner.proc.pid))
        if held >= args.requests * 0.99:  # a few finish meanwhile (slow, not stopped)
            break
        await asyncio.sleep(0.5)
    await asyncio.sleep(1)
    peak_rss = max(peak_rss, rss_mb(owner.proc.pid))
    print(f"body {len(payload)} B; held {held:.0f} of {args.requests} after {time.monotonic() - start:.1f} s")
    print(f"owner RSS: before {before:.1f} MB, held {peak_rss:.1f} MB, growth {peak_rss - before:.1f} MB "
          f"({(peak_rss - before) * 1024 * 1024 / max(1.0, held):.0f} B per held request)")
    if trace:
        print_growth(snap_before, await asyncio.to_thread(traced, owner.proc.pid, trace, 2), held)
    for url in backends:
        await asyncio.to_thread(post, url + "/sim/control", {"slowdown": 0.0001})
    results = await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.sleep(2)
    counts: dict[int | str, int] = {}
    for code in statuses:
        counts[code] = counts.get(code, 0) + 1
    for result in results:  # a client that got no answer at all (refused, reset, timed out)
        if isinstance(result, BaseException):
            name = type(result).__name__
            counts[name] = counts.get(name, 0) + 1
    after = rss_mb(owner.proc.pid)
    if trace:
        await asyncio.sleep(3)  # the post-crowd collection and trim have run
        print_growth(snap_before, await asyncio.to_thread(traced, owner.proc.pid, trace, 3), held, 12,
                     "left after the drain")
    print(f"drained in {time.monotonic() - start:.1f} s, answers {counts}; owner RSS after {after:.1f} MB "
          f"({after - before:+.1f} MB over before)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--body-bytes", type=int, default=4096)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--trace", action="store_true", help="run the owner under tracemalloc")
    parser.add_argument("--pymalloc", action="store_true",
                        help="run the owner with pymalloc (not as shipped: PYTHONMALLOC=malloc)")
    args = parser.parse_args()
    root = tempdir()
    owner_env: dict[str, str] = {} if args.pymalloc else {"PYTHONMALLOC": "malloc"}
    args.trace_prefix = None
    if args.trace:
        (root / "hook").mkdir()
        (root / "hook" / "sitecustomize.py").write_text(TRACE_HOOK)
        args.trace_prefix = root / "snapshot"
        owner_env |= {"PYTHONTRACEMALLOC": "1", "HELD_TRACE": str(args.trace_prefix),
                     "PYTHONPATH": os.pathsep.join(filter(None, [str(root / "hook"),
                                                                 os.environ.get("PYTHONPATH")]))}
    ports = {name: free_port() for name in ("master", "owner", "helper")}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    limits = {"limits": {"max_queued_per_model": 1_000_000}}
    # A refit every 5 s: the owner's first fit (which imports numpy, ~12 MB of RSS once per process)
    # runs after the warm-up requests and before "before", not inside the measured window.
    cluster = {"token": TOKEN, "scheduling_backend_depth": 2, "scheduling_min_samples": 3,
               "scheduling_refresh_interval": "5s"}
    master = NodeProcess(write_node(root / "master", ports["master"], {}, {}, {
        "role": "master", "node_id": "master", "slave_urls": [urls["owner"], urls["helper"]], **cluster}),
        ports["master"])
    nodes = [master]
    try:
        master.wait_ready()
        for name, model in (("owner", "alpha"), ("helper", "bravo")):
            kcpps = {model: {"model": f"../weights/{model}.sim.json", **SPEC}}
            cfg = write_node(root / name, ports[name], kcpps, {model: SLOW},
                             {"role": "slave", "node_id": name, "master_url": urls["master"],
                             "public_url": urls[name], **cluster}, limits,
                             {"max_connections": args.requests + 1000})
            nodes.append(NodeProcess(cfg, ports[name], owner_env if name == "owner" else None))
            nodes[-1].wait_ready()
            post(urls[name] + "/router/v1/load", {"model": model})
        owner = nodes[1]
        for _ in range(5):  # measured service times for the fits
            post(owner.url + "/v1/chat/completions", {"model": "alpha", "max_tokens": 4,
                                                      "messages": [{"role": "user", "content": "hi"}]})
        deadline = time.monotonic() + 30
        while True:
            try:
                post(urls["master"] + "/router/v1/site/text-routing-groups", {
                    "anchor": {"node_id": "owner", "model_id": "alpha"},
                    "lends_to": [{"node_id": "helper", "model_id": "bravo", "load_if_unloaded": True}],
                    "acknowledge_different_weights": True})
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        time.sleep(6)  # the link is pushed to both slaves; the owner's first fit has run
        backends = [backend(owner), backend(nodes[2])]
        for url in backends:
            post(url + "/sim/control", {"slowdown": 1000})
        asyncio.run(hold(args, owner, backends))
    finally:
        for node in reversed(nodes):
            node.stop()


if __name__ == "__main__":
    main()
