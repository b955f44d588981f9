"""A key's ``tokens_per_minute`` holds for the site: a real master and slave on loopback, the
slave's simulator serving the model.  The master charges the tokens its forwarded answers report
and refuses past the limit (429 ``key_limited``); the slave does not count the master's forwarded
requests again."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_twisted
import treq

from tests.integration.nodes import (
    FAST_TEXT,
    Pair,
    all_healthy,
    knows,
    plan_cluster,
    start_cluster,
    write_models,
)

KEY = "sk-site-tpm-0123456789"
KEYS = {"inference_keys": [{"name": "tpm", "key": KEY, "limits": {"tokens_per_minute": 60}}]}


@pytest_twisted.async_yield_fixture
async def pair(tmp_path: Path) -> AsyncIterator[Pair]:
    plan = plan_cluster(tmp_path, ["slave-a"])
    write_models(plan.root / "slave-a", {"chat": {"model": "../weights/chat.sim.json", "contextsize": 4096}},
                 {"chat": FAST_TEXT})
    write_models(plan.root / "master", {}, {})
    cluster = await start_cluster(plan, plan.master_config(sections={"auth": KEYS}),
                                  {"slave-a": plan.slave_config("slave-a", sections={"auth": KEYS})},
                                  ready=lambda r: knows(r, **{"slave-a": "chat"}) and all_healthy(r))
    running = Pair(plan, cluster.master, cluster.slaves["slave-a"])
    yield running
    await running.stop()


async def _chat(url: str, stream: bool) -> tuple[int, Any]:
    response = await treq.post(url + "/v1/chat/completions", json={
        "model": "chat", "max_tokens": 20, "stream": stream,
        "messages": [{"role": "user", "content": "one two three four five"}]},
        headers={"Authorization": f"Bearer {KEY}"})
    return response.code, await response.content()


@pytest_twisted.ensureDeferred
async def test_a_keys_tokens_per_minute_holds_through_the_master(pair: Pair) -> None:
    assert pair.slave is not None
    served = 0
    for stream in (True, False, True, False, True):
        code, raw = await _chat(pair.master.url, stream)
        if code == 429:
            assert b"key_limited" in raw and b"tokens_per_minute" in raw
            break
        assert code == 200, raw
        served += 1
    # about 20 output tokens and the prompt's an answer: 60 are counted after three
    assert served == 3, served
    # the slave counted none of them: the key is served when it calls the slave directly
    code, raw = await _chat(pair.slave.url, False)
    assert code == 200, raw
