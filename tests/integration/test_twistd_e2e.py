"""End-to-end: ``twistd routerd`` as a real process, started the way the README says."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.integration.nodes import FAST_TEXT, SIM, write_models
from tests.integration.processes import stop
from tests.ports import free_port

TWISTD = str(Path(sys.executable).parent / "twistd")
pytestmark = pytest.mark.slow



def _request(url: str, body: Any = None, timeout: float = 30) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _wait_http(url: str, proc: subprocess.Popen[bytes], deadline_s: float = 30) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"twistd exited early with {proc.returncode}: {proc.stdout.read()!r}")  # type: ignore[union-attr]
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"{url} did not answer within {deadline_s}s")


def test_readme_run_command_serves_the_embedded_default(tmp_path: Path) -> None:
    """`twistd -n routerd` with no config: a standalone node on 127.0.0.1:8080 with simulator models."""
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", 8080)) == 0:
            pytest.fail("port 8080 is taken; the embedded default needs it")
    proc = subprocess.Popen([TWISTD, "-n", "--pidfile=", "routerd"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_http("http://127.0.0.1:8080/health", proc)
        code, health = _request("http://127.0.0.1:8080/health")
        assert health == {"status": "ok", "node_id": "local", "role": "standalone"}
        code, models = _request("http://127.0.0.1:8080/v1/models")
        assert {"chat-small", "chat-large"} <= {m["id"] for m in models["data"]}
        code, reply = _request("http://127.0.0.1:8080/v1/chat/completions", {
            "model": "chat-small", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3})
        assert code == 200, reply
        assert reply["model"] == "chat-small"
        assert (tmp_path / "routerd-data" / "routerd.sqlite").exists()
    finally:
        stop(proc, timeout=15)
    # twistd re-raises the stop signal after a clean shutdown
    assert proc.returncode in (0, -signal.SIGTERM)
    out = proc.stdout.read().decode()  # type: ignore[union-attr]
    assert "llama-server" in out  # backend output is logged under the backend's name
    # the backend processes went down with the node
    left = subprocess.run(["pgrep", "-f", "chat-small.sim.json"], capture_output=True, text=True)
    assert left.stdout.strip() == ""


def test_check_flag_prints_ok_or_every_error(tmp_path: Path) -> None:
    ok = subprocess.run([TWISTD, "routerd", "--check"], cwd=tmp_path, capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.strip() == "ok"
    bad = tmp_path / "bad.yaml"
    bad.write_text("server:\n  bind: nowhere\ncluster:\n  role: slave\n  scheduling_backend_depth: 0\n")
    result = subprocess.run([TWISTD, "routerd", "--config", str(bad), "--check"], cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode == 1
    for key in ("server.bind", "models.config_dir", "cluster.token", "cluster.master_url",
                "cluster.scheduling_backend_depth"):
        assert key in result.stdout


def _config(tmp_path: Path, port: int, startup: str) -> Path:
    write_models(tmp_path, {"warm": {"model": "../weights/warm.sim.json", "contextsize": 2048},
                            "cold": {"model": "../weights/missing.sim.json"}},
                 {"warm": {**FAST_TEXT, "load_ms": 300}})
    cfg = tmp_path / "node.yaml"
    cfg.write_text(json.dumps({
        "server": {"bind": f"127.0.0.1:{port}"},
        "models": {"config_dir": "models", "startup_model": startup},
        "llama": {"binary_path": [*SIM, "llama-server"]},
        "cluster": {"store_dir": "store"},
    }))
    return cfg


def test_startup_model_is_loaded_before_the_listener_opens(tmp_path: Path) -> None:
    port = free_port()
    cfg = _config(tmp_path, port, "warm")
    json_log = tmp_path / "events.jsonl"
    proc = subprocess.Popen([TWISTD, "-n", "--pidfile=", "routerd", "--config", str(cfg),
                             "--json-log", str(json_log)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_http(f"http://127.0.0.1:{port}/health", proc)
        code, state = _request(f"http://127.0.0.1:{port}/router/v1/state")
        text = [r for r in state["runtimes"] if r["kind"] == "text"][0]
        assert text["state"] == "ready" and text["model_id"] == "warm"
    finally:
        stop(proc, timeout=15)
    # --json-log writes one flat JSON object per "\n"-ended line (no RFC 7464 separator): time,
    # level, namespace, the rendered msg, and the keyword fields of each log call
    lines = json_log.read_text().split("\n")
    assert lines[-1] == "" and "\x1e" not in json_log.read_text()
    events = [json.loads(line) for line in lines[:-1]]
    loaded = [e for e in events if e["msg"].startswith("loaded warm on the text runtime")]
    assert loaded and loaded[0]["model"] == "warm" and loaded[0]["runtime"] == "text"
    assert loaded[0]["level"] == "info" and loaded[0]["namespace"] == "routerd.inference.samples"
    assert loaded[0]["time"].endswith("Z") and "T" in loaded[0]["time"]
    assert not any(e["msg"].startswith("Starting factory") for e in events)


def test_a_startup_model_that_fails_to_load_stops_the_node_with_status_1(tmp_path: Path) -> None:
    port = free_port()
    cfg = _config(tmp_path, port, "cold")
    result = subprocess.run([TWISTD, "-n", "--pidfile=", "routerd", "--config", str(cfg)], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "failed to start" in result.stdout + result.stderr
    env_port_open = socket.socket().connect_ex(("127.0.0.1", port))
    assert env_port_open != 0
    assert os.path.exists(tmp_path / "store")
