"""Timeouts on upstream answers (fake clock): a forward that gets no first byte within
``first_byte_timeout`` is a 504 naming the node and its upstream call is cancelled; a stream that
goes silent for ``idle_stream_timeout`` is aborted."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from routerd.catalog.model import Capabilities
from routerd.errors import HTTPError
from routerd.routing.call import Call
from routerd.routing.classify import classify
from routerd.routing.forward import Forwarder
from routerd.routing.relay import FirstByteTimeout, StreamBroken, Timeouts
from routerd.urls import AllowList
from routerd.wire.records import ModelRecord
from tests.support import FakeReply
from tests.unit.memory_http import MemoryNetwork


class Hung(Resource):
    """Accepts requests and never answers (a hung slave); remembers whether the caller left."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[Request] = []
        self.lost: list[Request] = []

    def render_POST(self, request: Request) -> Any:
        self.requests.append(request)
        request.notifyFinish().addErrback(lambda _f: self.lost.append(request))
        return NOT_DONE_YET


class Trickle(Resource):
    """Starts an SSE answer, writes one event, then goes silent."""

    isLeaf = True

    def render_POST(self, request: Request) -> Any:
        request.setHeader(b"content-type", b"text/event-stream")
        request.write(b'data: {"model": "x"}\n\n')
        return NOT_DONE_YET


def _record() -> ModelRecord:
    caps = Capabilities(llm=True)
    return ModelRecord(public_id="chat", local_id="chat", node_id="slave-a", node_url="http://slave:80",
                       capabilities=caps, available=True, loaded=True)


def _call(reply: FakeReply, stream: bool) -> Call:
    route = classify("POST", "/v1/chat/completions")
    assert route is not None
    return Call(reply=reply, route=route, path="/v1/chat/completions", body=b'{"model": "chat"}',
                content_type="application/json", parsed={"model": "chat"}, stream=stream,
                request_id="r1", started=0.0, selector="chat")


def _forward(resource: Resource, stream: bool = False) -> tuple[Clock, MemoryNetwork, FakeReply, list[Any]]:
    clock = Clock()
    network = MemoryNetwork()
    network.serve("slave:80", Site(resource))
    forwarder = Forwarder(network, "token", AllowList(["http://slave:80"]), Timeouts(clock, 600.0, 30.0))
    reply = FakeReply()
    results: list[Any] = []
    Deferred.fromCoroutine(forwarder.forward(_call(reply, stream), _record(), "chat")).addBoth(results.append)
    network.flush()
    return clock, network, reply, results


def test_a_hung_node_is_a_504_naming_it_after_the_first_byte_timeout() -> None:
    hung = Hung()
    clock, network, _reply, results = _forward(hung)
    clock.advance(599)
    network.flush()
    assert results == [] and hung.requests
    clock.advance(1)
    network.flush()
    [failure] = results
    err = failure.value
    assert isinstance(err, HTTPError) and err.status == 504 and err.code == "node_timeout"
    assert "'slave-a'" in err.message
    assert hung.lost == hung.requests  # the call to the hung node was cancelled (connection closed)
    assert clock.getDelayedCalls() == []  # no timer left behind


def test_a_stream_that_goes_silent_is_aborted_after_the_idle_timeout() -> None:
    clock, network, reply, results = _forward(Trickle(), stream=True)
    assert reply.written and results == []
    clock.advance(29)
    network.flush()
    assert results == []
    clock.advance(1)
    network.flush()
    [failure] = results
    assert isinstance(failure.value, StreamBroken)  # the answer had started: broken off, not a 504
    assert "slave-a" in str(failure.value)


def test_an_answer_in_time_cancels_the_first_byte_timer() -> None:
    clock = Clock()
    timeouts = Timeouts(clock, 10.0, 5.0)
    pending: Deferred[int] = Deferred()
    results: list[Any] = []
    Deferred.fromCoroutine(timeouts.answer(pending)).addBoth(results.append)
    pending.callback(7)
    assert results == [7] and clock.getDelayedCalls() == []


def test_first_byte_timeout_cancels_the_pending_call() -> None:
    clock = Clock()
    cancelled: list[bool] = []
    pending: Deferred[int] = Deferred(lambda _d: cancelled.append(True))
    results: list[Any] = []
    Deferred.fromCoroutine(Timeouts(clock, 10.0, 5.0).answer(pending)).addBoth(results.append)
    clock.advance(10)
    assert cancelled == [True]
    assert isinstance(results[0].value, FirstByteTimeout) and results[0].value.status == 504


def test_a_reload_of_the_idle_stream_timeout_reaches_the_next_answer_only() -> None:
    """The idle-stream limit is built once per setting: a reload's new value is what the next
    answer gets, and an answer already under way keeps the one it started with."""
    from routerd.routing.relay import stream_idle

    clock = Clock()
    timeouts = Timeouts(clock, 30.0, 5.0)
    before = stream_idle(timeouts)
    assert before is not None and before.seconds == 5.0 and before.clock is clock
    assert stream_idle(timeouts) is before  # one per setting, not one per answer
    timeouts.idle = 7.5  # what routerd.assembly.reload does
    after = stream_idle(timeouts)
    assert after is not None and after.seconds == 7.5 and timeouts.idle == 7.5
    assert before.seconds == 5.0
    assert stream_idle(None) is None


_ANSWERS = st.lists(st.tuples(st.integers(0, 40), st.one_of(st.none(), st.integers(0, 30)),
                              st.sampled_from([5, 10, 20])), max_size=12)


@settings(max_examples=200, deadline=None)
@given(answers=_ANSWERS)
def test_overlapping_answers_each_time_out_at_their_own_deadline_and_leave_no_timer(
        answers: list[tuple[int, int | None, int]]) -> None:
    """One timer watches every awaited answer: each still fails with ``FirstByteTimeout`` exactly
    ``first_byte`` seconds (the setting when it started, a reload between them) after it started
    unless answered before, its call cancelled; nothing else is cancelled; no timer is left once
    none is awaited."""
    clock = Clock()
    timeouts = Timeouts(clock, 10.0, 5.0)
    events: list[tuple[float, int, str]] = []
    for i, (start, after, _first_byte) in enumerate(answers):
        events.append((start + 0.25, i, "start"))
        if after is not None:
            events.append((start + 0.25 + after + 0.5, i, "answer"))
    pending: dict[int, Deferred[int]] = {}
    cancelled: set[int] = set()
    ended: dict[int, tuple[float, Any]] = {}
    def until(at: float) -> None:  # in quarter seconds: a timer runs at its own time
        while clock.seconds() < at:
            clock.advance(0.25)

    for at, i, what in sorted(events):
        until(at)
        if what == "start":
            timeouts.first_byte = float(answers[i][2])  # what a reload does
            pending[i] = Deferred(lambda _d, i=i: cancelled.add(i))
            Deferred.fromCoroutine(timeouts.answer(pending[i])).addBoth(
                lambda result, i=i: ended.setdefault(i, (clock.seconds(), result)))
        elif not pending[i].called:
            pending[i].callback(i)
    until(100)
    for i, (start, after, first_byte) in enumerate(answers):
        at, result = ended[i]
        if after is not None and after + 0.5 < first_byte:
            assert (at, result) == (start + 0.25 + after + 0.5, i) and i not in cancelled
        else:
            assert at == start + 0.25 + first_byte and i in cancelled
            assert isinstance(result.value, FirstByteTimeout)
    assert clock.getDelayedCalls() == []
