"""Traces off against on (issue 34): CPU per request of routerd with ``tracing.enabled`` false and
true at ``sampling_ratio: 1.0`` (``--ratio``), exporting every span to a live OTLP/HTTP sink (so the
on side pays for building, batching, encoding and sending them; the SDK's export thread is in the
node's process and its CPU counted: each cell's CPU is read after the exporter's schedule delay,
so the cell's last spans are exported inside it).  The sink counts the spans it took, printed per
request the on node served: the work compared is the same load with every span exported.

``tracing.*`` applies at start, so each side is its own routerd process on the same zero-delay
simulator model (``zero_cells``); the cells alternate between them, and rounds alternate which goes
first, so both sides share the moment.  A third node, tracing off too (``off2``), measures the
spread two identical processes show: the floor below which a difference is noise.  ``--base DIR``
adds a node run from an older checkout (its ``routerd`` package first on ``PYTHONPATH``): the code
before tracing, to show that off costs nothing measurable.

Targets: on ÷ off <= 1.15 (CPU per request, same run); off ÷ base within the off2 ÷ off spread.

Run: .venv/bin/python benchmarks/tracing_ab.py [--seconds 5] [--rounds 6] [--concurrency 1,16]
     [--python] [--base /tmp/routerd-old]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from _harness import NodeProcess, client, cpu_seconds, free_port, run, run_load, tempdir, write_node
from zero_cells import BODY, ZERO, measure_cell

from routerd.tracing.otel import SCHEDULE_DELAY_MS

#: Requests each node serves before the cells (counted in the on node's spans a request).
WARM = 300
#: After a cell, before its CPU is read: the batch exporter's schedule delay and its send, so the
#: on node's export of the cell's last spans is counted in that cell.
SETTLE = SCHEDULE_DELAY_MS / 1000 + 0.5
MODELS = {"zero": {"model": "../weights/zero.sim.json", "contextsize": 4096, "parallel": 64}}


#: The OTLP/HTTP sink, a process of its own (the benchmark's reactor blocks while ``wrk`` runs, and a
#: collector that stalls would make the node drop spans instead of exporting them): it takes every
#: export and answers ``GET /`` with the exports, bytes and spans taken.
SINK = """
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
bodies = []
class Sink(BaseHTTPRequestHandler):
    def log_message(self, *args): pass
    def do_POST(self):
        bodies.append(self.rfile.read(int(self.headers.get("content-length", 0))))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()
    def do_GET(self):  # decoded only now, so the sink's CPU does not compete while cells run
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
        spans = 0
        for raw in bodies:
            got = ExportTraceServiceRequest()
            got.ParseFromString(raw)
            spans += sum(len(scope.spans) for rs in got.resource_spans for scope in rs.scope_spans)
        body = json.dumps([len(bodies), sum(map(len, bodies)), spans]).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink)
server.serve_forever()
"""


def start_node(root: Path, name: str, tracing: dict[str, Any],
               env: dict[str, str] | None = None) -> NodeProcess:
    port = free_port()
    extra = {"tracing": tracing} if tracing else None
    node = NodeProcess(write_node(root / name, port, MODELS, {"zero": ZERO}, extra=extra), port, env)
    node.wait_ready()
    load = urllib.request.Request(node.url + "/router/v1/load", data=json.dumps({"model": "zero"}).encode())
    urllib.request.urlopen(load, timeout=60).read()
    return node


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5, help="seconds per wrk cell")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=2000, help="requests per cell (Python client)")
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--python", action="store_true", help="use the Python client even if wrk exists")
    parser.add_argument("--ratio", type=float, default=1.0, help="the on node's tracing.sampling_ratio")
    parser.add_argument("--base", default="", help="an older checkout to run as the 'base' node")
    args = parser.parse_args()
    args.wrk = not args.python and shutil.which("wrk") is not None
    sink_port = free_port()
    sink = subprocess.Popen([sys.executable, "-c", SINK, str(sink_port)])
    endpoint = f"http://127.0.0.1:{sink_port}/v1/traces"
    NodeProcess.wait_url(f"http://127.0.0.1:{sink_port}/")
    root = tempdir()
    nodes: dict[str, NodeProcess] = {}
    try:
        nodes["off"] = start_node(root, "off", {})
        nodes["off2"] = start_node(root, "off2", {})
        nodes["on"] = start_node(root, "on", {"enabled": True, "endpoint": endpoint,
                                              "sampling_ratio": args.ratio})
        if args.base:
            nodes["base"] = start_node(root, "base", {}, env={"PYTHONPATH": str(Path(args.base).resolve())})
        levels = [int(c) for c in args.concurrency.split(",")]

        async def measure() -> None:
            for node in nodes.values():
                await run_load(client(), node.url + "/v1/chat/completions", BODY, 8, WARM)
            names = list(nodes)
            served = dict.fromkeys(names, WARM)
            print(f"load: {'wrk' if args.wrk else 'python client'}; {args.rounds} rounds; nodes {names}")
            print(f"{'cell':>6} {'rnd':>3} " + " ".join(f"{n + ' ms':>9}" for n in names)
                  + f" {'on÷off':>7} {'off2÷off':>8}" + (f" {'off÷base':>8}" if args.base else ""))
            ratios: dict[tuple[str, str], list[float]] = {}
            for conc in levels:
                for rnd in range(1, args.rounds + 1):
                    order = names if rnd % 2 else names[::-1]
                    cpu: dict[str, float] = {}
                    for name in order:
                        node = nodes[name]
                        cpu0 = cpu_seconds(node.proc.pid)
                        url = node.url + "/v1/chat/completions"
                        cell = await measure_cell(client(), url, conc, args, None)
                        time.sleep(SETTLE)  # the cell's last spans exported: the exporter's CPU counted
                        cpu[name] = (cpu_seconds(node.proc.pid) - cpu0) / max(1, cell.count)
                        served[name] += cell.count
                    row = {"on÷off": cpu["on"] / cpu["off"], "off2÷off": cpu["off2"] / cpu["off"]}
                    if args.base:
                        row["off÷base"] = cpu["off"] / cpu["base"]
                    for key, value in row.items():
                        ratios.setdefault((f"c={conc}", key), []).append(value)
                    figures = " ".join(f"{cpu[n] * 1000:9.3f}" for n in names)
                    shares = "".join(f" {value:>{max(len(key), 7)}.3f}" for key, value in row.items())
                    print(f"{'c=' + str(conc):>6} {rnd:>3} {figures}{shares}")
            print("same-run ratios, median (min-max) over rounds; target on÷off <= 1.15:")
            for (cell, key), values in ratios.items():
                print(f"  {cell:>6} {key:>8}: {statistics.median(values):.3f} "
                      f"({min(values):.3f}-{max(values):.3f})")
            time.sleep(SETTLE)
            exports, size, spans = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{sink_port}/").read())
            print(f"sink: {exports} exports, {spans} spans ({spans / served['on']:.2f} a request the on node "
                  f"served), {size / max(1, spans):.0f} bytes a span")

        run(measure)
    finally:
        for node in nodes.values():
            node.stop()
        sink.terminate()
        sink.wait(10)


if __name__ == "__main__":
    main()
