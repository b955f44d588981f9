"""Backends with real processes: the simulator stands in for llama-server.

``python -m routerd.sim llama-server --host --port -m FILE.sim.json`` answers 503
while it "loads" (``load_ms``), then 200 on ``/v1/models``.  Every process a test
starts is stopped in the fixture's teardown, which also checks it is gone.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq
from treq.client import HTTPClient
from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.web.client import Agent, HTTPConnectionPool

from routerd.backends.errors import LoadFailed
from routerd.backends.process import ReactorProcessLauncher, free_port
from routerd.backends.runtimes import Runtimes
from routerd.backends.slot import LoadEvent, SlotStatus
from routerd.catalog.model import Capabilities, ModelConfig
from routerd.config.schema import BinaryConfig, Config

REPO = Path(__file__).resolve().parents[2]
SIM = (sys.executable, "-m", "routerd.sim")


def weights(directory: Path, label: str, load_ms: int) -> str:
    path = directory / f"{label}.sim.json"
    path.write_text(
        json.dumps(
            {
                "kind": "text",
                "weights": label,
                "load_ms": load_ms,
                "prompt_tokens_per_s": 1000,
                "gen_tokens_per_s": 1000,
                "context": 4096,
            }
        )
    )
    return str(path)


def text_model(local_id: str, weights_path: str) -> ModelConfig:
    return ModelConfig(
        local_id=local_id,
        filename=f"{local_id}.kcpps",
        path=f"/models/{local_id}.kcpps",
        backend_mode="llama_sdcpp",
        capabilities=Capabilities(llm=True, context=4096),
        config_hash=local_id,
        text_model=weights_path,
    )


class World:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.events: list[LoadEvent] = []
        self.pool = HTTPConnectionPool(reactor, persistent=False)
        self.http = HTTPClient(Agent(reactor, pool=self.pool))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
        config = Config(llama=BinaryConfig(command=(*SIM, "llama-server")))
        self.runtimes = Runtimes(
            reactor,
            config,
            self.http,
            ReactorProcessLauncher(reactor),
            self.events.append,
            free_port,
            env=env,
            load_timeout_s=60,
            stop_grace_s=5,
        )
        self.pids: set[int] = set()

    def text(self) -> SlotStatus:
        status = self.runtimes.status()[0]
        if status.pid is not None:
            self.pids.add(status.pid)
        return status

    async def models(self, base_url: str) -> dict[str, Any]:
        response = await self.http.get(base_url + "/v1/models", timeout=10)
        assert response.code == 200
        body: dict[str, Any] = await treq.json_content(response)
        return body

    async def until(self, state: str, timeout_s: float = 15.0) -> SlotStatus:
        waited = 0.0
        while self.text().state != state:
            assert waited < timeout_s, f"text runtime still {self.text().state}, wanted {state}"
            await deferLater(reactor, 0.05, lambda: None)
            waited += 0.05
        return self.text()


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest_twisted.async_yield_fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    w = World(tmp_path)
    try:
        yield w
    finally:
        await w.runtimes.stop()
        assert [p for p in w.pids if not gone(p)] == []


@pytest_twisted.ensureDeferred
async def test_real_load_and_switch_between_two_configs_are_timed(world: World) -> None:
    a = text_model("a", weights(world.tmp_path, "a", 150))
    b = text_model("b", weights(world.tmp_path, "b", 400))

    lease = await world.runtimes.acquire("text", a)
    first_pid = world.text().pid
    assert first_pid is not None
    assert (await world.models(lease.base_url))["data"][0]["meta"]["weights"] == "a"
    lease.release()

    lease = await world.runtimes.acquire("text", b)
    second = world.text()
    assert (second.state, second.model_id) == ("ready", "b")
    assert second.pid != first_pid and gone(first_pid)
    assert (await world.models(lease.base_url))["data"][0]["meta"]["weights"] == "b"
    lease.release()

    load_a, load_b = world.events
    assert (load_a.model_id, load_a.ok, load_b.model_id, load_b.ok) == ("a", True, "b", True)
    # each load lasts at least the backend's own loading time, and not absurdly longer
    assert 150 <= load_a.duration_ms < 10_000
    assert 400 <= load_b.duration_ms < 10_000
    assert second.last_load_ms == load_b.duration_ms
    assert world.runtimes.loaded_config("text") == "b.kcpps"


@pytest_twisted.ensureDeferred
async def test_killed_backend_goes_dead_and_the_next_acquire_restarts_it(world: World) -> None:
    a = text_model("a", weights(world.tmp_path, "a", 50))
    await world.runtimes.load(a)
    pid = world.text().pid
    assert pid is not None

    os.kill(pid, signal.SIGKILL)
    dead = await world.until("dead")
    assert dead.last_error is not None and "signal 9" in dead.last_error
    assert world.runtimes.loaded_config("text") is None

    lease = await world.runtimes.acquire("text", a)
    restarted = world.text()
    assert restarted.state == "ready" and restarted.pid not in (None, pid)
    assert (await world.models(lease.base_url))["data"][0]["meta"]["weights"] == "a"
    lease.release()
    assert [e.ok for e in world.events] == [True, True]


@pytest_twisted.ensureDeferred
async def test_missing_weights_file_fails_the_load_with_the_backend_output(world: World) -> None:
    missing = str(world.tmp_path / "nowhere.sim.json")
    broken = text_model("broken", missing)
    with pytest.raises(LoadFailed) as info:
        await world.runtimes.acquire("text", broken)
    reason = info.value.reason
    assert "exited with exit code" in reason and "last output" in reason
    assert missing in reason  # the simulator's own error line
    status = world.text()
    assert (status.state, status.model_id, status.pid) == ("failed", None, None)
    assert world.events[-1].ok is False and world.events[-1].reason == reason

    # the slot is usable again: the next request loads a good config
    good = text_model("good", weights(world.tmp_path, "good", 30))
    lease = await world.runtimes.acquire("text", good)
    lease.release()
    assert world.text().state == "ready"


@pytest_twisted.ensureDeferred
async def test_stop_ends_every_backend_process(world: World) -> None:
    await world.runtimes.load(text_model("a", weights(world.tmp_path, "a", 30)))
    pid = world.text().pid
    assert pid is not None
    await world.runtimes.stop()
    assert gone(pid)
    assert world.text().state == "closed"


def test_free_port_returns_a_bindable_loopback_port() -> None:
    port = free_port()
    assert 0 < port < 65536
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # nothing kept it
