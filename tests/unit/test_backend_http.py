"""The lean backend client: answers parsed, connections kept alive and reused, and
Agent's contract kept for cancellation, broken and close-delimited bodies, and stale connections."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.defer import CancelledError, Deferred, ensureDeferred
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.protocol import Protocol
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone, ResponseFailed
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers

from routerd.clients.backend_headers import RequestHeaders, content_type_headers
from routerd.clients.backend_http import AnswerHeaders, BackendAgent
from routerd.routing.body import BytesProducer
from routerd.routing.relay import collect

URL = b"http://127.0.0.1:8080/v1/chat/completions"
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"a\": true}"


class Fallback:
    def __init__(self) -> None:
        self.calls: list[bytes] = []

    def request(self, method: bytes, uri: bytes, headers: Any = None, body: Any = None) -> Deferred[Any]:
        self.calls.append(uri)
        return Deferred()


class Body(Protocol):
    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.reason: Failure | None = None

    def dataReceived(self, data: bytes) -> None:
        self.data.append(data)

    def connectionLost(self, reason: Failure = Failure(ConnectionDone())) -> None:  # noqa: B008
        self.reason = reason


def setup() -> tuple[MemoryReactorClock, BackendAgent, Fallback]:
    reactor = MemoryReactorClock()
    fallback = Fallback()
    return reactor, BackendAgent(reactor, fallback), fallback  # type: ignore[arg-type]


def connect(reactor: MemoryReactorClock, index: int = -1) -> tuple[Any, StringTransport]:
    host, port, factory, _timeout, _bind = reactor.tcpClients[index]
    assert (host, port) == ("127.0.0.1", 8080)
    protocol = factory.buildProtocol(None)
    transport = StringTransport()
    protocol.makeConnection(transport)
    return protocol, transport


def result(d: Deferred[Any]) -> Any:
    out: list[Any] = []
    d.addBoth(out.append)
    assert out, "not fired"
    return out[0]


def post(agent: BackendAgent, body: bytes = b'{"model":"m"}') -> Deferred[Any]:
    return agent.request(b"POST", URL, Headers({b"content-type": [b"application/json"]}), BytesProducer(body))


def test_request_is_written_whole_and_the_answer_parsed_and_the_connection_reused() -> None:
    reactor, agent, _ = setup()
    answer = post(agent)
    protocol, transport = connect(reactor)
    sent = transport.value()
    assert sent.startswith(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n")
    assert b"Content-Length: 13\r\n" in sent and b"Content-Type: application/json\r\n" in sent
    assert sent.endswith(b'\r\n\r\n{"model":"m"}')
    protocol.dataReceived(OK)
    response = result(answer)
    assert response.code == 200
    assert response.headers.getRawHeaders(b"content-type") == [b"application/json"]
    body = Body()
    response.deliverBody(body)  # the body arrived before deliverBody: buffered, then delivered
    assert b"".join(body.data) == b'{"a": true}' and body.reason is not None
    assert body.reason.check(ResponseDone)
    transport.clear()
    second = post(agent)
    assert len(reactor.tcpClients) == 1, "the kept-alive connection carries the next request"
    assert transport.value().startswith(b"POST ")
    protocol.dataReceived(OK)
    assert result(second).code == 200


def test_a_chunked_stream_is_delivered_as_it_arrives_and_ends_with_response_done() -> None:
    reactor, agent, _ = setup()
    answer = post(agent)
    protocol, _transport = connect(reactor)
    protocol.dataReceived(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                          b"Transfer-Encoding: chunked\r\n\r\n")
    body = Body()
    result(answer).deliverBody(body)
    protocol.dataReceived(b"6\r\ndata: \r\n")
    assert body.data == [b"data: "] and body.reason is None
    protocol.dataReceived(b"2\r\nx\n\r\n0\r\n\r\n")
    assert b"".join(body.data) == b"data: x\n" and body.reason is not None and body.reason.check(ResponseDone)


def test_cancelling_before_the_answer_aborts_the_connection() -> None:
    reactor, agent, _ = setup()
    answer = post(agent)
    protocol, transport = connect(reactor)
    answer.cancel()
    assert isinstance(result(answer).value, CancelledError)
    assert transport.disconnecting
    protocol.connectionLost(Failure(ConnectionLost()))
    assert agent._pools[b"127.0.0.1:8080"].idle == []


def test_stop_producing_aborts_mid_body_and_a_lost_connection_fails_the_body() -> None:
    reactor, agent, _ = setup()
    answer = post(agent)
    protocol, transport = connect(reactor)
    protocol.dataReceived(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc")
    body = Body()
    response = result(answer)
    response.deliverBody(body)
    body.transport.stopProducing()  # type: ignore[attr-defined]
    assert transport.disconnecting
    protocol.connectionLost(Failure(ConnectionLost()))
    assert body.reason is not None and body.reason.check(ResponseFailed)


def test_a_close_delimited_body_ends_with_potential_data_loss_and_is_not_reused() -> None:
    reactor, agent, _ = setup()
    answer = post(agent)
    protocol, _transport = connect(reactor)
    protocol.dataReceived(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")
    body = Body()
    result(answer).deliverBody(body)
    protocol.connectionLost(Failure(ConnectionDone()))
    assert b"".join(body.data) == b"all of it"
    assert body.reason is not None and body.reason.check(PotentialDataLoss, ResponseDone)
    post(agent)
    assert len(reactor.tcpClients) == 2


def test_a_reused_connection_closed_before_any_answer_byte_is_retried_once_on_a_fresh_one() -> None:
    # the second goes out on the idle connection, which the backend had closed
    reactor, _agent, protocol, second = on_a_reused_connection()
    protocol.connectionLost(Failure(ConnectionDone()))
    assert not second.called and len(reactor.tcpClients) == 2
    fresh, transport = connect(reactor)
    assert transport.value().startswith(b"POST /v1/chat/completions")
    fresh.dataReceived(OK)
    assert result(second).code == 200


def test_a_fresh_connection_lost_before_the_answer_fails_the_request() -> None:
    reactor, agent, _ = setup()
    answer = post(agent)
    protocol, _transport = connect(reactor)
    protocol.connectionLost(Failure(ConnectionLost()))
    assert isinstance(result(answer).value, ResponseFailed)


def test_other_schemes_and_streaming_producers_go_to_the_fallback_agent() -> None:
    _reactor, agent, fallback = setup()
    agent.request(b"GET", b"https://example.test/x")
    agent.request(b"POST", URL, None, object())
    assert fallback.calls == [b"https://example.test/x", URL]


def test_a_refused_connect_is_tried_again_after_short_delays_then_fails_with_the_refusal() -> None:
    """A backend that refuses (stopping or restarting; nothing was sent) is not failed at once: a
    queue released onto a dying backend must not drain into errors before the node sees it end."""
    from twisted.internet.error import ConnectionRefusedError

    from routerd.clients.backend_http import REFUSED_BACKOFF_S

    reactor, agent, _ = setup()
    answer = post(agent)
    for attempt, delay in enumerate(REFUSED_BACKOFF_S):
        reactor.tcpClients[-1][2].clientConnectionFailed(None, Failure(ConnectionRefusedError()))
        assert not answer.called and len(reactor.tcpClients) == attempt + 1
        reactor.advance(delay)
        assert len(reactor.tcpClients) == attempt + 2
    protocol, _transport = connect(reactor)  # the last try gets through
    protocol.dataReceived(OK)
    assert result(answer).code == 200
    reactor, agent, _ = setup()
    refused = post(agent)
    for delay in REFUSED_BACKOFF_S:
        reactor.tcpClients[-1][2].clientConnectionFailed(None, Failure(ConnectionRefusedError()))
        reactor.advance(delay)
    reactor.tcpClients[-1][2].clientConnectionFailed(None, Failure(ConnectionRefusedError()))
    assert isinstance(result(refused).value, ConnectionRefusedError)


def test_chunks_that_arrive_in_one_read_are_delivered_together_and_reads_stay_apart() -> None:
    """A streamed answer's chunks parsed from one read reach the body protocol as one piece (so
    they are relayed, rewritten and written once), and a later read as another piece."""
    reactor, agent, _ = setup()
    answer = post(agent)
    protocol, _transport = connect(reactor)
    protocol.dataReceived(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    body = Body()
    result(answer).deliverBody(body)
    protocol.dataReceived(b"3\r\nabc\r\n2\r\nde\r\n1\r\nf\r\n")
    assert body.data == [b"abcdef"]
    protocol.dataReceived(b"2\r\ngh\r\n0\r\n\r\n")
    assert body.data == [b"abcdef", b"gh"]
    assert body.reason is not None and body.reason.check(ResponseDone)


def test_an_answer_that_arrived_in_one_read_is_complete_when_its_deferred_fires() -> None:
    """The request's Deferred fires once the whole read is parsed, so the reader finds
    the body complete (no suspension waiting for it); before, it fired at the end of the head,
    with the body still to be parsed."""
    reactor, agent, _ = setup()
    answer = post(agent)
    protocol, _transport = connect(reactor)
    seen: list[tuple[list[bytes], Failure | None]] = []

    def read(response: Any) -> None:
        body = Body()
        response.deliverBody(body)
        seen.append((list(body.data), body.reason))

    answer.addCallback(read)
    protocol.dataReceived(OK)
    [(data, reason)] = seen
    assert b"".join(data) == b'{"a": true}'
    assert reason is not None and reason.check(ResponseDone)


def test_a_head_without_its_body_fires_at_once_and_the_body_follows() -> None:
    """A stream's head still fires the request in the read it came in; the body is delivered as
    it arrives."""
    reactor, agent, _ = setup()
    answer = post(agent)
    protocol, _transport = connect(reactor)
    protocol.dataReceived(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nabc")
    body = Body()
    result(answer).deliverBody(body)
    assert body.data == [b"abc"] and body.reason is None
    protocol.dataReceived(b"def")
    assert body.data == [b"abc", b"def"] and body.reason is not None and body.reason.check(ResponseDone)


def test_a_malformed_body_after_the_head_in_one_read_fires_the_answer_then_fails_the_body() -> None:
    reactor, agent, _ = setup()
    answer = post(agent)
    protocol, transport = connect(reactor)
    protocol.dataReceived(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
    body = Body()
    result(answer).deliverBody(body)
    assert body.reason is not None and body.reason.check(ResponseFailed)
    assert transport.disconnecting


def test_answer_headers_are_read_by_name_whatever_the_case_as_headers_gives_them() -> None:
    """:class:`AnswerHeaders` answers what the request path asks of twisted's
    ``Headers``: values in order, ``str`` for a ``str`` name, the default when missing."""
    reactor, agent, _ = setup()
    answer = post(agent)
    protocol, _transport = connect(reactor)
    protocol.dataReceived(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Routerd-Node: a\r\n"
                          b"x-routerd-node: b\r\nContent-Length: 0\r\n\r\n")
    headers = result(answer).headers
    assert isinstance(headers, AnswerHeaders)
    assert headers.getRawHeaders(b"content-type") == [b"application/json"]
    assert headers.getRawHeaders(b"X-ROUTERD-NODE") == [b"a", b"b"]
    assert headers.getRawHeaders("x-routerd-node") == ["a", "b"]
    assert headers.getRawHeaders(b"location") is None
    assert headers.getRawHeaders(b"location", [b"-"]) == [b"-"]
    assert headers.hasHeader(b"Content-Length") and not headers.hasHeader("location")
    assert dict(headers.getAllRawHeaders()) == {b"Content-Type": [b"application/json"],
                                                b"X-Routerd-Node": [b"a", b"b"], b"Content-Length": [b"0"]}


def test_collect_takes_an_answer_that_arrived_whole_without_a_relay(monkeypatch: Any) -> None:
    """A forwarded (or local) answer read in one go is taken at once by ``collect``;
    before, it went through a relay protocol, its tail and its Deferred."""
    from routerd.routing import relay

    def no_relay(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("the relay protocol was used")

    monkeypatch.setattr(relay, "Relay", no_relay)
    reactor, agent, _ = setup()
    answer = post(agent)
    protocol, _transport = connect(reactor)
    protocol.dataReceived(OK)
    response = result(answer)
    assert result(ensureDeferred(relay.collect(response))) == b'{"a": true}'
    assert response.body_if_complete() is None  # taken once


def test_an_answer_still_arriving_or_close_delimited_is_not_taken_whole() -> None:
    reactor, agent, _ = setup()
    answer = post(agent)
    protocol, _transport = connect(reactor)
    protocol.dataReceived(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nabc")
    response = result(answer)
    assert response.body_if_complete() is None
    collected = ensureDeferred(collect(response))
    protocol.dataReceived(b"def")
    assert result(collected) == b"abcdef"

    answer = post(agent)
    protocol.dataReceived(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")
    response = result(answer)
    protocol.connectionLost(Failure(ConnectionDone()))
    assert response.body_if_complete() is None  # ended with PotentialDataLoss: the relay decides
    assert result(ensureDeferred(collect(response))) == b"all of it"


def sent_head(headers: Any) -> bytes:
    reactor, agent, _ = setup()
    agent.request(b"POST", URL, headers, BytesProducer(b"{}"))
    _protocol, transport = connect(reactor)
    return transport.value()


@settings(max_examples=150, deadline=None)
@given(content_type=st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF), max_size=40))
def test_shared_content_type_headers_send_what_a_headers_made_per_request_sends(content_type: str) -> None:
    """The head rendered once for :func:`content_type_headers` is the head a ``Headers`` made for
    the request renders, byte for byte, whatever the content type."""
    shared = content_type_headers(content_type)
    assert sent_head(shared) == sent_head(Headers({b"content-type": [content_type.encode()]}))
    assert shared == Headers({b"content-type": [content_type.encode()]})


def test_shared_request_headers_refuse_changes_and_copy_to_plain_headers() -> None:
    shared = content_type_headers("application/json")
    for change in (lambda: shared.addRawHeader(b"x", b"y"), lambda: shared.setRawHeaders(b"x", [b"y"]),
                   lambda: shared.removeHeader(b"content-type")):
        with pytest.raises(TypeError):
            change()
    assert content_type_headers("application/json") is shared  # made once
    copy = shared.copy()
    copy.addRawHeader(b"host", b"a")  # what twisted's Agent does with the headers it is given
    assert type(copy) is Headers
    assert sent_head(shared) == sent_head(Headers({b"content-type": [b"application/json"]}))
    assert isinstance(RequestHeaders({b"a": [b"b"]}).copy(), Headers)


NAME = st.text(st.sampled_from("abcXYZ-"), min_size=1, max_size=4).map(str.encode)
VALUE = st.text(st.sampled_from("ab ;=é"), max_size=3).map(str.encode)


@settings(max_examples=200, deadline=None)
@given(fields=st.lists(st.tuples(NAME, VALUE), max_size=6), asked=NAME)
def test_answer_headers_give_every_value_of_a_name_in_any_case(fields: list[tuple[bytes, bytes]],
                                                               asked: bytes) -> None:
    """Names are looked up through a cache of lowered names: the answer is the case-blind scan's."""
    headers = AnswerHeaders([part for field in fields for part in field])
    expected = [value for name, value in fields if name.lower() == asked.lower()] or None
    assert headers.getRawHeaders(asked) == expected
    as_str = None if expected is None else [value.decode() for value in expected]
    assert headers.getRawHeaders(asked.decode()) == as_str
    assert headers.hasHeader(asked) is (expected is not None)


def on_a_reused_connection() -> tuple[MemoryReactorClock, BackendAgent, Any, Deferred[Any]]:
    """A first request answered whole, then a second sent on the same (kept-alive) connection."""
    reactor, agent, _ = setup()
    first = post(agent)
    protocol, _transport = connect(reactor)
    protocol.dataReceived(OK)
    result(first).deliverBody(Body())
    return reactor, agent, protocol, post(agent)


def test_a_request_cancelled_on_a_reused_connection_is_not_sent_again_when_it_closes() -> None:
    reactor, _agent, protocol, second = on_a_reused_connection()
    second.cancel()
    protocol.connectionLost(Failure(ConnectionDone()))
    assert isinstance(result(second).value, CancelledError) and len(reactor.tcpClients) == 1


def test_an_idle_connection_that_closes_after_its_answer_sends_nothing_again() -> None:
    reactor, agent, protocol, second = on_a_reused_connection()
    protocol.dataReceived(OK)
    assert result(second).code == 200
    protocol.connectionLost(Failure(ConnectionDone()))
    assert len(reactor.tcpClients) == 1 and agent._pools[b"127.0.0.1:8080"].idle == []
