"""The example cluster configs (etc/cluster) and ``routerd-cluster``, as real ``twistd`` processes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from routerd.demo.configs import rewrite_ports
from tests.integration.processes import stop
from tests.ports import free_port, free_ports_in_a_row

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "etc" / "cluster"
BIN = Path(sys.executable).parent
TWISTD = str(BIN / "twistd")
EXAMPLE_PORTS = (8080, 8081, 8082)




def _copy_examples(tmp_path: Path, ports: dict[int, int] | None = None) -> Path:
    """etc/cluster copied into tmp_path (so relative paths still resolve), ports moved."""
    target = tmp_path / "cluster"
    shutil.copytree(EXAMPLES, target, ignore=shutil.ignore_patterns("routerd-data"))
    if ports:
        for config in target.glob("*.yaml"):
            data = yaml.safe_load(config.read_text())
            config.write_text(yaml.safe_dump(rewrite_ports(data, ports)))
    return target


def _request(url: str, body: Any = None, timeout: float = 30) -> tuple[int, Any, dict[str, str]]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read()), {k.lower(): v for k, v in resp.headers.items()}
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), {}


def _chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3}


def _wait(check: Any, procs: list[subprocess.Popen[bytes]], timeout: float = 30) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for proc in procs:
            if proc.poll() is not None:
                out = proc.stdout.read().decode() if proc.stdout else ""
                raise AssertionError(f"{proc.args!r} exited with {proc.returncode}:\n{out[-3000:]}")
        try:
            result = check()
            if result:
                return result
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError("condition not reached in time")


def _twistd(config: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([TWISTD, "-n", "--pidfile=", "routerd", "--config", str(config)],
                            cwd=config.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _healthy(inventory: dict[str, Any]) -> set[str]:
    return {n["node_id"] for n in inventory["nodes"] if n["healthy"]}


def _leftovers(marker: Path) -> str:
    return subprocess.run(["pgrep", "-af", str(marker)], capture_output=True, text=True).stdout.strip()


@pytest.fixture
def master_and_slave_b(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    ports = {example: free_port() for example in EXAMPLE_PORTS}
    examples = _copy_examples(tmp_path, ports)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(_twistd(examples / "master.yaml"))
        master = f"http://127.0.0.1:{ports[8080]}"
        _wait(lambda: _request(master + "/health")[0] == 200, procs)
        procs.append(_twistd(examples / "slave-b.yaml"))
        _wait(lambda: "slave-b" in _healthy(_request(master + "/router/v1/site/inventory")[1]), procs)
        yield master, examples
    finally:
        for proc in reversed(procs):
            stop(proc)


def test_example_master_and_slave_configs_form_a_cluster_that_routes_by_model(
        master_and_slave_b: tuple[str, Path]) -> None:
    """The etc/cluster master and slave-b, as twistd processes: registration, IDs and routing."""
    master, examples = master_and_slave_b
    code, inventory, _ = _request(master + "/router/v1/site/inventory")
    assert code == 200
    assert {"master", "slave-b"} <= _healthy(inventory)
    public = {(m["node_id"], m["local_id"]): m["public_id"] for m in inventory["models"]}
    # slave-b's llama-8b has other weights than the master's, so it gets a suffixed ID
    assert public[("master", "llama-8b")] == "llama-8b"
    assert public[("slave-b", "llama-8b")] == "llama-8b-2"
    assert public[("master", "mini-3b")] == "mini-3b"
    assert public[("slave-b", "whisper-small")] == "whisper-small"
    _, models, _ = _request(master + "/v1/models")
    assert {"llama-8b", "llama-8b-2", "mini-3b"} <= {m["id"] for m in models["data"]}

    code, reply, headers = _request(master + "/v1/chat/completions", _chat("llama-8b-2"))
    assert code == 200, reply
    assert reply["model"] == "llama-8b-2"
    assert headers["x-routerd-node"] == "slave-b"
    code, reply, headers = _request(master + "/v1/chat/completions", _chat("mini-3b"))
    assert code == 200, reply
    assert headers["x-routerd-node"] == "master"
    # relative store dirs resolve against the config file's folder
    assert (examples / "routerd-data" / "master" / "routerd.sqlite").exists()
    assert (examples / "routerd-data" / "slave-b" / "routerd.sqlite").exists()


def test_routerd_cluster_starts_three_nodes_serves_and_stops_them_all_on_sigterm(tmp_path: Path) -> None:
    """One command: ready report, merged and suffixed IDs, a chat, and a clean SIGTERM stop."""
    base = free_ports_in_a_row(3)
    examples = _copy_examples(tmp_path)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [str(BIN / "routerd-cluster"), "--base-port", str(base), "--config-dir", str(examples),
         "--run-dir", str(run_dir), "--timeout", "30"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        end = time.monotonic() + 40
        while time.monotonic() < end:
            line = proc.stdout.readline().decode()
            if not line:
                break
            lines.append(line)
            if "Press Ctrl-C" in line:
                break
        output = "".join(lines)
        assert "routerd-cluster: ready" in output, output
        master = f"http://127.0.0.1:{base}"
        assert master in output and f"http://127.0.0.1:{base + 2}" in output
        code, inventory, _ = _request(master + "/router/v1/site/inventory")
        assert _healthy(inventory) == {"master", "slave-a", "slave-b"}
        replicas = sorted(m["node_id"] for m in inventory["models"] if m["public_id"] == "llama-8b")
        assert replicas == ["master", "slave-a"]  # identical config and weights: one ID, two replicas
        assert [m["node_id"] for m in inventory["models"] if m["public_id"] == "llama-8b-2"] == ["slave-b"]
        code, reply, headers = _request(master + "/v1/chat/completions", _chat("mini-3b"))
        assert code == 200 and headers["x-routerd-node"] == "master", reply
        code, reply, headers = _request(master + "/v1/chat/completions", _chat("llama-8b-2"))
        assert code == 200 and headers["x-routerd-node"] == "slave-b", reply
        assert _leftovers(tmp_path)  # nodes and the backends they loaded are running
    finally:
        rest = stop(proc, timeout=30, collect=True)
    assert proc.returncode == 0, rest.decode()
    assert "routerd-cluster: stopped" in rest.decode()
    # no node and no backend (their weights live under tmp_path) is left behind
    assert _leftovers(tmp_path) == ""
    # an explicit --run-dir is kept, with each node's log
    assert (run_dir / "master.log").exists()


def test_routerd_cluster_exits_non_zero_and_shows_the_log_when_a_node_fails(tmp_path: Path) -> None:
    """A slave whose config does not validate: exit 1, its last log lines printed, nothing left running."""
    base = free_ports_in_a_row(3)
    examples = _copy_examples(tmp_path)
    broken = examples / "slave-b.yaml"
    broken.write_text(broken.read_text().replace("role: slave", "role: slave\n  bogus_key: 1"))
    result = subprocess.run(
        [str(BIN / "routerd-cluster"), "--base-port", str(base), "--config-dir", str(examples),
         "--run-dir", str(tmp_path / "run"), "--timeout", "30"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    # 78: a config error (systemd's RestartPreventExitStatus), not a transient failure
    assert "slave-b" in result.stdout and "exited with status 78" in result.stdout
    assert "cluster.bogus_key: unknown key" in result.stdout
    assert _leftovers(tmp_path) == ""
