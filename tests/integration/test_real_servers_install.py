"""The install step for the real backends, for real: with the cache warm, ``python -m tests.real_servers
install`` costs seconds, and the binaries ``paths`` names start and say what they are.

Needs the servers installed first (``python -m tests.real_servers install``, or ``ROUTERD_LLAMA_SERVER`` and
``ROUTERD_WHISPER_SERVER``); without them these tests skip, unless ``ROUTERD_REAL_SERVERS_REQUIRED=1`` (as
in CI once the real-backend tier is wired), which makes a missing server a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import real_servers

pytestmark = [pytest.mark.slow, pytest.mark.real]

REPO = Path(__file__).resolve().parents[2]
WARM_LIMIT = 10.0  # seconds; measured 0.1-0.2 s


def module(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tests.real_servers", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def installed() -> dict[str, str]:
    try:
        return real_servers.paths(real_servers.cache_root())
    except real_servers.InstallError as missing:
        if os.environ.get("ROUTERD_REAL_SERVERS_REQUIRED") == "1":
            pytest.fail(f"the real servers are not installed:\n{missing}")
        pytest.skip(f"the real servers are not installed (python -m tests.real_servers install):"
                    f"\n{missing}")


def test_warm_install_costs_seconds(installed: dict[str, str]) -> None:
    started = time.monotonic()
    done = module("install")
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert took < WARM_LIMIT, f"a warm install took {took:.1f} s"
    for recipe in real_servers.RECIPES:
        if not os.environ.get(recipe.override_env):
            assert f"{recipe.server}: cached " in done.stdout


def test_paths_prints_runnable_binaries(installed: dict[str, str]) -> None:
    done = module("paths")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == installed
    assert set(installed) == {"llama-server", "whisper-server"}


def test_llama_server_prints_its_version(installed: dict[str, str]) -> None:
    done = subprocess.run([installed["llama-server"], "--version"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0
    assert "version:" in done.stdout + done.stderr


def test_whisper_server_prints_its_usage(installed: dict[str, str]) -> None:
    done = subprocess.run([installed["whisper-server"], "--help"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0
    assert "usage:" in done.stdout + done.stderr


def test_check_reports_both_ok(installed: dict[str, str]) -> None:
    done = module("check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "llama-server: ok" in done.stdout and "whisper-server: ok" in done.stdout


def test_a_timed_out_command_is_killed_with_everything_it_started(tmp_path: Path) -> None:
    """The runner's own session: a build step stopped by its timeout (or an interrupt) takes its children
    (make, the compilers) with it."""
    marker = tmp_path / "child.pid"
    started = time.monotonic()
    outcome = real_servers.run_process(["sh", "-c", f"sleep 60 & echo $! > {marker}; wait"], timeout=1.0)
    assert outcome.returncode == 124 and time.monotonic() - started < 10
    child = int(marker.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and Path(f"/proc/{child}").exists():
        time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]
