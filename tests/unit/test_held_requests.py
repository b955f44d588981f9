"""What a request held in the lending queue keeps alive (issue 14, "Memory": 10,000 held requests).

A real in-memory node whose model is enrolled in a link and whose backend is slow: requests go
straight into ``InferenceFront.handle`` (as the HTTP edge hands them over) and wait in the lending
queue while the clock stands still.  Each extra held request must cost its call, its queue entry and
two small records (the front's and the lending queue's, issue 24) and one Deferred — not the edge's
header map, not its decoded JSON body, not a coroutine per serving layer — and everything must still
be answered.
"""

from __future__ import annotations

import gc
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.defer import CancelledError, Deferred, ensureDeferred

from routerd.deferreds import Woken
from routerd.lending.links import LinkSet
from routerd.lending.service import Ticket
from routerd.routing.call import Call, Incoming
from routerd.routing.classify import classify
from routerd.wire.lending import Endpoint, Link
from tests.support import FakeReply
from tests.unit.node_fixture import World

CHAT = "/v1/chat/completions"
SLOW = {"kind": "text", "weights": "slow", "gen_tokens_per_s": 1.0}  # a simulated second a token


def _owner(tmp_path: Path) -> tuple[World, Any]:
    world = World(tmp_path)
    node = world.node("owner", {"alpha": SLOW}, llama={"extra_args": ["--sim-time-scale", "1"]},
                      limits={"max_queued_per_model": 100_000})
    world.start(node)
    link = Link(Endpoint("owner", "alpha"), Endpoint("helper", "bravo"), True, False)
    node.lending.install_links(LinkSet.build("image", ()), LinkSet.build("text", [link]))
    return world, node


def _send(world: World, node: Any, n: int, first: int) -> list[Deferred[bytes]]:
    route = classify("POST", CHAT)
    assert route is not None
    sent = []
    for i in range(first, first + n):
        body = json.dumps({"model": "alpha", "max_tokens": 2,
                           "messages": [{"role": "user", "content": f"hello {i}"}]}).encode()
        incoming = Incoming(path=CHAT, body=body, content_type="application/json", query={},
                            headers={"host": "owner.test", "content-type": "application/json"})
        sent.append(ensureDeferred(node.front.handle(incoming, FakeReply(), route)))
    while world.network.flush():
        pass
    return sent


def _objects() -> Counter[str]:
    gc.collect()
    return Counter(type(o).__name__ for o in gc.get_objects())


def _held_calls() -> list[Call]:
    return [o for o in gc.get_objects() if isinstance(o, Call)]


def test_a_held_request_is_two_small_records_and_one_deferred_with_neither_headers_nor_parsed_body(
        tmp_path: Path) -> None:
    """Issue 24: a held request is the front's ``_Handling`` record and the lending queue's
    ``WaitingRequest`` record, woken by callbacks on one Deferred — not two suspended coroutines
    (``InferenceFront.handle`` and ``LendingService.serve`` were one each per held request)."""
    world, node = _owner(tmp_path)
    first = _send(world, node, 10, 0)  # two run in the backend, eight are held
    before = _objects()
    more = _send(world, node, 30, 100)
    grown = _objects() - before
    assert len(node.lending.held_requests()) == 38
    per = {name: grown[name] / 30 for name in ("coroutine", "_Handling", "WaitingRequest", "Deferred",
                                              "generator", "Incoming", "Call", "Entry", "dict", "FirstWrite")}
    assert per == {"coroutine": 0, "_Handling": 1, "WaitingRequest": 1, "Deferred": 1, "generator": 0,
                   "Incoming": 0, "Call": 1, "Entry": 1, "dict": 0, "FirstWrite": 0}
    waiting = {h["request_id"] for h in node.lending.held_requests()}
    held = [c for c in _held_calls() if c.request_id in waiting]
    assert len(held) == 38 and all(c.parsed is None for c in held), "the decoded body is not kept"
    assert len({id(c.path) for c in held}) == 1, "one path string shared by every held call"

    answers: list[Any] = []
    for d in first + more:
        d.addBoth(answers.append)
    while len(answers) < 40:
        if not world.network.flush():
            world.clock.advance(1.0)
    assert all(isinstance(a, bytes) and json.loads(a)["model"] == "alpha" for a in answers)
    assert node.lending.held_requests() == [] and node.front.active_calls == 0


def test_a_stream_still_reports_its_time_to_first_chunk_and_a_plain_answer_is_not_timed(
        tmp_path: Path) -> None:
    world, node = _owner(tmp_path)
    route = classify("POST", CHAT)
    assert route is not None
    for stream in (True, False):
        body = json.dumps({"model": "alpha", "max_tokens": 2, "stream": stream,
                           "messages": [{"role": "user", "content": "hi"}]}).encode()
        incoming = Incoming(path=CHAT, body=body, content_type="application/json")
        world.run(ensureDeferred(node.front.handle(incoming, FakeReply(), route)))
    rendered = node.metrics.render().decode()
    assert 'routerd_time_to_first_token_seconds_count{lane="text",model="alpha"} 1.0' in rendered
    assert 'routerd_requests_total{lane="text",model="alpha",route="chat",status="ok"} 2.0' in rendered


# -- the waiter a held request awaits (``await Woken(d)`` is ``await d`` without a generator) --

async def _await(d: Deferred[Ticket]) -> Ticket:
    return await Woken(d)


def test_a_waiter_fired_before_it_is_awaited_resumes_at_once() -> None:
    d: Deferred[Ticket] = Deferred()
    d.callback(Ticket("admit"))
    out = Deferred.fromCoroutine(_await(d))
    assert out.result == Ticket("admit")


def test_a_waiter_fired_later_resumes_the_request_with_its_ticket() -> None:
    d: Deferred[Ticket] = Deferred()
    out = Deferred.fromCoroutine(_await(d))
    assert not out.called
    d.callback(Ticket("returned", reason="own_work_arrived"))
    assert out.result == Ticket("returned", reason="own_work_arrived")


def test_cancelling_a_held_request_raises_cancelled_at_its_wait() -> None:
    d: Deferred[Ticket] = Deferred()
    seen: list[str] = []

    async def held() -> Ticket:
        try:
            return await Woken(d)
        except CancelledError:
            seen.append("cancelled")
            raise

    out = Deferred.fromCoroutine(held())
    out.cancel()
    assert seen == ["cancelled"] and d.called
    with pytest.raises(CancelledError):
        out.result.raiseException()  # type: ignore[union-attr]
    out.addErrback(lambda _f: None)


def test_a_waiter_failed_before_it_is_awaited_raises_its_error() -> None:
    d: Deferred[Ticket] = Deferred()
    d.errback(ValueError("boom"))
    out = Deferred.fromCoroutine(_await(d))
    failure = out.result
    out.addErrback(lambda _f: None)
    assert failure.check(ValueError)
