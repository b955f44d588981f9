"""``routerd demo``: the example cluster of ``routerd-cluster`` with lending to watch, no GPU needed.

It writes the example configs into a run directory as ``routerd-cluster`` does
(:func:`routerd.demo.configs.prepare`), then gives each node its own copy of its model configs
(slave-b gains ``vision``, a multimodal model with a small projector file, to be the guardian),
the example weights as ``models.file_roots`` (so Cook has files to offer) and analytics on.  Once
every node is healthy it sets fast lending settings, links slave-b's ``llama-8b`` (public
``llama-8b-2``, the slower q8 weights) to lend to slave-a's ``llama-8b`` (q4, twice as fast), makes
``vision`` the cluster's guardian and starts a load generator (:class:`LoadGenerator`) that sends the
master waves of requests (:func:`wave_plan`): a burst that backs up the owner's queue, so its
backlog is lent, held and returned, then a quiet spell, again and again.  It prints the WebUI
address and a line per wave; Ctrl-C stops the load, then every node.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import attrs
import yaml

from routerd.catalog.kcpps import PATH_KEYS
from routerd.demo.configs import DemoError, NodeSpec, prepare
from routerd.demo.launcher import (
    Cluster,
    cluster_arguments,
    cluster_folders,
    parsed_cluster_arguments,
    run_cluster,
)

PROG = "routerd demo"
#: Lending settings that let a newcomer see lending within a minute (contract §7 settings).
DEMO_SETTINGS: Mapping[str, Any] = {"scheduling_min_samples": 2, "scheduling_refresh_interval": "5s",
                                    "offload_probe_idle": "1s", "offload_restore_delay": "3s"}
OWNER = {"node_id": "slave-b", "model_id": "llama-8b"}  # public llama-8b-2: the slow q8 weights
HELPER = {"node_id": "slave-a", "model_id": "llama-8b"}  # q4: twice as fast
GUARDIAN = {"node_id": "slave-b", "model_id": "vision"}
VISION_WEIGHTS = "mini-3b.sim.json"
WAVE_S = 20  # a burst of BURST_S seconds, then quiet until the next wave
BURST_S = 8
PNG = "data:image/png;base64,iVBORw0KGgo="

Kind = Literal["owner", "replica", "guardian", "image", "fast"]


# -- configs (pure but for the file copies) -----------------------------------------------------


def copy_models(source: Path, target: Path) -> list[str]:
    """Copy every ``.kcpps`` of ``source`` into ``target`` with weight paths made absolute (they
    resolve against the config's folder, which changes); the copied local IDs."""
    target.mkdir(parents=True, exist_ok=True)
    copied = []
    for path in sorted(source.glob("*.kcpps")):
        data = json.loads(path.read_text(encoding="utf-8"))
        for key in PATH_KEYS:
            value = data.get(key)
            if isinstance(value, str) and value and not os.path.isabs(value):
                data[key] = os.path.normpath(os.path.join(source, value))
        (target / path.name).write_text(json.dumps(data), encoding="utf-8")
        copied.append(path.stem)
    return copied


def demo_config(data: Mapping[str, Any], models_dir: Path, weights_dir: Path) -> dict[str, Any]:
    """A node's written config, changed for the demo: its own model folder, the example weights as
    file roots and analytics on."""
    out = {key: dict(value) if isinstance(value, dict) else value for key, value in data.items()}
    models = out.setdefault("models", {})
    models["config_dir"] = str(models_dir)
    models["file_roots"] = [str(weights_dir)]
    out["analytics"] = {**out.get("analytics", {}), "enabled": True, "flush_interval": "5s"}
    return out


def prepare_demo(config_dir: Path, run_dir: Path, base_port: int) -> list[NodeSpec]:
    """Write the demo's three configs and model folders into ``run_dir``; master first."""
    nodes = prepare(config_dir, run_dir, base_port, routing_only=False)
    weights = (config_dir / "weights").resolve()
    for spec in nodes:
        data = yaml.safe_load(spec.config.read_text(encoding="utf-8"))
        models_dir = run_dir / "models" / spec.name
        copy_models(Path(data["models"]["config_dir"]), models_dir)
        if spec.node_id == GUARDIAN["node_id"]:
            projector = run_dir / "vision-mmproj.gguf"
            projector.write_bytes(b"demo projector")
            (models_dir / f"{GUARDIAN['model_id']}.kcpps").write_text(json.dumps(
                {"model": str(weights / VISION_WEIGHTS), "mmproj": str(projector), "contextsize": 4096}))
        written = demo_config(data, models_dir, weights)
        spec.config.write_text(f"# written by {PROG}\n" + yaml.safe_dump(written, sort_keys=False),
                               encoding="utf-8")
    return nodes


# -- the site set-up and the load ---------------------------------------------------------------


def setup_calls() -> list[tuple[str, dict[str, Any]]]:
    """The site API calls that turn the example cluster into the demo (path, body), in order."""
    return [
        ("/router/v1/site/offload/settings", {"values": dict(DEMO_SETTINGS)}),
        ("/router/v1/site/text-routing-groups", {
            "anchor": OWNER, "acknowledge_different_weights": True,
            "lends_to": [{**HELPER, "load_if_unloaded": True, "restore_after_borrow": True}]}),
        ("/router/v1/site/guardians", {"scope": "cluster", "guardian": GUARDIAN}),
    ]


def wave_plan(second: int) -> list[Kind]:
    """The requests to start in second ``second`` of the demo: in the first ``BURST_S`` seconds of
    every ``WAVE_S``, four to the owner's model (more than its backend takes: a queue that lending
    drains) and one to the helper's public model (its own work, which makes it return borrowed
    work); in the quiet rest, now and then one of each other kind (guardian, image, a fast model)."""
    phase = second % WAVE_S
    if phase < BURST_S:
        burst: list[Kind] = ["owner", "owner", "owner", "owner"]
        return burst + (["replica"] if phase % 2 == 0 else [])
    quiet: list[Kind] = ["guardian", "image", "fast", "owner"]
    return [quiet[(second // WAVE_S + phase) % len(quiet)]] if phase % 3 == 0 else []


def request_for(kind: Kind) -> tuple[str, dict[str, Any]]:
    """The client request (path, body) of one kind."""
    def chat(model: str, content: Any = "tell me about lending GPUs", tokens: int = 24) -> dict[str, Any]:
        return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": tokens}
    if kind == "owner":
        return "/v1/chat/completions", chat("llama-8b-2")
    if kind == "replica":
        return "/v1/chat/completions", chat("llama-8b", tokens=8)
    if kind == "guardian":
        return "/v1/chat/completions", chat("mini-3b", [
            {"type": "text", "text": "what is in this picture?"},
            {"type": "image_url", "image_url": {"url": PNG}}], tokens=16)
    if kind == "image":
        return "/v1/images/generations", {"model": "sketch-dream", "prompt": "a lighthouse",
                                          "size": "256x256", "steps": 4}
    return "/v1/chat/completions", chat("mini-3b", tokens=12)


def post_json(url: str, body: Any, timeout: float = 30.0) -> tuple[int, Any, Mapping[str, str]]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"null"), dict(response.headers)
    except urllib.error.HTTPError as exc:
        try:
            payload = json.loads(exc.read() or b"null")
        except ValueError:
            payload = None
        return exc.code, payload, dict(exc.headers)


def configure(master_url: str) -> None:
    """Apply :func:`setup_calls` to the master; :class:`DemoError` naming the call that failed."""
    for path, body in setup_calls():
        code, answer, _ = post_json(master_url + path, body)
        if code != 200:
            raise DemoError(f"{path} answered {code}: {json.dumps(answer)[:300]}")


@attrs.define
class WaveCount:
    sent: int = 0
    ok: int = 0
    failed: int = 0
    lent: int = 0


class LoadGenerator:
    """Sends :func:`wave_plan`'s requests to the master from a few threads until stopped, and
    prints one line per wave (requests, answered, lent to a helper)."""

    def __init__(self, master_url: str, say: Any, workers: int = 8, max_in_flight: int = 12) -> None:
        self.master_url = master_url
        self.say = say
        self.stopping = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="demo-load")
        self.max_in_flight = max_in_flight
        self.in_flight = 0
        self.lock = threading.Lock()
        self.count = WaveCount()
        self.thread = threading.Thread(target=self._run, name="demo-waves", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=5)
        self.pool.shutdown(wait=True, cancel_futures=True)

    def _one(self, kind: Kind) -> None:
        path, body = request_for(kind)
        try:
            code, _, headers = post_json(self.master_url + path, body, timeout=60)
            lent = any(k.lower() == "x-routerd-lent-to" for k in headers)
        except OSError:
            code, lent = 0, False
        with self.lock:
            self.in_flight -= 1
            self.count.ok += code == 200
            self.count.failed += code != 200
            self.count.lent += lent

    def _run(self) -> None:
        second = 0
        start = time.monotonic()
        while not self.stopping.is_set():
            for kind in wave_plan(second):
                with self.lock:
                    if self.in_flight >= self.max_in_flight:
                        break
                    self.in_flight += 1
                    self.count.sent += 1
                self.pool.submit(self._one, kind)
            second += 1
            if second % WAVE_S == 0:
                with self.lock:
                    done, self.count = self.count, WaveCount()
                self.say(f"{PROG}: wave {second // WAVE_S}: {done.sent} requests sent, {done.ok} answered, "
                         f"{done.failed} failed, {done.lent} lent to a helper")
            self.stopping.wait(max(0.0, start + second - time.monotonic()))


# -- entry point --------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG, description="A three-node simulated cluster on loopback with lending, a guardian, "
                               "analytics and a load generator; Ctrl-C stops it.")
    cluster_arguments(parser, "the example cluster")
    parser.add_argument("--no-load", action="store_true", help="start the cluster without the load generator")
    return parsed_cluster_arguments(parser, argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    folders = cluster_folders(args, PROG)
    if folders is None:
        return 2
    config_dir, run_dir, own_run_dir = folders
    try:
        nodes = prepare_demo(config_dir, run_dir, args.base_port)
    except (DemoError, OSError, ValueError, KeyError) as exc:
        print(f"{PROG}: cannot prepare the cluster: {exc}", file=sys.stderr)
        return 2
    print(f"{PROG}: starting {', '.join(n.name for n in nodes)} in {run_dir}", flush=True)

    def on_ready(cluster: Cluster, _inventory: dict[str, Any]) -> Any:
        master = cluster.master.spec.url
        configure(master)
        cluster.say(f"{PROG}: {OWNER['node_id']}/{OWNER['model_id']} lends to "
                    f"{HELPER['node_id']}/{HELPER['model_id']}; guardian {GUARDIAN['node_id']}/"
                    f"{GUARDIAN['model_id']}; analytics on (written every 5 s)")
        cluster.say(f"{PROG}: open the WebUI at {master}/ui/  (Lending shows the decisions as they happen)")
        if args.no_load:
            return lambda: None
        load = LoadGenerator(master, cluster.say)
        load.start()
        cluster.say(f"{PROG}: load generator running: a wave every {WAVE_S} s. Press Ctrl-C to stop.")
        return load.stop

    return run_cluster(nodes, run_dir, own_run_dir, args.timeout, on_ready, prog=PROG)


__all__ = ["DEMO_SETTINGS", "LoadGenerator", "configure", "demo_config", "main", "prepare_demo",
           "request_for", "setup_calls", "wave_plan"]
