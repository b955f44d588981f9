"""``routerd demo`` as a real process (issue 22): it starts three nodes on loopback, prints the
WebUI address, its load makes the owner lend (decision-log rows ``lent`` on the owner, read through
the master's site API) and shows in site analytics, and Ctrl-C stops the load and every node,
leaving no process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.integration.processes import stop
from tests.integration.test_cluster_processes import _leftovers
from tests.ports import free_ports_in_a_row

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def _logs(run_dir: Path) -> str:
    """The last lines of every node's log (kept after a failed start), for the failure message."""
    return "".join(f"\n--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:])
                   for log in sorted(run_dir.glob("*.log")))


def test_routerd_demo_lends_under_its_load_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    base = free_ports_in_a_row(3)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-c", "from routerd.cli import console; console()", "demo", "--base-port", str(base),
         "--config-dir", str(REPO / "etc" / "cluster"), "--run-dir", str(run_dir), "--timeout", "90"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ})
    master = f"http://127.0.0.1:{base}"
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        end = time.monotonic() + 150  # a loaded CI machine starts three nodes slowly
        while time.monotonic() < end:
            line = proc.stdout.readline().decode()
            if not line:
                break
            lines.append(line)
            if "load generator running" in line:
                break
        output = "".join(lines)
        assert f"open the WebUI at {master}/ui/" in output, output + _logs(run_dir)
        lent: list[dict[str, Any]] = []
        end = time.monotonic() + 90
        while not lent and time.monotonic() < end:
            rows = get_json(master + "/router/v1/site/offload/decisions?kind=dispatch&outcome=lent&limit=50")
            lent = [r for r in rows["records"] if r.get("node_id") == "slave-b"]
            time.sleep(0.2)
        assert lent, "the owner lent part of a wave to its helper"
        assert get_json(master + "/router/v1/site/guardians")["guardians"]
        # analytics is on and written every 5 s: the charts' numbers move, lent work included
        totals: dict[str, Any] = {}
        end = time.monotonic() + 30
        while not (totals.get("requests") and totals.get("lent")) and time.monotonic() < end:
            totals = get_json(master + "/router/v1/site/analytics?period=1h")["totals"]
            time.sleep(0.2)
        assert totals["requests"] > 0 and totals["lent"] > 0, totals
    finally:
        rest = stop(proc, signal.SIGINT, timeout=60, collect=True)
    assert proc.returncode == 0, rest.decode()
    assert "routerd demo: stopped" in rest.decode()
    assert _leftovers(run_dir) == ""
