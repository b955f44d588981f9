"""Fault soak: a cluster under mixed load while processes crash, freeze and restart (issue 12).

Three ``twistd`` nodes on 127.0.0.1, each with simulator backends, in a temporary directory:

* ``master``: routes every client request; serves the embedding model ``embed`` itself.
* ``slave-a`` (the owner): text ``alpha``, image ``paint``, transcription ``ears``.
* ``slave-b`` (the helper): text ``bravo``, image ``brush``.

Lending links (made on the master's site API): ``slave-a/alpha → slave-b/bravo`` (text lane) and
``slave-a/paint → slave-b/brush`` (image lane), loads allowed.  Clients send every request to the
master: chat (whole and streamed), embeddings, image generation and transcription, ``--concurrency``
at a time, ``--requests`` in all.  Each request carries a unique soak ID (header ``X-Soak-Id``) and
is answered exactly once or it is *lost*.

Faults, each when that share of the requests has been answered:

====  =====================================================================================
10 %  the helper (``slave-b``: routerd and its backends) is SIGKILLed; restarted ``--restart-after`` s later
25 %  ``slave-a``'s text backend crashes mid-generation (``/sim/control {"crash_after": 0}``),
      and its replacement crashes mid-load (the same, as soon as it answers and is loading)
45 %  the master is restarted (SIGTERM: drain; then started again on the same port)
60 %  ``slave-a`` (its routerd) is frozen with SIGSTOP for ``--freeze`` s
75 %  ``slave-a``'s database directory is read-only for ``--read-only`` s (a read-only bind mount;
      where mounting is not allowed, chmod, which root ignores: the report says which)
====  =====================================================================================

A client retries only what no node accepted: a refused connection, a 429 or a 503 that carries
``Retry-After`` (starting, draining, saturated) — routerd guarantees those were not served.  Every
other outcome is final.  Report:

* answered (per final status / error code), lost (the connection closed with no answer),
  retries by reason, p50/p99 latency of the answered requests;
* duplicated: request IDs (``X-Routerd-Request-Id``, the same on every hop) whose answer was
  produced by a backend more than once, read from every node's access log (a line whose
  ``node=`` is the logging node itself and whose status is 2xx produced the answer);
* RSS of slave-a's routerd (never restarted) after a fault-free burst at full concurrency and
  after the run.

Targets: 0 lost, 0 duplicated, errors only where a backend really failed mid-answer (the crash
faults), RSS of slave-a within 10 % of its post-warm-up value.

Run: .venv/bin/python benchmarks/soak.py [--requests 10000] [--concurrency 64] [--freeze 20]
     [--read-only 10] [--restart-after 3] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
from treq.client import HTTPClient
from twisted.internet import defer, reactor, task
from twisted.internet.error import ConnectError, ConnectionRefusedError, DNSLookupError
from twisted.web.client import Agent, HTTPConnectionPool

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _harness import SIM, TWISTD, free_port  # noqa: E402
from _harness import write_node as write_node_config  # noqa: E402

from routerd.sim.wav import make_wav  # noqa: E402

TOKEN = "soak-cluster-token-0123456789"
TEXT = {"kind": "text", "load_ms": 600, "prompt_tokens_per_s": 5000, "gen_tokens_per_s": 400,
        "context": 4096}
EMBED = {"kind": "text", "load_ms": 100, "prompt_tokens_per_s": 20000, "gen_tokens_per_s": 400,
         "context": 4096, "embedding_dim": 8}
IMAGE = {"kind": "image", "load_ms": 300, "ms_per_step_megapixel": 400}
EARS = {"kind": "stt", "load_ms": 100, "realtime_factor": 0.02}
#: A refit every 5 s: the first one (which imports statsmodels, ~12 MB) happens before the RSS
#: baseline is read, not in the middle of the run.
LENDING = {"scheduling_min_samples": 3, "offload_probe_idle": "500ms", "scheduling_refresh_interval": "5s"}
WAV = make_wav(0.5)
#: Access line: "... POST /path 200 123B 4ms model=m node=N lent_to=- id=R client=..."
ACCESS = re.compile(r" (?P<status>\d{3}) \d+B .* node=(?P<node>\S+) lent_to=\S+ id=(?P<id>\S+) ")
KINDS = ("chat", "stream", "embed", "image", "stt")
#: Share of requests of each kind (the rest of 100 are chats).
MIX = {"stream": 25, "embed": 15, "image": 10, "stt": 15}


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def sleep(seconds: float) -> None:
    await task.deferLater(reactor, seconds, lambda: None)


@attrs.define
class NodeProc:
    """One routerd node as a ``twistd`` process in its own session (its backends share it)."""

    name: str
    root: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [TWISTD, "-n", "--pidfile=", "--logfile", str(self.root / "routerd.log"), "routerd",
             "--config", str(self.root / "node.yaml")],
            cwd=self.root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill_all(self) -> None:
        """SIGKILL routerd and every backend it started (they share its process group)."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def backend_ports(self, family: str) -> list[int]:
        """Ports of this node's running simulator backends of ``family`` (from /proc)."""
        ports = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if os.getpgid(int(entry.name)) != self.pid or int(entry.name) == self.pid:
                    continue
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except (OSError, ProcessLookupError):
                continue
            words = [a.decode() for a in argv if a]
            if "routerd.sim" in words and family in words and "--port" in words:
                ports.append(int(words[words.index("--port") + 1]))
        return ports

    def access_lines(self) -> list[tuple[str, int, str]]:
        """(node, status, request id) of every access line this node logged."""
        out = []
        for path in sorted(self.root.glob("routerd.log*")):
            for line in path.read_text(errors="replace").splitlines():
                if "routerd.access" not in line:
                    continue
                m = ACCESS.search(line)
                if m:
                    out.append((m["node"], int(m["status"]), m["id"]))
        return out


def _kcpps(key: str, name: str, **extra: Any) -> dict[str, Any]:
    return {key: f"../weights/{name}.sim.json", **extra}


def write_node(root: Path, port: int, models: dict[str, dict[str, Any]], weights: dict[str, dict[str, Any]],
               cluster: dict[str, Any]) -> None:
    write_node_config(root, port, models, weights, {"token": TOKEN, **LENDING, **cluster}, {
        "sdcpp": {"binary_path": [*SIM, "sd-server"]},
        "whispercpp": {"binary_path": [*SIM, "whisper-server"]},
        "limits": {"first_byte_timeout": "60s", "idle_stream_timeout": "30s"},
    }, server={"drain_timeout": "20s"})


@attrs.define
class Cluster:
    root: Path
    nodes: dict[str, NodeProc]

    @classmethod
    def plan(cls, root: Path) -> Cluster:
        ports = {name: free_port() for name in ("master", "slave-a", "slave-b")}
        url = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
        write_node(root / "master", ports["master"], {"embed": _kcpps("embeddingsmodel", "embed")},
                   {"embed": EMBED},
                   {"role": "master", "node_id": "master", "slave_urls": [url["slave-a"], url["slave-b"]],
                    "health_interval": "500ms"})
        write_node(root / "slave-a", ports["slave-a"],
                   {"alpha": _kcpps("model", "alpha", contextsize=4096), "paint": _kcpps("sdmodel", "paint"),
                    "ears": _kcpps("whispermodel", "ears")},
                   {"alpha": TEXT, "paint": IMAGE, "ears": EARS},
                   {"role": "slave", "node_id": "slave-a", "master_url": url["master"],
                    "public_url": url["slave-a"], "sync_interval": "500ms"})
        write_node(root / "slave-b", ports["slave-b"],
                   {"bravo": _kcpps("model", "bravo", contextsize=4096), "brush": _kcpps("sdmodel", "brush")},
                   {"bravo": TEXT, "brush": IMAGE},
                   {"role": "slave", "node_id": "slave-b", "master_url": url["master"],
                    "public_url": url["slave-b"], "sync_interval": "500ms"})
        return cls(root, {name: NodeProc(name, root / name, port) for name, port in ports.items()})

    def stop(self) -> None:
        for node in self.nodes.values():
            try:
                node.signal(signal.SIGCONT)
            except (AssertionError, ProcessLookupError):
                pass
            node.kill_all()


def client() -> HTTPClient:
    # one connection per request: a refused connection then surely was not accepted
    return HTTPClient(Agent(reactor, pool=HTTPConnectionPool(reactor, persistent=False)))


async def wait_for(check: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if await check():
                return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        await sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what}")


async def healthy(http: HTTPClient, node: NodeProc) -> bool:
    response = await http.get(node.url + "/health")
    await response.content()
    return bool(response.code == 200)


async def master_knows_all(http: HTTPClient, master: NodeProc) -> bool:
    response = await http.get(master.url + "/router/v1/site/inventory")
    body = json.loads(await response.content())
    nodes = {n["node_id"]: n.get("healthy") for n in body.get("nodes", [])}
    return nodes.get("slave-a") is True and nodes.get("slave-b") is True


def request_for(kind: str, soak_id: str) -> tuple[str, dict[str, Any]]:
    """(path, treq keyword arguments) of one request of ``kind``."""
    headers = {"X-Soak-Id": soak_id}
    if kind in ("chat", "stream"):
        return "/v1/chat/completions", {"headers": headers, "json": {
            "model": "alpha", "messages": [{"role": "user", "content": f"tell me about {soak_id}"}],
            "max_tokens": 8, "stream": kind == "stream", "user": soak_id}}
    if kind == "embed":
        return "/v1/embeddings", {"headers": headers, "json": {"model": "embed", "input": ["soak", soak_id]}}
    if kind == "image":
        return "/v1/images/generations", {"headers": headers, "json": {
            "model": "paint-paint", "prompt": f"a lighthouse {soak_id}", "size": "256x256", "steps": 4,
            "n": 1}}
    return "/v1/audio/transcriptions", {"headers": headers, "data": {"model": "ears"},
                                        "files": {"file": ("a.wav", "audio/wav", WAV)}}


@attrs.define
class Outcome:
    kind: str
    final: str = ""  # "ok", "http 502 backend_error", "lost ResponseFailed", ...
    answers: int = 0
    request_id: str | None = None
    lent_to: str | None = None
    seconds: float = 0.0
    retries: Counter[str] = attrs.Factory(Counter)
    soak_id: str = ""
    sent_at: float = 0.0  # time.monotonic() of the first send and of the end (a loss among the faults)
    ended_at: float = 0.0


def _error_code(body: bytes) -> str:
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return "non-json"
    if isinstance(error, dict):
        return str(error.get("code"))
    return "ollama" if isinstance(error, str) else "no-envelope"


async def one_request(http: HTTPClient, url: str, kind: str, soak_id: str, deadline: float) -> Outcome:
    outcome = Outcome(kind, soak_id=soak_id, sent_at=time.monotonic())
    path, kwargs = request_for(kind, soak_id)
    started = time.perf_counter()
    while True:
        try:
            d = http.post(url + path, **kwargs)
            timer = reactor.callLater(deadline, d.cancel)
            try:
                response = await d
                body = await response.content()
            finally:
                if timer.active():
                    timer.cancel()
        except (ConnectionRefusedError, ConnectError, DNSLookupError) as exc:
            outcome.retries[f"refused {type(exc).__name__}"] += 1
            await sleep(0.2)
            continue
        except defer.CancelledError:
            outcome.final = "lost timeout"
            break
        except Exception as exc:  # noqa: BLE001 - the connection broke: no answer
            outcome.final = f"lost {type(exc).__name__}"
            break
        retry_after = response.headers.getRawHeaders(b"retry-after")
        if response.code == 429 or (response.code == 503 and retry_after):
            outcome.retries[f"{response.code} {_error_code(body)}"] += 1
            await sleep(min(2.0, max(0.2, float(retry_after[0]) if retry_after else 0.5)))
            continue
        outcome.answers += 1
        ids = response.headers.getRawHeaders(b"x-routerd-request-id")
        outcome.request_id = ids[0].decode() if ids else None
        lent = response.headers.getRawHeaders(b"x-routerd-lent-to")
        outcome.lent_to = lent[0].decode() if lent else None
        if response.code != 200:
            outcome.final = f"http {response.code} {_error_code(body)}"
        elif kind == "stream" and not body.rstrip().endswith(b"data: [DONE]"):
            outcome.final = "broken stream (no [DONE])"
        else:
            outcome.final = "ok"
        break
    outcome.seconds = time.perf_counter() - started
    outcome.ended_at = time.monotonic()
    return outcome


@attrs.define
class SoakPlan:
    requests: int = 10_000
    concurrency: int = 64
    freeze_s: float = 20.0
    read_only_s: float = 10.0
    restart_after_s: float = 3.0
    deadline_s: float = 180.0
    faults: bool = True


@attrs.define
class Report:
    total: int
    outcomes: list[Outcome]
    duplicated: list[str]
    unlogged: int
    faults: list[str]
    rss_kb: dict[str, tuple[int, int]]
    seconds: float
    read_only_by: str
    rss_series: list[tuple[float, int]] = attrs.Factory(list)
    started: float = 0.0  # time.monotonic() when the faults' clock started

    @property
    def answered(self) -> int:
        return sum(1 for o in self.outcomes if o.answers == 1)

    @property
    def lost(self) -> int:
        return sum(1 for o in self.outcomes if o.answers == 0)

    @property
    def answered_twice(self) -> int:
        return sum(1 for o in self.outcomes if o.answers > 1)

    @property
    def errors(self) -> Counter[str]:
        return Counter(o.final for o in self.outcomes if o.final != "ok")

    def text(self) -> str:
        latencies = sorted(o.seconds for o in self.outcomes if o.final == "ok")
        p = (lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000) \
            if latencies else (lambda q: float("nan"))
        retries: Counter[str] = Counter()
        for o in self.outcomes:
            retries.update(o.retries)
        by_kind = Counter(o.kind for o in self.outcomes)
        lines = [
            f"requests {self.total} ({', '.join(f'{k} {by_kind[k]}' for k in KINDS)}) "
            f"in {self.seconds:.1f} s",
            f"answered {self.answered}  ok {sum(1 for o in self.outcomes if o.final == 'ok')}  "
            f"lost {self.lost}  duplicated {len(self.duplicated)} (answered twice on the client: "
            f"{self.answered_twice}; ok answers missing from the access logs: {self.unlogged})",
            f"latency of ok answers: p50 {p(0.5):.0f} ms  p99 {p(0.99):.0f} ms; lent (answered by the "
            f"helper): {sum(1 for o in self.outcomes if o.final == 'ok' and o.lent_to)}",
            "errors by class: " + (", ".join(f"{k}: {v}" for k, v in self.errors.most_common()) or "none"),
            "retried (not accepted): " + (", ".join(f"{k}: {v}" for k, v in retries.most_common()) or "none"),
            f"database made read-only by: {self.read_only_by}",
            "RSS (KiB) after warm-up -> after the run: " + ", ".join(
                f"{n} {a} -> {b} ({(b - a) * 100 / a:+.1f} %)" for n, (a, b) in self.rss_kb.items() if a),
            "slave-a RSS (KiB) during the run: " + ", ".join(f"{t:.0f}s {kb}" for t, kb in self.rss_series),
            "faults: " + "; ".join(self.faults),
        ]
        lines.extend(f"  {o.final}: {o.kind} {o.soak_id}, first sent at {o.sent_at - self.started:.2f}s, "
                     f"ended at {o.ended_at - self.started:.2f}s"
                     for o in self.outcomes if o.final.startswith("lost"))
        return "\n".join(lines)


class Soak:
    def __init__(self, plan: SoakPlan, cluster: Cluster) -> None:
        self.plan = plan
        self.cluster = cluster
        self.http = client()
        self.done = 0
        self.faults: list[str] = []
        self.read_only_by = "not run"
        self.t0 = time.monotonic()

    def note(self, text: str) -> None:
        self.faults.append(f"{time.monotonic() - self.t0:.1f}s {text}")

    @property
    def master(self) -> NodeProc:
        return self.cluster.nodes["master"]

    async def start_all(self) -> None:
        for node in self.cluster.nodes.values():
            node.start()
        for node in self.cluster.nodes.values():
            await wait_for(lambda node=node: healthy(self.http, node), 60, f"{node.name} ready")
        await wait_for(lambda: master_knows_all(self.http, self.master), 60, "the master to know both slaves")

    async def link(self) -> None:
        for path, owner, helper in (("/router/v1/site/text-routing-groups", "alpha", "bravo"),
                                    ("/router/v1/site/routing-groups", "paint-paint", "brush-brush")):
            response = await self.http.post(self.master.url + path, json={
                "anchor": {"node_id": "slave-a", "model_id": owner},
                "lends_to": [{"node_id": "slave-b", "model_id": helper, "load_if_unloaded": True,
                              "restore_after_borrow": False}],
                "acknowledge_different_weights": True})
            body = await response.content()
            if response.code != 200:
                raise RuntimeError(f"link {owner} -> {helper} refused: {response.code} {body!r}")

    async def warm_up(self) -> None:
        """Every kind a few times (cost samples for lending), one at a time."""
        for round_ in range(4):
            for kind in KINDS:
                outcome = await one_request(self.http, self.master.url, kind, f"warm-{kind}-{round_}", 60)
                if outcome.final != "ok":
                    raise RuntimeError(f"warm-up {kind}: {outcome.final}")
        for model in ("bravo", "brush-brush"):
            body = ({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
                    if model == "bravo" else {"model": model, "prompt": "hi", "size": "256x256", "steps": 4})
            path = "/v1/chat/completions" if model == "bravo" else "/v1/images/generations"
            for _ in range(4):
                response = await self.http.post(self.master.url + path, json=body)
                await response.content()

    async def burst(self) -> None:
        """``concurrency`` x 4 requests at full concurrency, no faults: the processes reach their
        working size before the RSS baseline is read (growth is then what the run adds)."""
        kinds = list(KINDS)

        async def one(index: int) -> None:
            await one_request(self.http, self.master.url, kinds[index % len(kinds)], f"burst-{index}", 60)

        await defer.gatherResults([defer.ensureDeferred(one(i)) for i in range(self.plan.concurrency * 4)],
                                  consumeErrors=True)

    async def at(self, share: float) -> None:
        while self.done < share * self.plan.requests:
            await sleep(0.1)

    async def faults_schedule(self) -> None:
        nodes = self.cluster.nodes
        helper, owner = nodes["slave-b"], nodes["slave-a"]
        await self.at(0.10)
        helper.kill_all()
        self.note("slave-b (helper) SIGKILLed with its backends")
        await sleep(self.plan.restart_after_s)
        helper.start()
        self.note("slave-b restarted")
        await self.at(0.25)
        crashed = await self.crash_backend(owner, "llama-server", "mid-generation")
        await self.crash_next_load(owner, set(crashed))
        await self.at(0.45)
        self.note("master SIGTERM (drain)")
        self.master.signal(signal.SIGTERM)
        while self.master.proc is not None and self.master.proc.poll() is None:
            await sleep(0.05)
        self.master.start()
        self.note("master started again")
        await self.at(0.60)
        owner.signal(signal.SIGSTOP)
        self.note(f"slave-a SIGSTOP for {self.plan.freeze_s:g} s")
        await sleep(self.plan.freeze_s)
        owner.signal(signal.SIGCONT)
        self.note("slave-a SIGCONT")
        await self.at(0.75)
        await self.read_only(owner.root / "store")

    async def crash_backend(self, node: NodeProc, family: str, when: str,
                            ports: list[int] | None = None) -> list[int]:
        ports = node.backend_ports(family) if ports is None else ports
        for port in ports:
            response = await self.http.post(f"http://127.0.0.1:{port}/sim/control", json={"crash_after": 0})
            await response.content()
        self.note(f"{node.name} {family} crashed {when} (ports {ports})")
        return ports

    async def crash_next_load(self, node: NodeProc, crashed: set[int]) -> None:
        """Wait for the replacement of the crashed text backend and crash it while it loads."""
        end = time.monotonic() + 30
        while time.monotonic() < end:
            for port in set(node.backend_ports("llama-server")) - crashed:
                try:
                    response = await self.http.get(f"http://127.0.0.1:{port}/sim/control")
                    state = json.loads(await response.content())
                except Exception:  # noqa: BLE001 - not listening yet
                    continue
                if state.get("loading"):
                    await self.crash_backend(node, "llama-server", "mid-load", [port])
                    return
                # loaded before it was seen loading: crash it (mid-generation) for another try
                crashed.update(await self.crash_backend(node, "llama-server", "mid-generation", [port]))
            await sleep(0.02)
        self.note("no loading backend caught within 30 s (crash mid-load skipped)")

    async def read_only(self, store: Path) -> None:
        mounted = subprocess.run(["mount", "--bind", "-o", "ro", str(store), str(store)],
                                 capture_output=True).returncode == 0
        self.read_only_by = "read-only bind mount" if mounted else "chmod 0555 (ignored by root)"
        if not mounted:
            store.chmod(0o555)
        self.note(f"slave-a store read-only for {self.plan.read_only_s:g} s ({self.read_only_by})")
        await sleep(self.plan.read_only_s)
        if mounted:
            subprocess.run(["umount", str(store)], check=False)
        else:
            store.chmod(0o755)
        self.note("slave-a store writable again")

    async def load(self) -> list[Outcome]:
        outcomes: list[Outcome] = []
        next_index = [0]
        kinds = [kind for kind, share in MIX.items() for _ in range(share)]
        kinds += ["chat"] * (100 - len(kinds))

        async def worker() -> None:
            while next_index[0] < self.plan.requests:
                index = next_index[0]
                next_index[0] += 1
                kind = kinds[(index * 37) % 100]
                outcome = await one_request(self.http, self.master.url, kind, f"soak-{index:06d}",
                                            self.plan.deadline_s)
                outcomes.append(outcome)
                self.done += 1

        await defer.gatherResults([defer.ensureDeferred(worker()) for _ in range(self.plan.concurrency)],
                                  consumeErrors=True)
        return outcomes


def duplicates(cluster: Cluster, outcomes: list[Outcome]) -> tuple[list[str], int]:
    """Request IDs whose answer more than one backend produced, and ok answers no log shows."""
    produced: Counter[str] = Counter()
    for node in cluster.nodes.values():
        for logged_node, status, request_id in node.access_lines():
            if logged_node == node.name and 200 <= status < 300:
                produced[request_id] += 1
    twice = sorted(rid for rid, n in produced.items() if n > 1)
    unlogged = sum(1 for o in outcomes if o.final == "ok" and o.request_id and produced[o.request_id] == 0)
    return twice, unlogged


async def run_soak(plan: SoakPlan, root: Path) -> Report:
    cluster = Cluster.plan(root)
    soak = Soak(plan, cluster)
    try:
        await soak.start_all()
        await soak.link()
        await soak.warm_up()
        await soak.burst()
        await sleep(6.0)  # one cost refit with the warm-up's samples
        rss_before = {name: rss_kb(node.pid) for name, node in cluster.nodes.items()}
        soak.t0 = started = time.monotonic()
        series: list[tuple[float, int]] = []
        sampler = task.LoopingCall(lambda: series.append((time.monotonic() - started,
                                                          rss_kb(cluster.nodes["slave-a"].pid))))
        sampler.start(5.0)
        faults = defer.ensureDeferred(soak.faults_schedule()) if plan.faults else defer.succeed(None)
        outcomes = await soak.load()
        await faults
        sampler.stop()
        seconds = time.monotonic() - started
        await sleep(3.0)  # let timers and caches settle before reading RSS
        rss_after = {name: rss_kb(node.pid) for name, node in cluster.nodes.items()}
        # restarted nodes have new processes: compare only slave-a's (never restarted)
        rss = {name: (rss_before[name] if name == "slave-a" else 0, rss_after[name]) for name in rss_after}
    finally:
        cluster.stop()
    twice, unlogged = duplicates(cluster, outcomes)
    return Report(plan.requests, outcomes, twice, unlogged, soak.faults, rss, seconds, soak.read_only_by,
                  series, started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--freeze", type=float, default=20.0)
    parser.add_argument("--read-only", type=float, default=10.0)
    parser.add_argument("--restart-after", type=float, default=3.0)
    parser.add_argument("--no-faults", action="store_true", help="the same load without faults (a baseline)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (logs)")
    args = parser.parse_args()
    plan = SoakPlan(args.requests, args.concurrency, args.freeze, args.read_only, args.restart_after,
                    faults=not args.no_faults)
    root = Path(tempfile.mkdtemp(prefix="routerd-soak-"))
    result: list[Any] = []

    async def go() -> None:
        report = await run_soak(plan, root)
        print(report.text())
        result.append(report)

    def done(outcome: Any) -> None:
        result.append(outcome)
        reactor.stop()

    reactor.callWhenRunning(lambda: defer.ensureDeferred(go()).addBoth(done))
    reactor.run()
    if args.keep:
        print(f"logs kept in {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    if result and hasattr(result[-1], "raiseException"):
        result[-1].raiseException()


if __name__ == "__main__":
    main()
