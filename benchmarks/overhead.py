"""Router overhead, measured beside the naive floor and two near-limit proxies in the same run.

Paths to the same zero-delay simulator model: ``direct`` (the backend itself), ``naive`` (a
~60-line Klein + treq proxy, ``benchmarks/naive_proxy.py``: the floor, issue 14), ``go`` (Go's
``httputil.ReverseProxy``) and ``nginx`` (``proxy_pass`` with an upstream keep-alive pool), the two
near-limit anchors of issue 20 (``benchmarks/anchors.py``: each skipped with a message when its
program is missing), and ``routerd``.  For each
of 1, 16 and 64 concurrent clients and each round: requests/s, p50/p99/max latency and the proxy's
own CPU milliseconds per non-streaming request (from /proc of that one process: routerd's backend
children are not counted), then routerd's CPU ÷ the floor's, ÷ Go's and ÷ nginx's.  Streams (20
chunks, one client): CPU per stream and the added time to first chunk (TTFC) over direct, for every
proxy.  A summary closes the run: each CPU ratio's range over the rounds, per concurrency.

Load comes from ``wrk`` when it is installed (it uses little CPU, so the client does not eat what
is being measured) and from a Python client otherwise (``--python`` forces it).

Targets (issue 14), judged by the ratios of one run: routerd CPU per request <= 0.5 x the floor's
at c=1/16/64; CPU per stream <= 0.75 x; added TTFC <= the floor's; p99 at c=1 <= 1.5 x.

Last, routerd with analytics on against off (issue 22; ``benchmarks/analytics_ab.py``): the same
process switched by a reload, cell by cell, at each concurrency and for streams (target <= 1.10 x).

Real-server target (issue 30; ``benchmarks/real_server.py``): ``--real`` measures instead tokens/s and
time to first token of the real ``llama-server`` on the tiny generated model, direct against through
routerd, with 1 then 8 clients, and the ratios' spread over ``--rounds`` (use 3 or more).

Run: .venv/bin/python benchmarks/overhead.py [--seconds 8] [--rounds 2] [--python]
     .venv/bin/python benchmarks/overhead.py --real --rounds 3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (  # noqa: E402
    NodeProcess,
    client,
    free_port,
    have_wrk,
    run,
    run_load,
    tempdir,
    write_node,
)
from anchors import Missing, start_go, start_nginx  # noqa: E402
from real_server import add_arguments as add_real_arguments  # noqa: E402
from real_server import main as real_main  # noqa: E402
from zero_cells import BODY, STREAM, ZERO, measure_cell, stream_cell  # noqa: E402

NAIVE = Path(__file__).resolve().parent / "naive_proxy.py"


def _ms(x: float | None) -> str:
    return f"{x * 1000:8.3f}" if x is not None else f"{'-':>8}"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:6.2f}" if a is not None and b else f"{'-':>6}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=8, help="seconds per wrk cell")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every cell")
    parser.add_argument("--requests", type=int, default=2000, help="requests per cell (Python client)")
    parser.add_argument("--streams", type=int, default=300, help="streams per stream cell")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--python", action="store_true", help="use the Python client even if wrk exists")
    add_real_arguments(parser)
    args = parser.parse_args()
    if args.real:
        real_main(args)
        return
    args.wrk = not args.python and have_wrk()
    levels = [int(c) for c in args.concurrency.split(",")]
    root = tempdir()
    port = free_port()
    cfg = write_node(root, port, {"zero": {"model": "../weights/zero.sim.json", "contextsize": 4096,
                                           "parallel": 64}}, {"zero": ZERO})
    node = NodeProcess(cfg, port)
    naive: subprocess.Popen[bytes] | None = None
    helpers: list[subprocess.Popen[bytes]] = []
    try:
        node.wait_ready()
        load = json.dumps({"model": "zero"}).encode()
        req = urllib.request.Request(node.url + "/router/v1/load", data=load)
        urllib.request.urlopen(req, timeout=60).read()
        state = json.loads(urllib.request.urlopen(node.url + "/router/v1/state").read())
        backend = f"http://127.0.0.1:{[r for r in state['runtimes'] if r['kind'] == 'text'][0]['port']}"
        naive_port = free_port()
        naive = subprocess.Popen([sys.executable, str(NAIVE), str(naive_port), backend],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        NodeProcess.wait_url(f"http://127.0.0.1:{naive_port}/health")
        paths = {"direct": (backend + "/v1/chat/completions", None),
                 "naive": (f"http://127.0.0.1:{naive_port}/v1/chat/completions", naive.pid)}
        for name, start in (("go", start_go), ("nginx", start_nginx)):
            try:
                url, proc = start(backend, root / name)
            except Missing as exc:
                print(f"{name}: skipped: {exc}")
                continue
            helpers.append(proc)
            paths[name] = (url + "/v1/chat/completions", proc.pid)
        paths["routerd"] = (node.url + "/v1/chat/completions", node.proc.pid)
        anchors = [name for name in ("naive", "go", "nginx") if name in paths]
        cpu_ratios: dict[tuple[str, str], list[float]] = {}  # (cell, anchor) -> routerd CPU / its CPU

        def note(cell: str, mine: float | None, cpus: dict[str, float | None]) -> str:
            out = ""
            for anchor in anchors:
                theirs = cpus[anchor]
                if mine is not None and theirs:
                    cpu_ratios.setdefault((cell, anchor), []).append(mine / theirs)
                out += f" {_ratio(mine, theirs):>9}"
            return out

        async def measure() -> None:
            http = client()
            for url, _pid in paths.values():  # warm every path
                await run_load(http, url, BODY, 8, 300)
                await stream_cell(http, url, 20, None)
            print(f"load: {'wrk' if args.wrk else 'python client'}; {args.rounds} rounds; CPU = the proxy "
                  "process alone (/proc utime+stime)")
            heads = "".join(f" {'÷' + a + ' CPU':>9}" for a in anchors)
            print(f"{'c':>3} {'rnd':>3} {'path':>8} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
                  f"{'CPU ms/req':>10}  {'ratio p99':>9}{heads}")
            for conc in levels:
                for rnd in range(1, args.rounds + 1):
                    cells = {name: await measure_cell(http, url, conc, args, pid)
                             for name, (url, pid) in paths.items()}
                    for name, cell in cells.items():
                        ratios = ""
                        if name == "routerd":
                            ratios = (f"  {_ratio(cell.p99, cells['naive'].p99):>9}"
                                      + note(f"c={conc}", cell.cpu, {a: cells[a].cpu for a in anchors}))
                        bad = f"  ({cell.errors} non-2xx)" if cell.errors else ""
                        rate = cell.count / cell.elapsed
                        print(f"{conc:>3} {rnd:>3} {name:>8} {rate:8.0f} {_ms(cell.p50)} {_ms(cell.p99)} "
                              f"{_ms(cell.worst)} {_ms(cell.cpu):>10}{ratios}{bad}")
            print(f"streams ({STREAM['max_tokens']} chunks, 1 client, {args.streams} per cell):")
            print(f"{'rnd':>3} {'path':>8} {'TTFC ms':>8} {'+TTFC ms':>8} {'CPU ms/stream':>13} {heads}")
            http = client()  # fresh connections: the old ones idled through the wrk cells
            for rnd in range(1, args.rounds + 1):
                got = {name: await stream_cell(http, url, args.streams, pid)
                       for name, (url, pid) in paths.items()}
                for name, (ttfc, cpu, failed) in got.items():
                    added = ttfc - got["direct"][0]
                    ratio = ""
                    if name == "routerd":
                        ratio = " " + note("stream", cpu, {a: got[a][1] for a in anchors})
                    cut = f"  ({failed} cut off)" if failed else ""
                    print(f"{rnd:>3} {name:>8} {_ms(ttfc)} {_ms(added)} {_ms(cpu):>13}{ratio}{cut}")
            print("routerd CPU ÷ each proxy's, same run (min-max over rounds; issue 20 targets: "
                  "÷naive <= 0.5 per request, <= 0.75 per stream):")
            for cell in [f"c={c}" for c in levels] + ["stream"]:
                spans = []
                for anchor in anchors:
                    got = cpu_ratios.get((cell, anchor))
                    if got:
                        spans.append(f"÷{anchor} {min(got):.2f}-{max(got):.2f}")
                print(f"  {cell:>7}: " + ", ".join(spans))

            # issue 22: the same node with analytics on against off (benchmarks/analytics_ab.py)
            from analytics_ab import Analytics, cells_of, compare

            cells = cells_of(client, paths["routerd"][0], args, levels)
            await compare(Analytics(cfg, node.url), node.proc.pid, cells, args.rounds)

        run(measure)
    finally:
        for proc in helpers:
            proc.terminate()
            proc.wait(10)
        if naive is not None:
            naive.terminate()
            naive.wait(10)
        node.stop()


if __name__ == "__main__":
    main()
