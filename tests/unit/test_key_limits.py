"""Per-key limits (issue 23): max_concurrent, requests_per_minute, tokens_per_minute → 429
``key_limited`` with Retry-After, as a pure object fed clock seconds, and on an in-memory node."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.defer import Deferred

from routerd.config.keys import KeyLimits
from routerd.errors import Saturated
from routerd.routing.key_limits import KeyLimiter
from tests.unit.node_fixture import TEXT, World
from tests.unit.test_admission import _gather


def limiter(**limits: Any) -> KeyLimiter:
    return KeyLimiter(lambda name: KeyLimits(**limits) if name == "k" else None)


def test_max_concurrent_refuses_the_next_until_one_ends() -> None:
    lim = limiter(max_concurrent=2)
    lim.admit("k", 0.0)
    lim.admit("k", 0.0)
    with pytest.raises(Saturated) as info:
        lim.admit("k", 0.0)
    assert (info.value.status, info.value.code, info.value.retry_after) == (429, "key_limited", 1)
    assert "max_concurrent" in info.value.reason
    lim.done("k", 1.0)
    lim.admit("k", 1.0)


def test_requests_per_minute_refuses_until_the_oldest_leaves_the_window() -> None:
    lim = limiter(requests_per_minute=2)
    for t in (0.0, 10.0):
        lim.admit("k", t)
        lim.done("k", t)
    with pytest.raises(Saturated) as info:
        lim.admit("k", 20.0)
    assert info.value.retry_after == 40
    lim.admit("k", 60.5)


def test_tokens_per_minute_counts_what_finished_requests_used() -> None:
    lim = limiter(tokens_per_minute=100)
    lim.admit("k", 0.0)
    lim.done("k", 5.0, tokens=120)
    with pytest.raises(Saturated) as info:
        lim.admit("k", 6.0)
    assert "tokens_per_minute" in info.value.reason and info.value.retry_after == 59
    lim.admit("k", 65.1)


def test_unknown_and_unlimited_keys_are_never_refused_and_leave_no_state() -> None:
    lim = limiter()
    for _ in range(100):
        lim.admit("k", 0.0)
        lim.admit("other", 0.0)
    assert lim.running("k") == 0 and not lim._use


def test_a_key_over_max_concurrent_gets_429_with_retry_after_and_a_reason(tmp_path: Path) -> None:
    world = World(tmp_path)
    keys = [{"name": "tight", "key": "sk-tight-0123456789", "limits": {"max_concurrent": 1}}]
    node = world.node("solo", {"chat": TEXT}, auth={"inference_keys": keys})
    world.start(node)
    http = world.network.client(world.clock)
    body = json.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    headers = {b"content-type": [b"application/json"], b"authorization": [b"Bearer sk-tight-0123456789"]}
    url = f"http://{world.netlocs[node]}/v1/chat/completions"
    sent = [http.post(url, data=body.encode(), headers=headers) for _ in range(2)]
    results: Any = world.run(Deferred.fromCoroutine(_gather(sent)))
    assert sorted(r.code for r, _ in results) == [200, 429]
    refused, raw = next((r, b) for r, b in results if r.code == 429)
    assert refused.headers.getRawHeaders(b"retry-after") == [b"1"]
    error = json.loads(raw)["error"]
    assert error["code"] == "key_limited" and "'tight'" in error["message"]
    again, _ = world.call("POST", node, "/v1/chat/completions", data=body.encode(), headers=headers)
    assert again.code == 200  # the first one ended: its place is free
    metrics = node.metrics.render().decode()
    assert 'routerd_key_requests_total{class="standard",key="tight",status="key_limited"} 1.0' in metrics
    assert 'routerd_key_requests_total{class="standard",key="tight",status="ok"} 2.0' in metrics
    assert "sk-tight" not in metrics
