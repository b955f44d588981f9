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

Run: .venv/bin/python benchmarks/held.py [--requests 10000] [--body-bytes 4096]
"""

from __future__ import annotations

import argparse
import asyncio
import json
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
    for url in backends:
        await asyncio.to_thread(post, url + "/sim/control", {"slowdown": 0.0001})
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.sleep(2)
    counts: dict[int, int] = {}
    for code in statuses:
        counts[code] = counts.get(code, 0) + 1
    after = rss_mb(owner.proc.pid)
    print(f"drained in {time.monotonic() - start:.1f} s, answers {counts}; owner RSS after {after:.1f} MB "
          f"({after - before:+.1f} MB over before)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--body-bytes", type=int, default=4096)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    root = tempdir()
    ports = {name: free_port() for name in ("master", "owner", "helper")}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    limits = {"limits": {"max_queued_per_model": 1_000_000}}
    cluster = {"token": TOKEN, "scheduling_backend_depth": 2, "scheduling_min_samples": 3}
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
            nodes.append(NodeProcess(cfg, ports[name]))
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
        time.sleep(3)  # the link is pushed to both slaves
        backends = [backend(owner), backend(nodes[2])]
        for url in backends:
            post(url + "/sim/control", {"slowdown": 1000})
        asyncio.run(hold(args, owner, backends))
    finally:
        for node in reversed(nodes):
            node.stop()


if __name__ == "__main__":
    main()
