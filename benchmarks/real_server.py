"""The real-server target of ``overhead.py``: llama.cpp's ``llama-server`` direct against through routerd.

One routerd node (a ``twistd`` process) serves the tiny generated GGUF (``tests.support_models``: every
prompt answered with the same sentence; ``ignore_eos`` makes it go on to ``max_tokens``) on the real
``llama-server`` (``python -m tests.real_servers install`` builds it once per machine), started by routerd
with ``-t 1`` and ``parallel`` = the highest concurrency, so 8 clients run in 8 slots at once.  Both paths
reach the same server process: ``direct`` is its own port, ``routerd`` the node's.

For each round and each concurrency (1 client, then 8), each path in turn (the order alternates by round,
so a drift of the machine's load favours neither): every client sends ``--real-streams`` streamed chats
one after the other; a stream's time to first token (TTFT) is the time to its first ``delta.content``;
tokens/s is every completion token of the cell (the final usage chunk) over the cell's wall time.  The
ratios through routerd ÷ direct are printed per round, and their spread (min, median, max) over the
rounds at the end: tokens/s ratio < 1 and TTFT ratio > 1 are routerd's cost.  routerd's own CPU per
stream (its process alone, from /proc) is printed beside them.

Run: .venv/bin/python benchmarks/overhead.py --real [--rounds 3] [--real-streams 20] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import attrs
from _harness import NodeProcess, cpu_seconds, free_port, run, tempdir, write_node
from treq.client import HTTPClient
from twisted.internet import defer, reactor
from twisted.web.client import Agent, HTTPConnectionPool

ROOT = Path(__file__).resolve().parent.parent

#: Concurrency levels measured (clients, each sending its streams one after the other).
LEVELS = (1, 8)
#: Cell name -> (path, concurrency); the two paths' ratios are computed per (round, concurrency).
PATHS = ("direct", "routerd")


@attrs.frozen
class StreamCell:
    """One path at one concurrency in one round."""

    tokens: int  # completion tokens of every stream (from the final usage chunks)
    elapsed: float  # the cell's wall time, seconds
    ttft: list[float]  # time to the first content token of each stream, seconds

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.elapsed

    @property
    def ttft_median(self) -> float:
        return statistics.median(self.ttft)


def fresh_connections() -> HTTPClient:
    """A client that opens a connection per request.  llama-server closes its connection after a
    streamed answer (while its headers say ``Keep-Alive``): a pool that reuses it fails the next POST
    (``ResponseNeverReceived``).  Both paths get the same fresh connections, so neither is favoured."""
    return HTTPClient(Agent(reactor, pool=HTTPConnectionPool(reactor, persistent=False)))


def chat(max_tokens: int) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}


class _Events:
    """Reads SSE ``data:`` lines as they arrive: when the first content came, and the usage."""

    def __init__(self, start: float) -> None:
        self.start = start
        self.first: float | None = None
        self.tokens = 0
        self._rest = b""

    def feed(self, data: bytes) -> None:
        lines = (self._rest + data).split(b"\n")
        self._rest = lines.pop()
        for line in lines:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            event = json.loads(line[6:])
            if self.first is None and any((c.get("delta") or {}).get("content") for c in event["choices"]):
                self.first = time.perf_counter() - self.start
            usage = event.get("usage")
            if usage:
                self.tokens = int(usage["completion_tokens"])


async def stream_cell(http: Any, url: str, conc: int, streams: int, max_tokens: int) -> StreamCell:
    """``conc`` clients, each sending ``streams`` streamed chats in turn."""
    import treq

    payload = json.dumps(chat(max_tokens)).encode()
    ttft: list[float] = []
    tokens = [0]

    async def one_client() -> None:
        for _ in range(streams):
            events = _Events(time.perf_counter())
            response = await http.post(url, data=payload, headers={b"content-type": [b"application/json"]},
                                       unbuffered=True)
            if response.code != 200:
                raise RuntimeError(f"{url} answered {response.code}: {await response.text()}")
            await treq.collect(response, events.feed)
            if events.first is None or events.tokens != max_tokens:
                raise RuntimeError(f"{url}: a stream without content or usage ({events.tokens} tokens)")
            ttft.append(events.first)
            tokens[0] += events.tokens

    start = time.perf_counter()
    await defer.gatherResults([defer.Deferred.fromCoroutine(one_client()) for _ in range(conc)],
                              consumeErrors=True)
    return StreamCell(tokens[0], time.perf_counter() - start, ttft)


def spread(values: list[float]) -> str:
    return f"{min(values):.3f} / {statistics.median(values):.3f} / {max(values):.3f}"


def start_node(root: Path, llama_server: str, parallel: int) -> NodeProcess:
    """A node on ``llama_server`` serving the tiny model, loaded and ready."""
    sys.path.insert(0, str(ROOT))
    from tests.support_models import write_tiny_llama

    model = write_tiny_llama(root / "tiny.gguf")
    port = free_port()
    kcpps = {"model": str(model), "contextsize": 512 * parallel, "parallel": parallel}
    llama = {"binary_path": [llama_server, "-t", "1"]}
    cfg = write_node(root, port, {"tiny": kcpps}, {}, extra={"llama": llama})
    node = NodeProcess(cfg, port)
    node.wait_ready()
    load = json.dumps({"model": "tiny"}).encode()
    urllib.request.urlopen(urllib.request.Request(node.url + "/router/v1/load", data=load), timeout=60).read()
    return node


def backend_url(node: NodeProcess) -> str:
    state = json.loads(urllib.request.urlopen(node.url + "/router/v1/state").read())
    port = [r for r in state["runtimes"] if r["kind"] == "text"][0]["port"]
    return f"http://127.0.0.1:{port}"


def real_servers_llama() -> str:
    sys.path.insert(0, str(ROOT))
    from tests import real_servers

    try:
        return real_servers.paths(real_servers.cache_root())["llama-server"]
    except real_servers.InstallError as missing:
        raise SystemExit("llama-server is not installed (python -m tests.real_servers install):\n"
                         f"{missing}") from None


def main(args: argparse.Namespace) -> None:
    llama_server = real_servers_llama()
    node = start_node(tempdir(), llama_server, max(LEVELS))
    try:
        urls = {"direct": backend_url(node) + "/v1/chat/completions",
                "routerd": node.url + "/v1/chat/completions"}
        ratios: dict[tuple[int, str], list[float]] = {}

        async def measure() -> None:
            http = fresh_connections()
            for url in urls.values():  # warm both paths (connections, the prompt cache)
                await stream_cell(http, url, max(LEVELS), 2, args.max_tokens)
            print(f"real llama-server ({llama_server}), tiny model, -t 1, parallel {max(LEVELS)}; "
                  f"{args.real_streams} streams per client, max_tokens {args.max_tokens}, ignore_eos")
            print(f"{'c':>3} {'rnd':>3} {'path':>8} {'tok/s':>9} {'TTFT ms':>8}   {'tok/s ratio':>11} "
                  f"{'TTFT ratio':>10} {'+TTFT ms':>8} {'routerd CPU ms/stream':>21}")
            for conc in LEVELS:
                for rnd in range(1, args.rounds + 1):
                    order = PATHS if rnd % 2 else tuple(reversed(PATHS))
                    cells = {}
                    for name in order:
                        cpu0 = cpu_seconds(node.proc.pid)
                        cells[name] = await stream_cell(http, urls[name], conc, args.real_streams,
                                                        args.max_tokens)
                        if name == "routerd":  # routerd's own process (its llama-server child not counted)
                            cpu = (cpu_seconds(node.proc.pid) - cpu0) / (conc * args.real_streams)
                    direct, routed = cells["direct"], cells["routerd"]
                    rate = routed.tokens_per_s / direct.tokens_per_s
                    first = routed.ttft_median / direct.ttft_median
                    ratios.setdefault((conc, "tok/s"), []).append(rate)
                    ratios.setdefault((conc, "TTFT"), []).append(first)
                    added = (routed.ttft_median - direct.ttft_median) * 1000
                    ratios.setdefault((conc, "+TTFT ms"), []).append(added)
                    for name in PATHS:
                        cell = cells[name]
                        tail = (f"   {rate:11.3f} {first:10.3f} {added:8.2f} {cpu * 1000:21.2f}"
                                if name == "routerd" else "")
                        print(f"{conc:>3} {rnd:>3} {name:>8} {cell.tokens_per_s:9.0f} "
                              f"{cell.ttft_median * 1000:8.2f}{tail}")
                    ratios.setdefault((conc, "CPU ms"), []).append(cpu * 1000)
            print("routerd ÷ direct over the rounds (min / median / max):")
            for conc in LEVELS:
                got = {what: spread(ratios[(conc, what)]) for what in ("tok/s", "TTFT", "+TTFT ms", "CPU ms")}
                print(f"  c={conc}: tok/s {got['tok/s']}; TTFT {got['TTFT']}; +TTFT ms {got['+TTFT ms']}; "
                      f"routerd CPU ms/stream {got['CPU ms']}")

        run(measure)
    finally:
        node.stop()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("the real-server target (--real)")
    group.add_argument("--real", action="store_true",
                       help="measure llama-server direct vs through routerd (tokens/s, TTFT) instead")
    group.add_argument("--real-streams", type=int, default=20, help="streams per client per cell (--real)")
    group.add_argument("--max-tokens", type=int, default=64, help="tokens per stream (--real)")


__all__ = ["add_arguments", "main", "stream_cell"]
