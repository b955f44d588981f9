"""A draining node answers at once what it will never run (spec "Backlog lending", "A helper's own
work"; server.drain_timeout): what waits in a router queue leaves it when the drain begins, borrowed
work handed back with 409 ``offload_returned`` (its owner runs it), own work refused with 503
``draining`` and ``Retry-After``; what runs in a backend, or is lent out, goes on within the drain
timeout.

The pure queue, the lending service on a fake clock, and a helper node in memory.
"""

from __future__ import annotations

import json
from pathlib import Path

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from routerd.errors import Saturated
from routerd.lending.offload import Returned
from routerd.lending.queue import BorrowedReturn, Effects, LaneQueue
from tests.unit.test_lending_own_work import NODE_CHAT, borrowed_headers, chat, helper_world, settle
from tests.unit.test_lending_service import BORROWED, HELPER, MODEL_H, Node, lease, returned_409

# -- the queue ------------------------------------------------------------------------------------------


def test_a_drained_queue_hands_back_waiting_borrowed_work_and_keeps_what_runs() -> None:
    q = LaneQueue("text", 1, enrolled={"H"})
    assert q.arrive_borrowed("b0", "H", 0).admit == ("b0",)
    assert q.arrive_borrowed("b1", "H", 1) == Effects()
    assert q.drain() == Effects(returned=(BorrowedReturn("b1", ""),))
    assert [e.request_id for e in q.admitted()] == ["b0"] and q.entry("b1") is None


def test_a_drained_queue_refuses_waiting_own_work_and_admits_nothing_after() -> None:
    q = LaneQueue("text", 1, enrolled={"H"})
    assert q.arrive("a0", "H", 0).admit == ("a0",)
    q.arrive("a1", "H", 1)
    q.arrive("a2", "Z", 2)
    assert q.drain() == Effects(refused=("a1", "a2"))
    assert q.finished("a0", 3) == Effects()  # nothing waits any more
    assert len(q) == 0


# -- the lending service ----------------------------------------------------------------------------------


def draining_503(result: bytes | Failure) -> None:
    assert isinstance(result, Failure), result
    error = result.value
    assert isinstance(error, Saturated)
    assert (error.status, error.code, error.retry_after) == (503, "draining", 1)


def test_own_requests_held_in_the_router_are_refused_when_the_drain_begins() -> None:
    node = Node(depth=1)
    r0, r1, r2 = node.serve_many(3)
    assert node.local_calls == [r0]
    node.service.drain()
    for rid in (r1, r2):
        [answer] = node.answers[rid]
        draining_503(answer)
    assert node.answers[r0] == []  # the one in the backend goes on
    node.finish_local(r0)
    assert node.answers[r0] == [b"local r0"] and node.local_calls == [r0]


def test_borrowed_work_held_in_a_draining_helpers_router_goes_back_with_409() -> None:
    node = Node(HELPER, depth=1)
    node.serve("b0", MODEL_H, BORROWED)
    node.serve("b1", MODEL_H, BORROWED)
    node.service.drain()
    [answer] = node.answers["b1"]
    returned_409(answer)
    assert node.answers["b0"] == [] and node.local_calls == ["b0"]
    assert [r["outcome"] for r in node.rows("borrowed_returned")] == ["borrowed_returned"]


def test_what_arrives_once_the_drain_began_is_answered_at_once() -> None:
    node = Node(HELPER, depth=1)
    node.service.drain()
    node.serve("own", MODEL_H)
    node.serve("lent-here", MODEL_H, BORROWED)
    draining_503(node.answers["own"][0])
    returned_409(node.answers["lent-here"][0])
    assert node.local_calls == []


def test_a_lent_request_that_comes_back_during_the_drain_is_refused_at_once() -> None:
    """Its owner would never run it: the backend takes nothing new while draining."""
    node = Node(depth=1)
    r0, r1 = node.serve_many(2)
    node.answer(0, lease())
    assert node.lent_ids() == [r1]
    node.service.drain()
    node.lent[0].answer.errback(Failure(Returned("the helper handed it back")))
    draining_503(node.answers[r1][0])
    assert node.local_calls == [r0]


# -- a helper node in memory -------------------------------------------------------------------------------


def test_a_draining_helper_answers_its_router_queue_at_once_and_finishes_what_runs(tmp_path: Path) -> None:
    """Depth 1 and a 2 s job generating: a borrowed request and an own one wait in the router queue.
    The drain answers both at once (409 to the owner's relay, 503 ``draining`` with Retry-After to
    the own client), not when the running job ends; the running one finishes."""
    world, helper, http, base = helper_world(tmp_path)
    running = http.request("POST", base + NODE_CHAT, json=chat("beta"), headers=borrowed_headers())
    settle(world, 0.5)
    borrowed = http.request("POST", base + NODE_CHAT, json=chat("beta"), headers=borrowed_headers())
    settle(world, 0.1)
    assert [b["state"] for b in helper.lending.borrowed_requests()] == ["running", "queued"]
    began = world.clock.seconds()
    draining = Deferred.fromCoroutine(helper.drain(30.0))
    response = world.run(borrowed)
    assert response.code == 409
    assert json.loads(world.run(response.content()))["error"]["code"] == "offload_returned"
    assert world.clock.seconds() - began < 0.1
    assert world.run(running).code == 200
    world.run(draining)


def test_a_draining_node_refuses_its_own_held_requests_with_retry_after(tmp_path: Path) -> None:
    world, helper, http, base = helper_world(tmp_path)
    running = http.request("POST", base + "/v1/chat/completions", json=chat("beta"))
    settle(world, 0.5)
    held = http.request("POST", base + "/v1/chat/completions", json=chat("beta"))
    settle(world, 0.1)
    began = world.clock.seconds()
    draining = Deferred.fromCoroutine(helper.drain(30.0))
    response = world.run(held)
    assert response.code == 503
    assert response.headers.getRawHeaders(b"retry-after") == [b"1"]
    assert json.loads(world.run(response.content()))["error"]["code"] == "draining"
    assert world.clock.seconds() - began < 0.1
    assert world.run(running).code == 200
    world.run(draining)
