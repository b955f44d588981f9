"""Starting and draining on a real in-memory node: /health says starting/draining with 503, new
requests get 503 + Retry-After (a borrowed one goes back to its owner), requests still waiting
for a backend slot are refused when the drain begins, and the drain waits for running ones."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred

from routerd.node import Node
from tests.unit.node_fixture import TEXT, TOKEN, World


def _chat() -> bytes:
    return json.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 2}).encode()


def _node(tmp_path: Path) -> tuple[World, Node]:
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT}, cluster={"token": TOKEN})
    return world, node


def test_health_is_503_starting_until_start_finishes_then_ok(tmp_path: Path) -> None:
    world, node = _node(tmp_path)
    response, body = world.call("GET", node, "/health")
    assert (response.code, json.loads(body)) == (503, {"status": "starting"})
    refused, raw = world.call("POST", node, "/v1/chat/completions", data=_chat())
    assert refused.code == 503 and json.loads(raw)["error"]["code"] == "starting"
    assert refused.headers.getRawHeaders(b"retry-after") == [b"1"]
    world.start(node)
    response, body = world.call("GET", node, "/health")
    assert (response.code, json.loads(body)["status"]) == (200, "ok")


def test_draining_health_and_new_requests_and_borrowed_ones(tmp_path: Path) -> None:
    world, node = _node(tmp_path)
    world.start(node)
    world.run(node.drain(5.0))  # nothing in flight: returns at once
    response, body = world.call("GET", node, "/health")
    assert (response.code, json.loads(body)) == (503, {"status": "draining"})
    refused, raw = world.call("POST", node, "/v1/chat/completions", data=_chat())
    assert refused.code == 503 and json.loads(raw)["error"]["code"] == "draining"
    borrowed, raw = world.call("POST", node, "/router/v1/node/inference/v1/chat/completions", data=_chat(),
                               headers={b"x-routerd-offload": [b"1"],
                                        b"authorization": [b"Bearer " + TOKEN.encode()]})
    assert borrowed.code == 409  # handed back: the owner serves it itself
    assert json.loads(raw)["error"]["code"] == "offload_returned"
    assert world.launcher.spawned == []


def test_a_draining_master_hands_a_relayed_lent_request_back_to_its_owner(tmp_path: Path) -> None:
    """Found by the fault soak: an owner relaying a lent request through a master that had begun
    to drain got 503 ``draining`` and passed it to its client; 409 ``offload_returned`` makes
    the owner serve the request itself."""
    world, node = _node(tmp_path)
    world.start(node)
    world.run(node.drain(5.0))
    relayed, raw = world.call("POST", node, "/router/v1/node/offload/request", data=_chat(),
                              headers={b"authorization": [b"Bearer " + TOKEN.encode()],
                                       b"x-routerd-offload-owner": [b"slave-a"],
                                       b"x-routerd-offload-owner-model": [b"chat"],
                                       b"x-routerd-offload-lane": [b"text"],
                                       b"x-routerd-offload-path": [b"/v1/chat/completions"]})
    assert relayed.code == 409
    assert json.loads(raw)["error"]["code"] == "offload_returned"


def test_a_drain_refuses_requests_waiting_for_the_slot_with_503(tmp_path: Path) -> None:
    world, node = _node(tmp_path)
    world.start(node)
    http = world.network.client(world.clock)
    sent = [http.post(f"http://{world.netlocs[node]}/v1/chat/completions", data=_chat(),
                      headers={b"content-type": [b"application/json"]}) for _ in range(2)]
    while world.network.flush():
        pass
    assert node.local.queued == {"chat": 2}  # both wait for the model to load
    draining = Deferred.fromCoroutine(node.drain(30.0))
    results: Any = world.run(Deferred.fromCoroutine(_answers(sent)))
    assert [code for code, _ in results] == [503, 503]
    assert all(json.loads(body)["error"]["code"] == "draining" for _, body in results)
    world.run(draining)
    assert node.front.active_calls == 0 and node.local.queued == {}


def test_a_drain_waits_for_a_running_request_up_to_its_timeout(tmp_path: Path) -> None:
    world, node = _node(tmp_path)
    world.start(node)
    node.front.active_calls = 1  # a request in flight (held by the test)
    done: list[float] = []
    Deferred.fromCoroutine(node.drain(2.0)).addCallback(lambda _: done.append(world.clock.seconds()))
    started = world.clock.seconds()
    world.clock.advance(1.0)
    assert done == []
    node.front.active_calls = 0  # it finished
    world.clock.advance(0.05)
    assert done and done[0] - started < 1.2
    node.front.active_calls = 1  # one that never finishes
    done.clear()
    started = world.clock.seconds()
    Deferred.fromCoroutine(node.drain(2.0)).addCallback(lambda _: done.append(world.clock.seconds()))
    for _ in range(60):
        world.clock.advance(0.05)
    assert done and 2.0 <= done[0] - started < 2.1  # gave up at the timeout
    node.front.active_calls = 0


async def _answers(sent: list[Deferred[Any]]) -> list[tuple[int, bytes]]:
    out = []
    for d in sent:
        response = await d
        out.append((response.code, await response.content()))
    return out
