"""Router overhead: the same zero-delay simulator model called directly and through routerd.

Prints requests/s, p50/p99 latency and the added latency at 1, 16 and 64
concurrent clients (non-streaming chat), routerd's own CPU milliseconds per
request (from /proc of the routerd process only), and the added time to the
first streamed chunk. Targets (issue 2): <= 1 ms routerd CPU per request and
<= 2 ms added p50 at 16 clients.

Run: .venv/bin/python benchmarks/overhead.py [--requests N]
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (  # noqa: E402
    NodeProcess,
    client,
    cpu_seconds,
    first_chunk_latency,
    free_port,
    median,
    ms,
    pct,
    run,
    run_load,
    tempdir,
    write_node,
)

ZERO = {"kind": "text", "load_ms": 0, "prompt_tokens_per_s": 1e9, "gen_tokens_per_s": 1e9, "context": 4096}
BODY = {"model": "zero", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000, help="requests per concurrency level")
    args = parser.parse_args()
    root = tempdir()
    port = free_port()
    cfg = write_node(root, port, {"zero": {"model": "../weights/zero.sim.json", "contextsize": 4096,
                                           "parallel": 64}}, {"zero": ZERO})
    node = NodeProcess(cfg, port)
    try:
        node.wait_ready()
        req = urllib.request.Request(node.url + "/router/v1/load",
                                     data=json.dumps({"model": "zero"}).encode())
        urllib.request.urlopen(req, timeout=60).read()
        state = json.loads(urllib.request.urlopen(node.url + "/router/v1/state").read())
        backend_port = [r for r in state["runtimes"] if r["kind"] == "text"][0]["port"]
        direct = f"http://127.0.0.1:{backend_port}/v1/chat/completions"
        routed = node.url + "/v1/chat/completions"

        async def measure() -> None:
            http = client()
            await run_load(http, direct, BODY, 8, 200)  # warm both paths
            await run_load(http, routed, BODY, 8, 200)
            print(f"{'clients':>7} {'path':>7} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
                  f"{'+p50 ms':>8} {'+p99 ms':>8} {'routerd CPU ms/req':>19}")
            for conc in (1, 16, 64):
                t_direct, lat_direct = await run_load(http, direct, BODY, conc, args.requests)
                cpu0 = cpu_seconds(node.proc.pid)
                t_routed, lat_routed = await run_load(http, routed, BODY, conc, args.requests)
                cpu = (cpu_seconds(node.proc.pid) - cpu0) / args.requests
                print(f"{conc:>7} {'direct':>7} {args.requests / t_direct:8.0f} {ms(pct(lat_direct, .5))} "
                      f"{ms(pct(lat_direct, .99))}")
                print(f"{conc:>7} {'routerd':>7} {args.requests / t_routed:8.0f} {ms(pct(lat_routed, .5))} "
                      f"{ms(pct(lat_routed, .99))} "
                      f"{ms(pct(lat_routed, .5) - pct(lat_direct, .5))} "
                      f"{ms(pct(lat_routed, .99) - pct(lat_direct, .99))} {cpu * 1000:19.3f}")
            stream = {**BODY, "stream": True}
            ttfc_direct = await first_chunk_latency(http, direct, stream, 200)
            ttfc_routed = await first_chunk_latency(http, routed, stream, 200)
            print(f"time to first streamed chunk: direct p50 {ms(median(ttfc_direct))} ms, "
                  f"routerd p50 {ms(median(ttfc_routed))} ms, "
                  f"added {ms(median(ttfc_routed) - median(ttfc_direct))} ms")

        run(measure)
    finally:
        node.stop()


if __name__ == "__main__":
    main()
