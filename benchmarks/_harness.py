"""Shared pieces of the benchmark scripts: start a node process, drive load, read CPU time."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import treq
from treq.client import HTTPClient
from twisted.internet import defer, reactor
from twisted.web.client import Agent, HTTPConnectionPool

SIM = [sys.executable, "-m", "routerd.sim"]
TWISTD = str(Path(sys.executable).parent / "twistd")
CLK_TCK = os.sysconf("SC_CLK_TCK")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.ports import free_port as free_port  # noqa: E402  (ports no other socket takes: see there)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def write_node(root: Path, port: int, models: dict[str, dict[str, Any]],
               weights: dict[str, dict[str, Any]], cluster: dict[str, Any] | None = None,
               extra: dict[str, Any] | None = None, server: dict[str, Any] | None = None) -> Path:
    """A node's folder under ``root``: simulator weights, ``.kcpps`` models and ``node.yaml``
    (listening on ``port``; ``cluster`` and ``server`` keys added to their sections, ``extra``
    sections added whole)."""
    (root / "models").mkdir(parents=True, exist_ok=True)
    (root / "weights").mkdir(parents=True, exist_ok=True)
    for name, spec in weights.items():
        (root / "weights" / f"{name}.sim.json").write_text(json.dumps({"weights": name, **spec}))
    for name, spec in models.items():
        (root / "models" / f"{name}.kcpps").write_text(json.dumps(spec))
    cfg = root / "node.yaml"
    cfg.write_text(json.dumps({
        "server": {"bind": f"127.0.0.1:{port}", **(server or {})},
        "models": {"config_dir": "models"},
        "llama": {"binary_path": [*SIM, "llama-server"]},
        "cluster": {"store_dir": "store", **(cluster or {})},
        **(extra or {}),
    }))
    return cfg


class NodeProcess:
    def __init__(self, cfg: Path, port: int, env: dict[str, str] | None = None) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen([TWISTD, "-n", "--pidfile=", "routerd", "--config", str(cfg)],
                                     cwd=cfg.parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     env={**os.environ, **(env or {})})

    def wait_ready(self, timeout: float = 60) -> None:
        self.wait_url(self.url + "/health", timeout)

    @staticmethod
    def wait_url(url: str, timeout: float = 60) -> None:
        """Wait until ``url`` answers."""
        import urllib.request

        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                urllib.request.urlopen(url, timeout=1).read()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"{url} did not answer")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def client() -> HTTPClient:
    pool = HTTPConnectionPool(reactor, persistent=True)
    pool.maxPersistentPerHost = 128
    return HTTPClient(Agent(reactor, pool=pool))


async def run_load(http: HTTPClient, url: str, body: dict[str, Any], concurrency: int,
                   total: int) -> tuple[float, list[float]]:
    """``total`` POSTs from ``concurrency`` loops; returns (elapsed seconds, latencies)."""
    latencies: list[float] = []
    remaining = [total]
    payload = json.dumps(body).encode()
    headers = {b"content-type": [b"application/json"]}

    async def loop() -> None:
        while remaining[0] > 0:
            remaining[0] -= 1
            start = time.perf_counter()
            response = await http.post(url, data=payload, headers=headers)
            await response.content()
            if response.code != 200:
                raise RuntimeError(f"{url} answered {response.code}")
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    await defer.gatherResults([defer.Deferred.fromCoroutine(loop()) for _ in range(concurrency)],
                              consumeErrors=True)
    return time.perf_counter() - start, latencies


async def first_chunk_latency(http: HTTPClient, url: str, body: dict[str, Any], rounds: int) -> list[float]:
    out: list[float] = []
    for _ in range(rounds):
        start = time.perf_counter()
        response = await http.post(url, json=body, unbuffered=True)
        first: list[float] = []

        def got(data: bytes, first: list[float] = first, start: float = start) -> None:
            if not first:
                first.append(time.perf_counter() - start)

        await treq.collect(response, got)
        out.append(first[0])
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(x: float) -> str:
    return f"{x * 1000:7.2f}"


def median(values: list[float]) -> float:
    return statistics.median(values)


def run(main: Callable[[], Any]) -> None:
    result: list[Any] = []

    def go() -> None:
        d = defer.ensureDeferred(main())
        d.addBoth(result.append)
        d.addBoth(lambda _: reactor.stop())

    reactor.callWhenRunning(go)
    reactor.run()
    if result and hasattr(result[0], "raiseException"):
        result[0].raiseException()


_UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


def have_wrk() -> bool:
    """Whether ``wrk`` is installed (it uses little CPU, so the client does not eat what is being
    measured on a small machine)."""
    return shutil.which("wrk") is not None


def _seconds(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if m is None:
        raise ValueError(f"unreadable wrk time {text!r}")
    return float(m.group(1)) * _UNIT[m.group(2)]


WrkResult = tuple[int, float, float, float, float, int]  # count, elapsed, p50, p99, max, non-2xx


def wrk_cell(url: str, body: dict[str, Any], conc: int, seconds: float) -> WrkResult:
    """``conc`` keep-alive connections POSTing ``body`` to ``url`` for ``seconds`` (one wrk thread)."""
    script = Path(tempfile.mkstemp(suffix=".lua")[1])
    script.write_text('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
                      f"wrk.body = {json.dumps(json.dumps(body))}\n")
    try:
        duration = f"-d{max(1, round(seconds))}s"
        argv = ["wrk", "-t1", f"-c{conc}", duration, "--latency", "-s", str(script), url]
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    finally:
        script.unlink()
    count_m = re.search(r"(\d+) requests in ([\d.]+\w+)", out)
    dist = dict(re.findall(r"^\s+(50|99)%\s+(\S+)\s*$", out, re.M))
    worst_m = re.search(r"Latency\s+\S+\s+\S+\s+(\S+)", out)
    if count_m is None or worst_m is None or not {"50", "99"} <= dist.keys():
        raise RuntimeError(f"unreadable wrk output:\n{out}")
    errors_m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return (int(count_m.group(1)), _seconds(count_m.group(2)), _seconds(dist["50"]), _seconds(dist["99"]),
            _seconds(worst_m.group(1)), int(errors_m.group(1)) if errors_m else 0)


class Cell:
    """One measured run of one path at one concurrency."""

    def __init__(self, count: int, elapsed: float, p50: float, p99: float, worst: float,
                 cpu: float | None, errors: int = 0) -> None:
        self.count, self.elapsed, self.p50, self.p99, self.worst = count, elapsed, p50, p99, worst
        self.cpu = cpu  # proxy CPU seconds per request (None when no process is watched)
        self.errors = errors

    @property
    def rate(self) -> float:
        return self.count / self.elapsed


async def measure(http: HTTPClient, url: str, body: dict[str, Any], conc: int, *, pid: int | None,
                  seconds: float | None, requests: int) -> Cell:
    """One cell: ``wrk`` for ``seconds`` when given, else ``requests`` POSTs from the Python client;
    ``pid``'s CPU (from /proc) per request."""
    cpu0 = cpu_seconds(pid) if pid is not None else 0.0
    if seconds is not None:
        count, elapsed, p50, p99, worst, errors = wrk_cell(url, body, conc, seconds)
    else:
        elapsed, lat = await run_load(http, url, body, conc, requests)
        count, p50, p99, worst, errors = len(lat), pct(lat, .5), pct(lat, .99), max(lat), 0
    cpu = (cpu_seconds(pid) - cpu0) / max(1, count) if pid is not None else None
    return Cell(count, elapsed, p50, p99, worst, cpu, errors)


def tempdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="routerd-bench-"))
