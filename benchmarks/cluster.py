"""Cluster costs: a forwarded request against a local one, one health-poll cycle over 200 slaves, and a
master routing for 32 slaves against its local path.

(a) Forwarding.  A master and one slave run as ``twistd`` processes, each with its own zero-delay
simulator model (``local-zero`` on the master, ``remote-zero`` on the slave), and the naive floor
proxy (``naive_proxy.py``, Klein + treq) runs in front of the slave.  In the same run, for each of
``--rounds`` rounds, it drives non-streaming chats at 1 and 16 concurrent clients down four paths:
``slave`` (client → slave, asked directly), ``forwarded`` (client → master → slave), ``naive``
(client → floor proxy → slave) and ``local`` (client → master → master's backend), the paths'
order rotated every round.  It prints requests/s, p50/p99 latency, the p50 forwarding adds over
asking the slave directly in the same round, and the proxy's own CPU milliseconds per request
(from /proc of the master, or of the floor proxy, alone).  Targets (issue 24): forwarding adds
<= 0.4 ms at p50 with one client (at 16 clients the p50 is mostly queueing behind the other
processes on a small machine: printed, not judged), and the master's CPU per forwarded request is
<= 0.5 x the floor proxy's in the same round.  Verdicts are the median over the rounds, with the
min / max and the number of rounds that met the target; with wrk, the added p50 is judged on
``--pairs`` pairs of 1 s cells (slave, then forwarded, the order alternating) run right after one
another, whose difference the machine's other load disturbs much less than rounds minutes apart.

Load comes from ``wrk`` when installed (one thread; ``--seconds`` a cell), else from the Python
client (``--requests`` a cell; ``--python`` forces it).  The Python client costs more CPU per
request than the paths it measures and shares the machine with them, which swung the forwarded
figures between runs (issue 24: (c) read 0.53-1.44 x with it, 1.7 x with wrk on the same build).

(b) Health polling.  A helper process opens N (200, issue 24) tiny HTTP listeners on loopback that answer
``GET /router/v1/node/models`` with a valid snapshot of three models (one identical on every node,
so the registry merges N replicas), optionally after ``--poll-delay-ms`` milliseconds.  This
process builds a master ``Node`` whose ``cluster.slave_urls`` lists them and times
``node.master.poll_all()``: the first cycle (every node new) and the following steady cycles, wall
time and this process's CPU.  Target: one cycle within 1 s.  The master polls at most
``POLL_CONCURRENCY`` slaves at once, so a cycle takes about N / POLL_CONCURRENCY round trips; the
delayed rows show how that scales with slow slaves.  Each delay runs twice in the same run (the order
alternating): ``telemetry off`` as before the rack telemetry (snapshots without it, no reading of the
master's own), and ``telemetry on`` (every snapshot carries a full reading: host, two GPUs, three runtimes
with llama-server counters, two flags; the master takes its own reading each cycle); the rows print the
on ÷ off ratio of the steady p50 and the CPU per cycle, and what one reading and its JSON cost here.

(c) Routing at scale.  The helper process opens 32 fake slaves that also answer forwarded chats
(``POST /router/v1/node/inference/...``) at once; a master ``twistd`` process polls them (one model,
``chat-shared``, with 32 replicas it rotates over) and has its own zero-delay ``local-zero``.  At 1,
16 and 64 clients, in cells of the same run whose order alternates every round: requests/s,
p50/p99 and the master's CPU per request for the local and the forwarded path, forwarded ÷ local
throughput and CPU per request.  Target (issue 24): the forwarded path sustains the local path's
throughput (judged by the median over the rounds).

Run: .venv/bin/python benchmarks/cluster.py [--seconds 4] [--rounds 3] [--python [--requests N]]
     [--slaves 200] [--poll-delay-ms 0,10,40] [--routed-slaves 32] [--only forward|poll|route]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _harness import (  # noqa: E402
    Cell,
    NodeProcess,
    client,
    free_port,
    have_wrk,
    measure,
    ms,
    run,
    run_load,
    tempdir,
    write_node,
    wrk_cell,
)

TOKEN = "benchmark-cluster-token-0123456789"
ZERO = {"kind": "text", "load_ms": 0, "prompt_tokens_per_s": 1e9, "gen_tokens_per_s": 1e9, "context": 4096}
ADDED_P50_TARGET_MS = 0.4
CPU_RATIO_TARGET = 0.5
NAIVE = Path(__file__).resolve().parent / "naive_proxy.py"
POLL_TARGET_S = 1.0


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}


def post(url: str, body: Any) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as response:
        return json.loads(response.read())


def rotated(names: list[str], rnd: int) -> list[str]:
    """``names`` starting at a different one every round: no path always runs first (after a
    pause) or right after the same neighbour."""
    shift = (rnd - 1) % len(names)
    return names[shift:] + names[:shift]


def spread(values: list[float], scale: float = 1.0) -> str:
    """min / median / max of ``values`` (times ``scale``)."""
    low, mid, high = min(values) * scale, statistics.median(values) * scale, max(values) * scale
    return f"{low:.3f} / {mid:.3f} / {high:.3f} (min / median / max of {len(values)})"


def verdict(values: list[float], target: float, *, at_least: bool = False, unit: str = "rounds") -> str:
    """Met by the median, and in how many rounds (a noisy machine moves single rounds)."""
    met = [v >= target if at_least else v <= target for v in values]
    mid = statistics.median(values)
    ok = mid >= target if at_least else mid <= target
    return f"{'met' if ok else 'MISSED'} by the median, in {sum(met)} of {len(met)} {unit}"


def errors(cell: Cell) -> str:
    return f"  ({cell.errors} non-2xx)" if cell.errors else ""


def wait_healthy(master: str, node_id: str, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            inventory = json.loads(urllib.request.urlopen(master + "/router/v1/site/inventory").read())
            if any(n["node_id"] == node_id and n["healthy"] for n in inventory["nodes"]):
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{node_id} never became healthy on {master}")


# -- (a) forwarded against local -----------------------------------------------------------------


async def forwarding(args: argparse.Namespace) -> None:
    root = tempdir()
    master_port, slave_port, naive_port = free_port(), free_port(), free_port()
    master_url, slave_url = f"http://127.0.0.1:{master_port}", f"http://127.0.0.1:{slave_port}"
    spec = {"contextsize": 4096, "parallel": 64}
    master_cfg = write_node(root / "master", master_port,
                            {"local-zero": {"model": "../weights/local-zero.sim.json", **spec}},
                            {"local-zero": ZERO},
                            {"role": "master", "node_id": "master", "token": TOKEN,
                             "slave_urls": [slave_url]})
    slave_cfg = write_node(root / "slave", slave_port,
                           {"remote-zero": {"model": "../weights/remote-zero.sim.json", **spec}},
                           {"remote-zero": ZERO},
                           {"role": "slave", "node_id": "slave", "token": TOKEN, "master_url": master_url,
                            "public_url": slave_url})
    master = NodeProcess(master_cfg, master_port)
    slave: NodeProcess | None = None
    naive: subprocess.Popen[bytes] | None = None
    try:
        master.wait_ready()
        slave = NodeProcess(slave_cfg, slave_port)
        slave.wait_ready()
        wait_healthy(master.url, "slave")
        for model in ("local-zero", "remote-zero"):
            post(master.url + "/router/v1/load", {"model": model})
        naive = subprocess.Popen([sys.executable, str(NAIVE), str(naive_port), slave_url, "remote-zero"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        NodeProcess.wait_url(f"http://127.0.0.1:{naive_port}/health")
        paths: dict[str, tuple[str, str, int | None]] = {
            "slave": (slave_url, "remote-zero", None),
            "forwarded": (master_url, "remote-zero", master.proc.pid),
            "naive": (f"http://127.0.0.1:{naive_port}", "remote-zero", naive.pid),
            "local": (master_url, "local-zero", master.proc.pid),
        }
        http = client()
        for base, model, _pid in paths.values():  # warm every path
            await run_load(http, base + "/v1/chat/completions", chat(model), 8, 300)
        seconds = args.seconds if args.wrk else None
        size = f"{args.seconds:g} s of wrk" if args.wrk else f"{args.requests} requests (Python client)"
        print(f"(a) forwarded vs the slave asked directly, the floor proxy and a local request; {size} per "
              f"cell, {args.rounds} rounds, the paths' order rotated every round; CPU is that proxy "
              f"process alone")
        print(f"{'clients':>7} {'rnd':>3} {'path':>9} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
              f"{'CPU ms/req':>10}  {'+p50 ms over slave':>18} {'CPU ratio to floor':>18}")
        added: dict[int, list[float]] = {}
        ratios: dict[int, list[float]] = {}
        names = list(paths)
        for conc in (1, 16):
            for rnd in range(1, args.rounds + 1):
                rows: dict[str, Cell] = {}
                for name in rotated(names, rnd):
                    base, model, pid = paths[name]
                    rows[name] = await measure(http, base + "/v1/chat/completions", chat(model), conc,
                                               pid=pid, seconds=seconds, requests=args.requests)
                slave_p50 = rows["slave"].p50
                floor_cpu = rows["naive"].cpu
                for name in names:
                    cell = rows[name]
                    extra = ""
                    if name == "forwarded":
                        plus = cell.p50 - slave_p50
                        ratio = cell.cpu / floor_cpu if cell.cpu is not None and floor_cpu else float("nan")
                        added.setdefault(conc, []).append(plus)
                        ratios.setdefault(conc, []).append(ratio)
                        extra = f"  {plus * 1000:18.3f} {ratio:18.2f}"
                    cpu_text = f"{cell.cpu * 1000:10.3f}" if cell.cpu is not None else f"{'-':>10}"
                    print(f"{conc:>7} {rnd:>3} {name:>9} {cell.rate:8.0f} {ms(cell.p50)} {ms(cell.p99)} "
                          f"{cpu_text}{extra}{errors(cell)}")
        # The latency target is judged at one client: at 16 clients the machine's cores are busy
        # and a p50 is mostly queueing behind the other processes (shown, not judged).
        print(f"16 clients: +p50 {spread(added[16], 1000)} ms (queueing on a busy machine: not judged)")
        print(f"one client, in the rounds above: +p50 {spread(added[1], 1000)} ms")
        unit = "rounds"
        if args.wrk and args.pairs:
            # Pairs of short cells right after one another (order alternating): the machine's
            # other load drifts between the rounds above, much less within a pair.
            pairs: list[float] = []
            slave_base, slave_model, _ = paths["slave"]
            fwd_base, fwd_model, _ = paths["forwarded"]
            for index in range(args.pairs):
                order = [("slave", slave_base, slave_model), ("forwarded", fwd_base, fwd_model)]
                got: dict[str, float] = {}
                for name, base, model in order if index % 2 == 0 else order[::-1]:
                    got[name] = wrk_cell(base + "/v1/chat/completions", chat(model), 1, 1)[2]
                pairs.append(got["forwarded"] - got["slave"])
            added[1] = pairs
            unit = "pairs"
            print(f"one client, {args.pairs} pairs of 1 s cells (slave, forwarded; order alternating): "
                  f"+p50 {spread(pairs, 1000)} ms")
        print(f"target: forwarding adds <= {ADDED_P50_TARGET_MS:.1f} ms at p50, one client: "
              f"{verdict(added[1], ADDED_P50_TARGET_MS / 1000, unit=unit)}")
        every = ratios[1] + ratios[16]
        print(f"target: master CPU per forwarded request <= {CPU_RATIO_TARGET:.1f} x the floor's: "
              f"{spread(every)}, {verdict(every, CPU_RATIO_TARGET)}")
    finally:
        if naive is not None:
            naive.terminate()
            naive.wait(10)
        if slave is not None:
            slave.stop()
        master.stop()


# -- (b) one health-poll cycle over many slaves --------------------------------------------------


def fake_telemetry() -> dict[str, Any]:
    """A slave's full reading, as large as a busy GPU node's: two GPUs, three runtimes, two flags."""
    gpu = {"index": 0, "name": "NVIDIA GeForce RTX 4090", "utilization_percent": 87.0,
           "memory_used_bytes": 20 * 1024 ** 3, "memory_total_bytes": 24 * 1024 ** 3, "temperature_c": 71.0,
           "power_w": 312.5, "power_limit_w": 450.0}
    counters = {"tokens_per_second": 41.25, "prompt_tokens_per_second": 2400.5, "requests_processing": 1,
                "requests_deferred": 2, "prompt_tokens_total": 123456, "prompt_tokens_cached_total": 2345,
                "tokens_predicted_total": 65432, "n_tokens_max": 4096}
    runtimes = [{"kind": kind, "backend": backend, "state": "ready", "model_id": f"{kind}-model",
                 "queue_depth": 3, "loaded_since_ms": 1_700_000_000_000, "last_load_ms": 2345, "loads": 7,
                 "failed_loads": 1, "counters": counters if backend == "llama-server" else None,
                 "counters_error": ""}
                for kind, backend in (("text", "llama-server"), ("image", "sd-server"),
                                      ("stt", "whisper-server"))]
    return {"taken_ms": 1_700_000_000_000, "window_s": 600.0,
            "host": {"cpu_percent": 37.5, "cpu_count": 32, "memory_used_bytes": 40 * 1024 ** 3,
                     "memory_total_bytes": 128 * 1024 ** 3}, "host_error": "",
            "gpu": {"state": "ok", "reason": "", "gpus": [gpu, {**gpu, "index": 1}]},
            "runtimes": runtimes, "failed_requests": 2,
            "attention": [{"code": "swap_thrash", "runtime": "text",
                           "message": "text runtime loaded 7 times in 10 min, swapping a, b"},
                          {"code": "failed_requests", "runtime": None,
                           "message": "2 failed request(s) in 10 min"}]}


def fake_snapshot(index: int, url: str, telemetry: bool = False) -> dict[str, Any]:
    def record(local_id: str, filename: str, config_hash: str, model_hash: str,
               **caps: Any) -> dict[str, Any]:
        return {"local_id": local_id, "public_id": local_id, "filename": filename, "node_id": f"fake-{index}",
                "node_url": url, "backend_mode": "llama_sdcpp", "config_hash": config_hash,
                "model_hash": model_hash, "capabilities": caps, "available": True, "loaded": False,
                "disabled": False}

    return {"node_id": f"fake-{index}", "node_url": url, "build_version": "x", "protocol_version": 2,
            **({"telemetry": fake_telemetry()} if telemetry else {}),
            "models": [
                record("chat-shared", "chat-shared.kcpps", "c" * 64, "m" * 64, llm=True, context=4096),
                record(f"own-{index}", f"own-{index}.kcpps", f"{index:064x}", f"{index + 7:064x}", llm=True,
                       context=2048),
                record("whisper", "whisper.kcpps", "w" * 64, "v" * 64, stt=True),
            ]}


CHAT_ANSWER = json.dumps({
    "id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": "chat-shared",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}).encode()


def serve_fake_nodes(count: int, delay_ms: float, telemetry: bool = False) -> None:
    """Helper process: ``count`` listeners; prints their ports as one JSON line, runs until stdin closes."""
    from twisted.internet import reactor as _reactor
    from twisted.internet import stdio
    from twisted.internet.protocol import Protocol
    from twisted.web import resource, server

    reactor: Any = _reactor

    class Models(resource.Resource):
        isLeaf = True

        def __init__(self, body: bytes) -> None:
            super().__init__()  # type: ignore[no-untyped-call]
            self.body = body
            self.polls = 0

        def render_POST(self, request: Any) -> Any:  # noqa: N802 - twisted.web's name
            # A forwarded chat ((c)): answered at once, as a zero-delay backend would.
            request.setHeader(b"content-type", b"application/json")
            if not request.path.startswith(b"/router/v1/node/inference/"):
                request.setResponseCode(404)
                return b"{}"
            return CHAT_ANSWER

        def render_GET(self, request: Any) -> Any:  # noqa: N802 - twisted.web's name
            request.setHeader(b"content-type", b"application/json")
            if request.path != b"/router/v1/node/models":
                request.setResponseCode(404)
                return b"{}"
            body = self.body
            if telemetry:  # every poll brings a new reading, as a live slave's would
                self.polls += 1
                taken = b'"taken_ms": %d' % (1_700_000_000_000 + self.polls)
                body = body.replace(b'"taken_ms": 1700000000000', taken)
            if delay_ms <= 0:
                return body

            def finish() -> None:
                request.write(body)
                request.finish()

            reactor.callLater(delay_ms / 1000, finish)
            return server.NOT_DONE_YET

    ports = []
    for index in range(count):
        models = Models(b"")
        listener = reactor.listenTCP(0, server.Site(models), interface="127.0.0.1")
        port = listener.getHost().port
        models.body = json.dumps(fake_snapshot(index, f"http://127.0.0.1:{port}", telemetry)).encode()
        ports.append(port)

    class Stdin(Protocol):
        def connectionLost(self, reason: Any = None) -> None:  # noqa: N802 - Twisted's name
            reactor.stop()

    stdio.StandardIO(Stdin())
    print(json.dumps(ports), flush=True)
    reactor.run()


async def polling(slaves: int, delays: list[float], cycles: int) -> None:
    from twisted.internet import defer, reactor

    from routerd.cluster.master import POLL_CONCURRENCY
    from routerd.config.load import parse_config
    from routerd.node import Node

    root = tempdir()
    (root / "models").mkdir()
    print(f"(b) one health-poll cycle over {slaves} slaves (fake nodes in a separate process, "
          f"POLL_CONCURRENCY = {POLL_CONCURRENCY}); CPU is the polling process")
    print(f"{'slave delay ms':>14} {'telemetry':>9} {'first cycle ms':>15} {'steady p50 ms':>14} "
          f"{'steady max ms':>14} {'CPU ms/cycle':>13} {'healthy':>8}  "
          f"target <= {POLL_TARGET_S * 1000:.0f} ms")
    results: list[tuple[float, float]] = []
    ratios: list[tuple[float, float]] = []
    for turn, delay in enumerate(delays):
        figures: dict[bool, tuple[float, float]] = {}
        for telemetry in ((False, True) if turn % 2 == 0 else (True, False)):
            flags = ["--with-telemetry"] if telemetry else []
            helper = subprocess.Popen([sys.executable, __file__, "--serve-fake-nodes", str(slaves),
                                       "--delay-ms", str(delay), *flags],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            try:
                assert helper.stdout is not None
                ports = json.loads(helper.stdout.readline())
                urls = [f"http://127.0.0.1:{p}" for p in ports]
                config = parse_config({
                    "server": {"bind": "127.0.0.1:0"},
                    "models": {"config_dir": str(root / "models")},
                    "cluster": {"role": "master", "node_id": "master", "token": TOKEN, "slave_urls": urls,
                                "store_dir": str(root / "store")},
                }, base_dir=str(root), env={})
                node = Node(config, reactor)
                assert node.master is not None
                if not telemetry:
                    node.master._polled.clear()  # as before the rack telemetry: no reading of its own
                walls: list[float] = []
                cpus: list[float] = []
                for _ in range(cycles):
                    cpu0, start = time.process_time(), time.perf_counter()
                    await node.master.poll_all()
                    walls.append(time.perf_counter() - start)
                    cpus.append(time.process_time() - cpu0)
                healthy = sum(1 for n in node.master.registry.nodes() if n.healthy)
                if telemetry:
                    carried = sum(1 for n in node.master.registry.nodes() if n.telemetry is not None)
                    assert carried == healthy, f"{carried} of {healthy} snapshots carried telemetry"
                    reading_us, json_us = one_reading(node)
                steady = walls[1:] or walls
                figures[telemetry] = (statistics.median(steady), statistics.median(cpus))
                results.append((delay, max(walls)))
                print(f"{delay:14.0f} {'on' if telemetry else 'off':>9} {walls[0] * 1000:15.1f} "
                      f"{statistics.median(steady) * 1000:14.1f} {max(steady) * 1000:14.1f} "
                      f"{statistics.median(cpus) * 1000:13.1f} {healthy:>5}/{slaves}")
                await defer.ensureDeferred(node.stop())
            finally:
                if helper.stdin is not None:
                    helper.stdin.close()
                helper.wait(10)
        (off_wall, off_cpu), (on_wall, on_cpu) = figures[False], figures[True]
        ratios.append((on_wall / off_wall, on_cpu / off_cpu))
        print(f"{'':14} {'on ÷ off':>9} {'':15} {on_wall / off_wall:14.2f} {'':14} {on_cpu / off_cpu:13.2f}")
    walls_ratio = statistics.median(r[0] for r in ratios)
    cpus_ratio = statistics.median(r[1] for r in ratios)
    print(f"telemetry on ÷ off over {len(ratios)} same-run pairs, median: steady p50 {walls_ratio:.2f} x, "
          f"CPU per cycle {cpus_ratio:.2f} x (min {min(r[1] for r in ratios):.2f}, "
          f"max {max(r[1] for r in ratios):.2f})")
    print(f"one reading of the master's own telemetry here (psutil, NVML, no backend loaded): "
          f"{reading_us:.0f} µs; its JSON for a snapshot: {json_us:.0f} µs")
    plain, carried = snapshot_parse_us()
    print(f"one slave's snapshot as the master reads it (JSON decode + parse_snapshot + registry refresh), "
          f"median of 2,000: {plain:.1f} µs without telemetry, {carried:.1f} µs with a full reading "
          f"(+{carried - plain:.1f} µs a slave a cycle, {carried / plain:.2f} x)")
    for delay, worst in results:
        verdict = "met" if worst <= POLL_TARGET_S else "MISSED"
        print(f"target: one {slaves}-slave cycle within {POLL_TARGET_S:.0f} s at {delay:.0f} ms per slave: "
              f"worst {worst * 1000:.0f} ms ({verdict})")


def snapshot_parse_us() -> tuple[float, float]:
    """Microseconds the master spends on one slave's answer once received, without and with telemetry
    (interleaved, the median of 2,000 each): decode, strict parse, and the registry's unchanged refresh."""
    from routerd.registry.identity import MemoryPublicIdStore
    from routerd.registry.registry import Registry
    from routerd.wire.records import parse_snapshot

    url = "http://127.0.0.1:9"
    bodies = {flag: json.dumps(fake_snapshot(1, url, flag)).encode() for flag in (False, True)}
    registry = Registry("master", "", MemoryPublicIdStore())
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(2000):
        for flag, body in bodies.items():
            start = time.perf_counter()
            registry.update_node(parse_snapshot(json.loads(body)), url)
            times[flag].append(time.perf_counter() - start)
    return statistics.median(times[False]) * 1e6, statistics.median(times[True]) * 1e6


def one_reading(node: Any) -> tuple[float, float]:
    """Microseconds per reading of ``node``'s own telemetry (taken at once: no backend to scrape), and per
    JSON of it (what a slave adds to each snapshot it answers), the median of 200 each."""
    telemetry = node.telemetry
    readings, jsons = [], []
    for _ in range(200):
        start = time.perf_counter()
        telemetry.refresh()
        readings.append(time.perf_counter() - start)
        start = time.perf_counter()
        telemetry.reading_json()
        jsons.append(time.perf_counter() - start)
    return statistics.median(readings) * 1e6, statistics.median(jsons) * 1e6


# -- (c) a master routing for many slaves against its local path ---------------------------------


async def routing(args: argparse.Namespace) -> None:
    """Master throughput forwarding ``chat-shared`` to ``slaves`` fake slaves (one helper process,
    every slave a replica of the same model: the master rotates over all of them) against its own
    zero-delay ``local-zero``, in alternating cells of the same run."""
    slaves = args.routed_slaves
    root = tempdir()
    helper = subprocess.Popen([sys.executable, __file__, "--serve-fake-nodes", str(slaves)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    master: NodeProcess | None = None
    try:
        assert helper.stdout is not None
        urls = [f"http://127.0.0.1:{p}" for p in json.loads(helper.stdout.readline())]
        port = free_port()
        cfg = write_node(root / "master", port,
                         {"local-zero": {"model": "../weights/local-zero.sim.json", "contextsize": 4096,
                                         "parallel": 64}},
                         {"local-zero": ZERO},
                         {"role": "master", "node_id": "master", "token": TOKEN, "slave_urls": urls})
        master = NodeProcess(cfg, port)
        master.wait_ready()
        end = time.monotonic() + 60
        while True:
            inventory = json.loads(urllib.request.urlopen(master.url + "/router/v1/site/inventory").read())
            if sum(1 for n in inventory["nodes"] if n["healthy"]) >= slaves:
                break
            if time.monotonic() > end:
                raise RuntimeError("the fake slaves never all became healthy")
            time.sleep(0.2)
        post(master.url + "/router/v1/load", {"model": "local-zero"})
        url = master.url + "/v1/chat/completions"
        http = client()
        await run_load(http, url, chat("local-zero"), 8, 300)  # warm both paths
        await run_load(http, url, chat("chat-shared"), 8, 300)
        seconds = args.seconds if args.wrk else None
        size = f"{args.seconds:g} s of wrk" if args.wrk else f"{args.requests} requests (Python client)"
        print(f"(c) a master routing for {slaves} simulated slaves (one helper process, real HTTP) against "
              f"its local path; {size} per cell, {args.rounds} rounds, the two paths' order alternated "
              f"every round; CPU is the master process")
        print(f"{'clients':>7} {'rnd':>3} {'path':>9} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
              f"{'master CPU ms/req':>18} {'fwd/local req/s':>16} {'fwd/local CPU':>14}")
        ratios: dict[int, list[float]] = {}
        cpu_ratios: dict[int, list[float]] = {}
        paths = {"local": "local-zero", "forwarded": "chat-shared"}
        for conc in (1, 16, 64):
            for rnd in range(1, args.rounds + 1):
                cells: dict[str, Cell] = {}
                for path in rotated(list(paths), rnd):
                    cells[path] = await measure(http, url, chat(paths[path]), conc, pid=master.proc.pid,
                                                seconds=seconds, requests=args.requests)
                local, fwd = cells["local"], cells["forwarded"]
                assert local.cpu is not None and fwd.cpu is not None
                ratios.setdefault(conc, []).append(fwd.rate / local.rate)
                cpu_ratios.setdefault(conc, []).append(fwd.cpu / local.cpu)
                for path in paths:
                    cell = cells[path]
                    assert cell.cpu is not None
                    extra = (f" {fwd.rate / local.rate:16.2f} {fwd.cpu / local.cpu:14.2f}"
                             if path == "forwarded" else "")
                    print(f"{conc:>7} {rnd:>3} {path:>9} {cell.rate:8.0f} {ms(cell.p50)} {ms(cell.p99)} "
                          f"{cell.cpu * 1000:18.3f}{extra}{errors(cell)}")
        for conc, got in ratios.items():
            print(f"target: forwarded throughput >= local at {conc} clients: {spread(got)} x local, "
                  f"{verdict(got, 1.0, at_least=True)}; master CPU per request fwd/local "
                  f"{spread(cpu_ratios[conc])}")
    finally:
        if master is not None:
            master.stop()
        if helper.stdin is not None:
            helper.stdin.close()
        helper.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=4, help="seconds per wrk cell of (a) and (c)")
    parser.add_argument("--requests", type=int, default=2000,
                        help="requests per cell of (a) and (c) with the Python client")
    parser.add_argument("--python", action="store_true", help="use the Python client even if wrk exists")
    parser.add_argument("--pairs", type=int, default=12,
                        help="pairs of 1 s wrk cells (slave, forwarded) judging (a)'s added p50")
    parser.add_argument("--slaves", type=int, default=200, help="fake slaves polled in (b)")
    parser.add_argument("--cycles", type=int, default=6, help="poll cycles per row of (b)")
    parser.add_argument("--poll-delay-ms", default="0,10,40",
                        help="comma-separated answer delays of the fake slaves in (b)")
    parser.add_argument("--routed-slaves", type=int, default=32,
                        help="fake slaves the master routes to in (c)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every cell of (a) and (c)")
    parser.add_argument("--only", choices=("forward", "poll", "route"), default=None)
    parser.add_argument("--serve-fake-nodes", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--delay-ms", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--with-telemetry", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.wrk = not args.python and have_wrk()
    if args.serve_fake_nodes:
        serve_fake_nodes(args.serve_fake_nodes, args.delay_ms, args.with_telemetry)
        return
    delays = [float(x) for x in args.poll_delay_ms.split(",") if x.strip()]

    async def both() -> None:
        if args.only in (None, "forward"):
            await forwarding(args)
        if args.only is None:
            print()
        if args.only in (None, "poll"):
            await polling(args.slaves, delays, args.cycles)
        if args.only is None:
            print()
        if args.only in (None, "route"):
            await routing(args)

    run(both)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
