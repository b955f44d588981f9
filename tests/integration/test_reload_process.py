"""End-to-end: a real ``routerd run`` process reloads on ``SIGHUP`` while it serves a request."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.nodes import FAST_TEXT, SIM, write_models
from tests.integration.processes import stop
from tests.integration.test_twistd_e2e import _request, _wait_http
from tests.ports import free_port

ROUTERD = str(Path(sys.executable).parent / "routerd")
pytestmark = pytest.mark.slow


def _until(check: Any, what: str, deadline_s: float = 15) -> Any:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} did not happen within {deadline_s}s")


def _model_ids(url: str) -> list[str]:
    return sorted(m["id"] for m in _request(f"{url}/v1/models")[1]["data"])


def test_sighup_adds_and_removes_models_while_a_request_runs(tmp_path: Path) -> None:
    """SIGHUP rescans the models folder (a new config is served, a removed one answers 404) without
    ending the process or the request it is serving; the YAML's live keys apply and the others are
    named as needing a restart."""
    port = free_port()
    slow = {**FAST_TEXT, "load_ms": 50, "gen_tokens_per_s": 25}  # 50 tokens: about 2 s
    write_models(tmp_path, {"slow": {"model": "../weights/slow.sim.json", "contextsize": 2048},
                            "doomed": {"model": "../weights/slow.sim.json"}}, {"slow": slow})
    cfg = tmp_path / "node.yaml"
    config: dict[str, Any] = {"server": {"bind": f"127.0.0.1:{port}"}, "models": {"config_dir": "models"},
                              "llama": {"binary_path": [*SIM, "llama-server"]},
                              "cluster": {"store_dir": "store"}}
    cfg.write_text(json.dumps(config))
    json_log = tmp_path / "events.jsonl"
    proc = subprocess.Popen([ROUTERD, "run", "--config", str(cfg), "--json-log", str(json_log)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_http(f"{url}/health", proc)
        assert _model_ids(url) == ["doomed", "slow"]
        assert _request(f"{url}/router/v1/load", {"model": "slow"})[0] == 200
        answer: dict[str, Any] = {}

        def chat() -> None:
            answer["reply"] = _request(f"{url}/v1/chat/completions", {
                "model": "slow", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50})

        client = threading.Thread(target=chat)
        client.start()
        _until(lambda: _request(f"{url}/router/v1/state")[1]["active_requests"], "the request to start")
        (tmp_path / "models" / "fresh.kcpps").write_text(json.dumps({"model": "../weights/slow.sim.json"}))
        (tmp_path / "models" / "doomed.kcpps").unlink()
        cfg.write_text(json.dumps({**config, "server": {**config["server"], "allowed_cidrs": ["127.0.0.0/8"]},
                                   "cluster": {"store_dir": "elsewhere"}}))
        os.kill(proc.pid, signal.SIGHUP)

        _until(lambda: _model_ids(url) == ["fresh", "slow"], "the reload")
        assert client.is_alive()  # the request is still being served
        client.join(30)
        status, reply = answer["reply"]
        assert status == 200 and reply["usage"]["completion_tokens"] == 50
        assert _request(f"{url}/v1/chat/completions", {
            "model": "fresh", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})[0] == 200
        assert _request(f"{url}/v1/chat/completions", {
            "model": "doomed", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})[0] == 404
        assert proc.poll() is None
    finally:
        stop(proc, timeout=15)
    events = [json.loads(line) for line in json_log.read_text().splitlines()]
    [reloaded] = [e for e in events if e["msg"].startswith("reloaded:")]
    assert reloaded["added"] == ["fresh"] and reloaded["removed"] == ["doomed"]
    assert reloaded["applied"] == ["server.allowed_cidrs"]
    assert reloaded["restart_required"] == ["cluster.store_dir"]
