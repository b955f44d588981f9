"""Admission and backpressure on a real in-memory node: the replay buffer bound (503 +
Retry-After), the per-model queue bound (429 + Retry-After naming model and depth), the queue
position header and per-model queue depth on /metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred, DeferredList

from routerd.api.site import BufferBudget
from routerd.lending.links import LinkSet
from routerd.node import Node
from routerd.wire.lending import Endpoint, Link
from tests.unit.node_fixture import TEXT, World

MESSAGES = [{"role": "user", "content": "hello"}]


def _node(tmp_path: Path, **limits: Any) -> tuple[World, Node]:
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT}, limits=limits)
    world.start(node)
    return world, node


def _chat(text: str = "hello") -> bytes:
    return json.dumps({"model": "chat", "messages": [{"role": "user", "content": text}],
                       "max_tokens": 2}).encode()


def test_a_body_that_would_overflow_the_replay_buffer_is_503_with_retry_after(tmp_path: Path) -> None:
    world, node = _node(tmp_path, replay_buffer_mb=0.001)  # 1048 bytes for every body together
    headers = {b"content-type": [b"application/json"]}
    refused, body = world.call("POST", node, "/v1/chat/completions", data=_chat("x " * 1000),
                               headers=headers)
    assert refused.code == 503
    assert refused.headers.getRawHeaders(b"retry-after") == [b"1"]
    assert json.loads(body)["error"]["code"] == "buffer_full"
    served, _ = world.call("POST", node, "/v1/chat/completions", data=_chat(), headers=headers)
    assert served.code == 200  # a body that fits is served, and what it held is given back


def test_buffer_budget_takes_and_gives_back() -> None:
    budget = BufferBudget(10)
    assert budget.take(6) and not budget.take(5) and budget.fits(4)
    budget.give(6)
    assert budget.used == 0 and budget.take(10)


def test_past_max_queued_per_model_a_request_is_429_naming_model_and_depth(tmp_path: Path) -> None:
    world, node = _node(tmp_path, max_queued_per_model=2)
    http = world.network.client(world.clock)
    sent = [http.post(f"http://{world.netlocs[node]}/v1/chat/completions", data=_chat(),
                      headers={b"content-type": [b"application/json"]}) for _ in range(3)]
    while world.network.flush():  # every request reaches the node; the model is still loading
        pass
    assert node.local.queued == {"chat": 2}
    assert b'routerd_model_queue_depth{model="chat"} 2.0' in node.metrics.render()
    results: Any = world.run(Deferred.fromCoroutine(_gather(sent)))
    codes = [r.code for r, _ in results]
    assert sorted(codes) == [200, 200, 429]
    refused, raw = next((r, b) for r, b in results if r.code == 429)
    error = json.loads(raw)["error"]
    assert error["code"] == "queue_full" and "'chat'" in error["message"] and "2 requests" in error["message"]
    assert refused.headers.getRawHeaders(b"retry-after") == [b"1"]
    positions = sorted(r.headers.getRawHeaders(b"x-routerd-queue-position")[0] for r, _ in results
                       if r.code == 200)
    assert positions == [b"1", b"2"]
    assert node.local.queued == {}
    assert b"routerd_model_queue_depth{" not in node.metrics.render()


async def _gather(sent: list[Deferred[Any]]) -> list[tuple[Any, bytes]]:
    responses = await DeferredList(sent, consumeErrors=False)
    out = []
    for ok, response in responses:
        assert ok
        out.append((response, await response.content()))
    return out


def test_max_queued_per_model_bounds_requests_held_in_the_router_for_a_linked_model_too(
        tmp_path: Path) -> None:
    """Issue 21 §3: a linked model's requests wait in the lending queue, not for the backend slot;
    the bound applies there too (429 ``queue_full`` + Retry-After), and held requests stay as they
    were.  The bound counts every request of the model that waits: the one admitted to the backend
    while it still loads, and the two held here."""
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT}, limits={"max_queued_per_model": 3},
                      cluster={"scheduling_backend_depth": 1})
    world.start(node)
    link = Link(Endpoint("solo", "chat"), Endpoint("other", "x"), True, False)
    node.lending.install_links(LinkSet.build("image", ()), LinkSet.build("text", [link]))
    http = world.network.client(world.clock)
    sent = [http.post(f"http://{world.netlocs[node]}/v1/chat/completions", data=_chat(),
                      headers={b"content-type": [b"application/json"]}) for _ in range(4)]
    while world.network.flush():
        pass
    assert [h["state"] for h in node.lending.held_requests()] == ["queued", "queued"]  # one admitted
    results: Any = world.run(Deferred.fromCoroutine(_gather(sent)))
    assert sorted(r.code for r, _ in results) == [200, 200, 200, 429]
    refused, raw = next((r, b) for r, b in results if r.code == 429)
    error = json.loads(raw)["error"]
    assert error["code"] == "queue_full" and "'chat'" in error["message"] and "3 requests" in error["message"]
    assert refused.headers.getRawHeaders(b"retry-after") == [b"1"]
    assert node.lending.held_requests() == []


def test_a_parallel_model_linked_nowhere_reaches_its_backend_parallel_plus_depth_minus_one_at_once(
        tmp_path: Path) -> None:
    """Issue 23 review: the node feeds the router queue its model's ``parallel``, so a model that
    serves 4 at once (linked nowhere) has 4 + depth − 1 of its requests in the backend (here depth
    1: 4), as before the queue took it; before this, the lane's depth admitted 1 and held 5."""
    world = World(tmp_path)
    node = world.node("solo", {"chat": {**TEXT, "kcpps": {"parallel": 4}}},
                      cluster={"scheduling_backend_depth": 1})
    world.start(node)
    http = world.network.client(world.clock)
    sent = [http.post(f"http://{world.netlocs[node]}/v1/chat/completions", data=_chat(),
                      headers={b"content-type": [b"application/json"]}) for _ in range(6)]
    while world.network.flush():
        pass
    assert not node.lending.enrolled("text", "chat")  # linked nowhere
    assert len(node.lending.queues["text"].admitted()) == 4
    assert [h["state"] for h in node.lending.held_requests()] == ["queued", "queued"]
    results: Any = world.run(Deferred.fromCoroutine(_gather(sent)))
    assert [r.code for r, _ in results] == [200] * 6
