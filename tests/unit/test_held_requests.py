"""What a request held in the lending queue keeps alive ("Memory": 10,000 held requests).

A real in-memory node whose model is enrolled in a link and whose backend is slow: requests go
straight into ``InferenceFront.handle`` (as the HTTP edge hands them over) and wait in the lending
queue while the clock stands still.  Each extra held request must cost its call, its queue entry and
two small records (the front's and the lending queue's) and one Deferred — not the edge's
header map, not its decoded JSON body, not a coroutine per serving layer — and everything must still
be answered.
"""

from __future__ import annotations

import gc
import json
from collections import Counter
from pathlib import Path
from typing import Any

from twisted.internet.defer import CancelledError, Deferred, ensureDeferred
from twisted.python.failure import Failure

from routerd.lending.links import LinkSet
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
    """A held request is the front's ``Handling`` record and the lending queue's
    ``WaitingRequest`` record, woken by callbacks on one Deferred — not two suspended coroutines
    (``InferenceFront.handle`` and ``LendingService.serve`` were one each per held request)."""
    world, node = _owner(tmp_path)
    first = _send(world, node, 10, 0)  # two run in the backend, eight are held
    before = _objects()
    more = _send(world, node, 30, 100)
    grown = _objects() - before
    assert len(node.lending.held_requests()) == 38
    per = {name: grown[name] / 30 for name in ("coroutine", "Handling", "WaitingRequest", "Deferred",
                                              "generator", "Incoming", "Call", "Entry", "dict", "FirstWrite")}
    assert per == {"coroutine": 0, "Handling": 1, "WaitingRequest": 1, "Deferred": 1, "generator": 0,
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


def test_a_held_request_whose_client_leaves_frees_its_place_and_the_rest_are_answered_once(
        tmp_path: Path) -> None:
    """Cancelling the Deferred ``handle`` returned (the edge does so when the client
    goes) takes a held request out of the lending queue and counts it once as
    ``client_disconnected``; the others are still answered, each exactly once."""
    world, node = _owner(tmp_path)
    sent = _send(world, node, 6, 0)  # two run in the backend, four are held
    held_ids = {h["request_id"] for h in node.lending.held_requests()}
    assert len(held_ids) == 4 and node.front.active_calls == 6
    outcomes: list[list[Any]] = [[] for _ in sent]
    for d, seen in zip(sent, outcomes, strict=True):
        d.addBoth(seen.append)
    sent[3].cancel()
    [gone] = outcomes[3]
    assert isinstance(gone, Failure) and gone.check(CancelledError)
    assert len(node.lending.held_requests()) == 3 and node.front.active_calls == 5
    while sum(len(seen) for seen in outcomes) < 6:
        if not world.network.flush():
            world.clock.advance(1.0)
    assert [len(seen) for seen in outcomes] == [1] * 6
    assert all(isinstance(seen[0], bytes) for i, seen in enumerate(outcomes) if i != 3)
    assert node.lending.held_requests() == [] and node.front.active_calls == 0
    rendered = node.metrics.render().decode()
    assert 'routerd_requests_total{lane="text",model="alpha",route="chat",status="client_disconnected"} 1.0' \
        in rendered
