"""End-to-end: the ``routerd`` console script runs a node and scripts it over HTTP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.nodes import FAST_TEXT, SIM, write_models
from tests.integration.processes import stop
from tests.integration.test_twistd_e2e import _request, _wait_http
from tests.ports import free_port

ROUTERD = str(Path(sys.executable).parent / "routerd")
pytestmark = pytest.mark.slow


def _cli(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ROUTERD_URL": url}
    return subprocess.run([ROUTERD, *args], capture_output=True, text=True, timeout=60, env=env)


def test_routerd_run_serves_and_the_api_subcommands_script_it(tmp_path: Path) -> None:
    """`routerd run --config` needs no twistd plugin discovery (editable installs); `routerd models`,
    `load`, `state`, `unload` reach the node named by ROUTERD_URL; `--json-log -` makes stdout JSON
    lines, with one access line per request, no factory noise and the WebUI's address once ready."""
    port = free_port()
    write_models(tmp_path, {"warm": {"model": "../weights/warm.sim.json", "contextsize": 2048}},
                 {"warm": {**FAST_TEXT, "load_ms": 50}})
    cfg = tmp_path / "node.yaml"
    cfg.write_text(json.dumps({
        "server": {"bind": f"127.0.0.1:{port}"},
        "models": {"config_dir": "models"},
        "llama": {"binary_path": [*SIM, "llama-server"]},
        "cluster": {"store_dir": "store"},
    }))
    url = f"http://127.0.0.1:{port}"
    assert _cli("check", "--config", str(cfg), url=url).stdout == "ok\n"
    proc = subprocess.Popen([ROUTERD, "run", "--config", str(cfg), "--json-log", "-"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_http(f"{url}/health", proc)
        models = _cli("models", url=url)
        assert models.returncode == 0, models.stderr
        assert [m["public_id"] for m in json.loads(models.stdout)["models"]] == ["warm"]
        loaded = _cli("load", "warm", "--compact", url=url)
        assert loaded.returncode == 0, loaded.stderr
        state = json.loads(_cli("state", url=url).stdout)
        assert [r["model_id"] for r in state["runtimes"] if r["kind"] == "text"] == ["warm"]
        code, reply = _request(f"{url}/v1/chat/completions", {
            "model": "warm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert code == 200, reply
        assert _cli("unload", "warm", url=url).returncode == 0
        missing = _cli("load", "nope", url=url)
        assert missing.returncode == 1 and "HTTP 404" in missing.stderr
    finally:
        stop(proc, timeout=15)
    assert proc.returncode in (0, -signal.SIGTERM)
    out = proc.stdout.read().decode()  # type: ignore[union-attr]
    events = [json.loads(line) for line in out.splitlines() if line.strip()]
    access = [e for e in events if e["namespace"] == "routerd.access"]
    chat = [e for e in access if e["path"] == "/v1/chat/completions"]
    assert len(chat) == 1 and chat[0]["model"] == "warm" and chat[0]["status"] == 200
    assert chat[0]["node"] == "local" and chat[0]["request_id"] != "-" and chat[0]["ms"] >= 0
    assert any(e["path"] == "/router/v1/load" for e in access)
    assert not any(e["msg"].startswith(("Starting factory", "Stopping factory")) for e in events)
    # once ready it prints where the WebUI is (a quick start never said so)
    ready = [e["msg"] for e in events if "WebUI" in e["msg"]]
    assert ready == [f"routerd node local is ready; WebUI: {url}/ui/"]


def test_importing_pricing_does_not_import_statsmodels_or_numpy() -> None:
    """statsmodels is most of a node's start time and idle memory: only the first fit imports it."""
    code = ("import sys, routerd.tap; "
            "print(any(m == 'statsmodels' or m.startswith(('statsmodels.', 'numpy')) for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
