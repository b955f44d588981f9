"""A request given a backend that died before the request reached it (the connection refused: nothing
was sent) is served on the backend the node starts next, not answered 502.  (A backend cut mid-answer
stays a 502: tests/integration/test_reliability.py.)

Seen on the real llama-server (tests/integration/test_real_cluster.py): killed mid-stream, the next
request, sent before the node had reaped the process, was answered 502 "Connection refused" (the
connect retries kept to the dead port).  Here the node's backend agent refuses as the real one does,
after its retries (some time later) or at once: the node waits a moment for the process end either way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionRefusedError
from twisted.python.failure import Failure

from tests.unit.node_fixture import TEXT, World

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hello"}]}
#: How long the node's backend agent takes to give up on a refused connect (its retries).
RETRIES_S = 0.17


class LateRefusals:
    """An agent that reports a refused connection ``delay`` seconds later (BackendAgent's retries)."""

    def __init__(self, world: World, delay: float = RETRIES_S) -> None:
        self.world, self.refused, self.delay = world, 0, delay

    def request(self, *args: Any, **kwargs: Any) -> Deferred[Any]:
        answer: Deferred[Any] = Deferred()

        def late(failure: Failure) -> None:
            if failure.check(ConnectionRefusedError):
                self.refused += 1
                self.world.clock.callLater(self.delay, answer.errback, failure)
            else:
                answer.errback(failure)

        self.world.network.request(*args, **kwargs).addCallbacks(answer.callback, late)
        return answer


@pytest.mark.parametrize("delay", [RETRIES_S, 0.0], ids=["after-retries", "at-once"])
def test_a_backend_that_died_before_the_request_reached_it_is_replaced_and_the_request_served(
        tmp_path: Path, delay: float) -> None:
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT})
    world.start(node)
    response, body = world.call("POST", node, "/v1/chat/completions", json=CHAT)
    assert response.code == 200, body
    first = world.launcher.running[-1]
    agent = LateRefusals(world, delay)
    node.local.agent = agent
    # the process stops listening now; the node learns it ended a moment later
    world.network.unplug(f"127.0.0.1:{first.port}")
    world.clock.callLater(0.01, first.exit, -9)

    response, body = world.call("POST", node, "/v1/chat/completions", json=CHAT)

    assert response.code == 200, body
    assert json.loads(body)["choices"][0]["message"]["content"]
    assert agent.refused == 1
    assert not first.running and world.launcher.running[-1] is not first  # served by a new process


def test_a_refusal_from_a_backend_that_still_runs_is_answered_502_and_nothing_is_restarted(
        tmp_path: Path) -> None:
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT})
    world.start(node)
    world.call("POST", node, "/v1/chat/completions", json=CHAT)
    process = world.launcher.running[-1]
    node.local.agent = LateRefusals(world)
    world.network.unplug(f"127.0.0.1:{process.port}")  # refuses, yet the process runs on

    response, body = world.call("POST", node, "/v1/chat/completions", json=CHAT)

    assert response.code == 502, body
    assert json.loads(body)["error"]["code"] == "backend_error"
    assert world.launcher.running == [process] and len(world.launcher.spawned) == 1
