"""``routerd-cluster``: a master and two slaves on this machine, as real ``twistd`` processes.

It reads the example configs (``master.yaml`` or ``routing-only-master.yaml``,
``slave-a.yaml``, ``slave-b.yaml``) from ``--config-dir``, or by default from
``./etc/cluster`` when run in a checkout, else from the copy ``pip install``
puts in ``<prefix>/share/routerd/cluster``.  It never edits them: it writes
copies into a run directory with the ports moved to ``--base-port`` (+1, +2)
and the model paths made absolute, so stores and logs land in the run
directory too.  It starts the master, then the slaves, waits until the
master's inventory shows every slave healthy, prints the URLs and a few curl
examples, and on Ctrl-C / SIGTERM stops all three.  A node that fails to start
makes it exit 1 after printing that node's last log lines.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import attrs

from routerd.demo.configs import DemoError, NodeSpec, default_config_dir, prepare

CLEAN_EXITS = (0, -signal.SIGTERM, -signal.SIGINT)
TAIL_LINES = 20
STOP_TIMEOUT_S = 20.0


class Interrupted(Exception):
    """Ctrl-C / SIGTERM arrived while the cluster was starting."""


def busy_ports(ports: Sequence[int]) -> list[int]:
    """The ports of ``ports`` that something on 127.0.0.1 already listens on."""
    busy = []
    for port in ports:
        with socket.socket() as probe:
            probe.settimeout(0.5)
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                busy.append(port)
    return busy


# -- processes ------------------------------------------------------------------


def twistd_command() -> list[str]:
    """``twistd`` next to the running Python (a venv's), else on PATH, else via the module."""
    beside = Path(sys.executable).parent / "twistd"
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    found = shutil.which("twistd")
    if found:
        return [found]
    return [sys.executable, "-c", "from twisted.scripts.twistd import run; run()"]


@attrs.define
class Child:
    spec: NodeSpec
    proc: subprocess.Popen[bytes] | None = None

    def start(self, cwd: Path) -> None:
        argv = [*twistd_command(), "-n", "--pidfile=", "routerd", "--config", str(self.spec.config)]
        with open(self.spec.log, "ab") as out:
            # Its own session: Ctrl-C reaches only this script, which stops the
            # nodes in order; a forced kill takes the node's backends with it.
            self.proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    @property
    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def tail(self, lines: int = TAIL_LINES) -> list[str]:
        try:
            text = self.spec.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return []
        return text.splitlines()[-lines:]

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, deadline: float) -> bool:
        """Wait for the exit until ``deadline`` (monotonic); kill the group after it."""
        if self.proc is None:
            return True
        try:
            self.proc.wait(max(0.0, deadline - time.monotonic()))
            return True
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
            return False


def get_json(url: str, timeout: float = 2.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def slaves_healthy(inventory: Any, node_ids: Sequence[str]) -> bool:
    """True when every node in ``node_ids`` is listed healthy in a site inventory."""
    if not isinstance(inventory, dict):
        return False
    healthy = {n.get("node_id") for n in inventory.get("nodes", [])
               if isinstance(n, dict) and n.get("healthy")}
    return all(node_id in healthy for node_id in node_ids)


class Cluster:
    def __init__(self, nodes: Sequence[NodeSpec], run_dir: Path, stop: threading.Event,
                 out: Any = None) -> None:
        self.children = [Child(spec) for spec in nodes]
        self.run_dir = run_dir
        self.stop = stop
        self.out = out or sys.stdout

    @property
    def master(self) -> Child:
        return self.children[0]

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def _wait(self, what: str, check: Callable[[], bool], timeout: float) -> None:
        end = time.monotonic() + timeout
        while True:
            for child in self.children:
                code = child.exit_code
                if code is not None:
                    raise DemoError(self.failure(child, code))
            if self.stop.is_set():
                raise Interrupted()
            try:
                if check():
                    return
            except (OSError, ValueError):
                pass
            if time.monotonic() > end:
                raise DemoError(f"{what} did not happen within {timeout:.0f}s; logs in {self.run_dir}")
            self.stop.wait(0.1)

    def failure(self, child: Child, code: int) -> str:
        lines = "\n".join(f"  | {line}" for line in child.tail())
        return (f"{child.spec.name} ({child.spec.config}) exited with status {code}; "
                f"last lines of {child.spec.log}:\n{lines}")

    def start(self, timeout: float) -> dict[str, Any]:
        """Start the master, then the slaves; return the master's inventory once all are healthy."""
        self.master.start(self.run_dir)
        self._wait(f"{self.master.spec.name} answering on {self.master.spec.url}",
                   lambda: get_json(self.master.spec.url + "/health") is not None, timeout)
        for child in self.children[1:]:
            child.start(self.run_dir)
        slave_ids = [c.spec.node_id for c in self.children[1:]]
        inventory: dict[str, Any] = {}

        def ready() -> bool:
            nonlocal inventory
            inventory = get_json(self.master.spec.url + "/router/v1/site/inventory")
            return slaves_healthy(inventory, slave_ids)

        self._wait("every slave healthy in the master's inventory", ready, timeout)
        return inventory

    def watch(self) -> int:
        """Run until Ctrl-C / SIGTERM (0) or until a node exits by itself (1)."""
        while not self.stop.wait(0.2):
            for child in self.children:
                code = child.exit_code
                if code is not None:
                    self.say(f"routerd-cluster: {self.failure(child, code)}")
                    return 1
        return 0

    def shutdown(self) -> bool:
        """SIGTERM every running node (slaves first), wait, kill stragglers; True if all were clean."""
        running = [c for c in reversed(self.children) if c.exit_code is None and c.proc is not None]
        for child in running:
            child.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        clean = True
        for child in running:
            if not child.wait(deadline):
                self.say(f"routerd-cluster: {child.spec.name} did not stop in time; killed")
                clean = False
            elif child.exit_code not in CLEAN_EXITS:
                clean = False
        return clean


#: The audio the transcription example sends, written into the run folder (:func:`write_sample_audio`).
SPEECH_FILE = "speech.wav"


def write_sample_audio(run_dir: Path) -> Path:
    """Write the transcription example's audio (a few seconds of the benchmark's tone) into ``run_dir``."""
    from routerd.inference.bench import tone_wav

    path = run_dir / SPEECH_FILE
    path.write_bytes(tone_wav(seconds=3))
    return path


def describe(nodes: Sequence[NodeSpec], inventory: Mapping[str, Any], run_dir: Path) -> str:
    """The text printed once the cluster is ready: URLs, models and curl examples."""
    master = nodes[0].url
    lines = [f"routerd-cluster: ready (configs, stores and logs in {run_dir})", ""]
    for spec in nodes:
        lines.append(f"  {spec.name:<20} {spec.role:<7} {spec.url}   log: {spec.log.name}")
    lines += ["", f"WebUI: {master}/ui/"]
    by_model: dict[str, list[str]] = {}
    chat: list[str] = []
    stt: list[str] = []
    images: list[str] = []
    for record in inventory.get("models", []):
        public_id = str(record.get("public_id", ""))
        caps = record.get("capabilities", {})
        if caps.get("image") and record.get("public_image_id"):
            public_id = str(record["public_image_id"])
            if public_id not in images:
                images.append(public_id)
        by_model.setdefault(public_id, []).append(str(record.get("node_id", "")))
        if caps.get("llm") and not caps.get("embeddings") and public_id not in chat:
            chat.append(public_id)
        if caps.get("stt") and public_id not in stt:
            stt.append(public_id)
    lines += ["", "Models (public ID: nodes):"]
    lines += [f"  {model:<20} {', '.join(owners)}" for model, owners in sorted(by_model.items())]
    lines += ["", f"Clients talk to the master only ({master}). Try:",
              f"  curl -s {master}/v1/models",
              f"  curl -s {master}/router/v1/site/inventory"]
    for model in chat[:3]:
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hello"}],
                           "max_tokens": 8})
        lines.append(f"  curl -si {master}/v1/chat/completions -H 'content-type: application/json' "
                     f"-d '{body}'   # X-Routerd-Node names the node that answered")
    for model in images[:1]:
        body = json.dumps({"model": model, "prompt": "a lighthouse", "size": "256x256"})
        lines.append(f"  curl -s {master}/v1/images/generations -H 'content-type: application/json' "
                     f"-d '{body}' | head -c 300")
    for model in stt[:1]:
        lines.append(f"  curl -s {master}/v1/audio/transcriptions -F file=@{run_dir / SPEECH_FILE} "
                     f"-F model={model}")
    lines += ["", "Press Ctrl-C to stop all nodes."]
    return "\n".join(lines)


# -- entry point ----------------------------------------------------------------


def cluster_arguments(parser: argparse.ArgumentParser, config_help: str) -> None:
    """The options ``routerd-cluster`` and ``routerd demo`` share: ports, example configs, run folder
    and startup timeout."""
    parser.add_argument("--base-port", type=int, default=8080,
                        help="the master's port; the slaves use the next two (default 8080)")
    parser.add_argument("--config-dir", type=Path, default=None,
                        help=f"{config_help} (default: ./etc/cluster in a checkout, else the installed "
                             "examples)")
    parser.add_argument("--run-dir", type=Path, default=None,
                        help="where to write configs, stores and logs (default: a new temporary folder, "
                             "removed after a clean stop)")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds to wait for each startup step (default 60)")


def parsed_cluster_arguments(parser: argparse.ArgumentParser,
                             argv: Sequence[str] | None) -> argparse.Namespace:
    """``argv`` parsed by ``parser``, the base port checked (it and the next two must be ports)."""
    args = parser.parse_args(argv)
    if not 1 <= args.base_port <= 65533:
        parser.error("--base-port must be between 1 and 65533")
    return args


def cluster_folders(args: argparse.Namespace, prog: str) -> tuple[Path, Path, bool] | None:
    """The example configs, the run folder and whether it is a temporary one of ours; None (after
    saying why on stderr) when there are no configs or the three ports are taken."""
    config_dir: Path | None = args.config_dir or default_config_dir()
    if config_dir is None:
        print(f"{prog}: no example configs found; pass --config-dir", file=sys.stderr)
        return None
    taken = busy_ports([args.base_port, args.base_port + 1, args.base_port + 2])
    if taken:
        print(f"{prog}: port(s) {', '.join(map(str, taken))} already in use; pick another --base-port",
              file=sys.stderr)
        return None
    own_run_dir = args.run_dir is None
    prefix = prog.replace(" ", "-") + "-"
    run_dir: Path = Path(tempfile.mkdtemp(prefix=prefix)) if own_run_dir else args.run_dir.resolve()
    return config_dir, run_dir, own_run_dir


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="routerd-cluster",
        description="Run a routerd master and two slaves on this machine (simulator backends).")
    cluster_arguments(parser, "folder with master.yaml, routing-only-master.yaml, slave-a.yaml, slave-b.yaml")
    parser.add_argument("--routing-only", action="store_true",
                        help="use routing-only-master.yaml: a master that runs no models itself")
    return parsed_cluster_arguments(parser, argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    folders = cluster_folders(args, "routerd-cluster")
    if folders is None:
        return 2
    config_dir, run_dir, own_run_dir = folders
    try:
        nodes = prepare(config_dir, run_dir, args.base_port, args.routing_only)
    except DemoError as exc:
        print(f"routerd-cluster: {exc}", file=sys.stderr)
        return 2
    print(f"routerd-cluster: starting {', '.join(n.name for n in nodes)} from {config_dir}", flush=True)
    return run_cluster(nodes, run_dir, own_run_dir, args.timeout)


#: Called once every node is healthy, with the cluster and the master's inventory; it may start work
#: of its own (``routerd demo``'s load) and returns what stops that work again.
OnReady = Callable[["Cluster", dict[str, Any]], Callable[[], None]]


def run_cluster(nodes: Sequence[NodeSpec], run_dir: Path, own_run_dir: bool, timeout: float,
                on_ready: OnReady | None = None, prog: str = "routerd-cluster") -> int:
    """Start ``nodes``, print what is ready, run until Ctrl-C / SIGTERM or a node exits, stop every
    node (slaves first); the exit status.  ``on_ready`` runs once all are healthy; what it returns
    is called before the nodes are stopped."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    cluster = Cluster(nodes, run_dir, stop)
    status = 0
    stop_work: Callable[[], None] = lambda: None  # noqa: E731
    try:
        inventory = cluster.start(timeout)
        write_sample_audio(run_dir)
        cluster.say(describe(nodes, inventory, run_dir).replace("routerd-cluster:", f"{prog}:"))
        if on_ready is not None:
            stop_work = on_ready(cluster, inventory)
        status = cluster.watch()
    except Interrupted:
        status = 0
    except DemoError as exc:
        cluster.say(f"{prog}: {exc}")
        status = 1
    finally:
        cluster.say(f"{prog}: stopping")
        stop_work()
        clean = cluster.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if status == 0 and not clean:
        status = 1
    if status == 0 and own_run_dir:
        shutil.rmtree(run_dir, ignore_errors=True)
    elif status != 0:
        cluster.say(f"{prog}: logs kept in {run_dir}")
    cluster.say(f"{prog}: stopped")
    return status

if __name__ == "__main__":
    raise SystemExit(main())
