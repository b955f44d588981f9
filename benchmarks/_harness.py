"""Shared pieces of the benchmark scripts: start a node process, drive load, read CPU time."""

from __future__ import annotations

import json
import os
import signal
import socket
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


def tempdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="routerd-bench-"))
