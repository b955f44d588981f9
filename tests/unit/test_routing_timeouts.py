"""Timeouts on upstream answers (fake clock): a forward that gets no first byte within
``first_byte_timeout`` is a 504 naming the node and its upstream call is cancelled; a stream that
goes silent for ``idle_stream_timeout`` is aborted."""

from __future__ import annotations

from typing import Any

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
