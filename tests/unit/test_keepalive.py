"""Ollama ``keep_alive`` as an idle TTL, on a fake clock; the control requests' answers."""

from __future__ import annotations

import math
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.task import Clock

from routerd.backends.runtimes import SlotStatus
from routerd.errors import HTTPError
from routerd.inference.keepalive import KeepAlive, OllamaControl, parse_keep_alive


def slot(model: str | None, *, users: int = 0, since: float = 0.0, state: str = "ready") -> SlotStatus:
    return SlotStatus("text", state, model, f"{model}.kcpps", users, 0, None, None, None, None, since)


class Fixture:
    def __init__(self, default_ttl: float | None = None) -> None:
        self.clock = Clock()
        self.slots: list[SlotStatus] = []
        self.unloaded: list[str] = []
        self.loaded: list[str] = []
        self.keepalive = KeepAlive(self.clock, default_ttl, lambda: list(self.slots), self._unload)
        self.control = OllamaControl(self.keepalive, self._load, self._unload)

    async def _unload(self, model: str) -> None:
        self.unloaded.append(model)
        self.slots = [s for s in self.slots if s.model_id != model]

    async def _load(self, model: str) -> None:
        if model == "missing":
            raise HTTPError(404, "model 'missing' not found")
        self.loaded.append(model)
        self.slots = [slot(model, since=self.clock.seconds())]

    async def advance(self, seconds: float) -> None:
        for _ in range(int(seconds)):
            self.clock.advance(1)
            await self.keepalive.tick()


@pytest.mark.parametrize(("value", "seconds"), [
    (None, None), (0, 0.0), (300, 300.0), (1.5, 1.5), ("5m", 300.0), ("90s", 90.0), ("10", 10.0),
    (-1, math.inf), ("-1m", math.inf), ("1h", 3600.0),
])
def test_keep_alive_reads_seconds_durations_and_negative_for_ever(value: Any, seconds: float | None) -> None:
    assert parse_keep_alive(value) == seconds


@pytest.mark.parametrize("value", ["soon", True, [], {}])
def test_a_keep_alive_that_is_no_duration_is_a_400(value: Any) -> None:
    with pytest.raises(HTTPError) as err:
        parse_keep_alive(value)
    assert err.value.status == 400


@pytest_twisted.ensureDeferred
async def test_a_model_idle_for_its_keep_alive_is_unloaded_and_not_a_second_earlier() -> None:
    f = Fixture()
    assert await f.control.handle("generate", {"model": "m", "prompt": "", "keep_alive": "30s"}) is not None
    await f.advance(29)
    assert f.unloaded == []
    await f.advance(1)
    assert f.unloaded == ["m"]


@pytest_twisted.ensureDeferred
async def test_each_use_restarts_the_idle_clock_and_a_busy_model_is_never_unloaded() -> None:
    f = Fixture()
    await f.control.handle("generate", {"model": "m", "prompt": "", "keep_alive": 10})
    await f.advance(8)
    used = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    assert await f.control.handle("chat", used) is None
    await f.advance(8)
    assert f.unloaded == []  # 8 s since the last use
    f.slots = [slot("m", users=1)]  # a long request is running
    await f.advance(30)
    assert f.unloaded == []
    f.slots = [slot("m")]
    await f.advance(9)
    assert f.unloaded == []
    await f.advance(1)
    assert f.unloaded == ["m"]


@pytest_twisted.ensureDeferred
async def test_the_node_default_applies_without_keep_alive_and_negative_keeps_it_for_ever() -> None:
    f = Fixture(default_ttl=60.0)
    f.slots = [slot("a"), slot("b")]
    await f.control.handle("generate", {"model": "b", "prompt": "hi", "keep_alive": -1})
    await f.advance(60)
    assert f.unloaded == ["a"]
    await f.advance(3600)
    assert f.unloaded == ["a"]


@pytest_twisted.ensureDeferred
async def test_without_a_default_or_keep_alive_models_stay_loaded() -> None:
    f = Fixture()
    f.slots = [slot("a")]
    await f.advance(3600)
    assert f.unloaded == []


@pytest_twisted.ensureDeferred
async def test_empty_prompt_loads_and_keep_alive_zero_unloads_with_ollamas_done_reasons() -> None:
    f = Fixture()
    f.clock.advance(1_700_000_000)
    loaded = await f.control.handle("generate", {"model": "m", "prompt": ""})
    assert loaded == {"model": "m", "created_at": "2023-11-14T22:13:20.000000Z", "response": "",
                      "done": True, "done_reason": "load"}
    unloaded = await f.control.handle("chat", {"model": "m", "messages": [], "keep_alive": 0})
    assert unloaded is not None and unloaded["done_reason"] == "unload"
    assert unloaded["message"] == {"role": "assistant", "content": ""}
    assert f.loaded == ["m"] and f.unloaded == ["m"]


@pytest_twisted.ensureDeferred
async def test_a_generation_with_keep_alive_zero_is_served_then_unloaded_once_idle() -> None:
    f = Fixture()
    f.slots = [slot("m")]
    assert await f.control.handle("generate", {"model": "m", "prompt": "hi", "keep_alive": 0}) is None
    await f.advance(1)
    assert f.unloaded == ["m"]


@pytest_twisted.ensureDeferred
async def test_a_failing_unload_is_retried_on_the_next_tick() -> None:
    f = Fixture(default_ttl=5.0)
    f.slots = [slot("m")]
    calls: list[str] = []

    async def flaky(model: str) -> None:
        calls.append(model)
        if len(calls) == 1:
            raise RuntimeError("busy")
        f.slots = []

    f.keepalive.unload = flaky
    await f.advance(6)
    assert calls == ["m", "m"] and f.slots == []
