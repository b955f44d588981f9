"""``Outbound.on_answer``: the forwarder says when the other node has started answering (what the
lent cut-off waits for), and not for a 409 ``offload_returned`` hand-back."""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from routerd.routing.forward import CameBack, Forwarder, Outbound
from routerd.urls import AllowList
from tests.support import FakeReply
from tests.unit.memory_http import MemoryNetwork


class Answer(Resource):
    isLeaf = True

    def __init__(self, code: int, body: bytes, ctype: bytes = b"application/json") -> None:
        super().__init__()
        self.code, self.body, self.ctype = code, body, ctype

    def render_POST(self, request: Request) -> bytes:
        request.setResponseCode(self.code)
        request.setHeader(b"content-type", self.ctype)
        return self.body


def send(answer: Answer) -> tuple[list[str], FakeReply, object]:
    network = MemoryNetwork()
    network.serve("helper:80", Site(answer))
    seen: list[str] = []
    reply = FakeReply()
    forwarder = Forwarder(network, "token", AllowList(["http://helper:80"]))
    out = Outbound(url="http://helper:80/v1/chat/completions", body=b"{}", content_type="application/json",
                   request_id="r1", returns_raise=True, on_answer=lambda: seen.append("answering"))
    d = forwarder.send(reply, out)
    results: list[object] = []
    Deferred.fromCoroutine(d).addBoth(results.append)
    network.flush()
    return seen, reply, results[0] if results else None


def test_an_answer_reports_that_the_helper_started_answering() -> None:
    seen, reply, result = send(Answer(200, b'{"model": "H"}'))
    assert seen == ["answering"]
    assert reply.status == 200 and result is not None


def test_a_stream_reports_it_before_relaying_the_body() -> None:
    seen, _reply, _result = send(Answer(200, b"data: {}\n\n", b"text/event-stream"))
    assert seen == ["answering"]


def test_a_409_hand_back_is_not_an_answer() -> None:
    seen, _reply, result = send(Answer(409, b'{"error": {"code": "offload_returned"}}'))
    assert seen == []
    assert getattr(result, "check", lambda _t: False)(CameBack)
