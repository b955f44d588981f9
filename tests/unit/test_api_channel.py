"""The lean HTTP/1.1 channel (``routerd.api.channel``): which requests it serves itself, how it
answers them, and that everything else reaches twisted.web unchanged on the same connection."""

from __future__ import annotations

import gc
import json
import types

import pytest
from klein import Klein
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.web.iweb import IRequest

from routerd.api.channel import HEAD_LIMIT, LeanChannel, NodeServerFactory
from routerd.api.dispatch import Dispatch
from routerd.api.routes import Routes
from routerd.api.site import GuardResource, NodeSite
from routerd.cluster.auth import AuthPolicy
from routerd.errors import HTTPError
from routerd.routing.call import Incoming, Reply


class Api:
    """One lean route (``/v1/chat/completions``) whose answers the test decides, and one Klein
    route (``/health``) that twisted.web serves."""

    routes = Routes()

    def __init__(self) -> None:
        self.calls: list[tuple[str, Incoming, Reply, Deferred[bytes]]] = []
        self.cancelled: list[str] = []

    @routes.route("/health", methods=["GET"], auth="health")
    def health(self, request: IRequest) -> bytes:
        return b"healthy"

    @routes.lean("/v1/chat/completions", methods=["POST"], auth="inference")
    def chat(self, method: str, path: str, facts: Incoming, reply: Reply) -> Deferred[bytes]:
        d: Deferred[bytes] = Deferred(lambda _: self.cancelled.append(path))
        self.calls.append((path, facts, reply, d))
        return d


class Served:
    def __init__(self, keys: tuple[str, ...] = (), phase: str = "ready", limit: int = 1024,
                 buffer: int | None = None) -> None:
        self.api = Api()
        self.phase = phase
        policy = AuthPolicy.build(keys, (), "", ["127.0.0.0/8"])
        guard = GuardResource(Dispatch([self.api]), policy, limit, phase=lambda: self.phase)
        site = NodeSite(guard, limit, buffer)
        site.reactor = Clock()
        site.timeOut = None
        self.site = site
        self.factory = NodeServerFactory(site, lambda: self.phase)
        self.transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 50000))
        channel = self.factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 50000))
        assert isinstance(channel, LeanChannel)
        self.channel = channel
        channel.makeConnection(self.transport)

    def send(self, data: bytes) -> None:
        self.channel.dataReceived(data)

    def written(self) -> bytes:
        out = self.transport.value()
        self.transport.clear()
        return out


def post(body: bytes = b'{"model":"m"}', path: bytes = b"/v1/chat/completions", extra: bytes = b"") -> bytes:
    return (b"POST " + path + b" HTTP/1.1\r\nHost: node\r\nContent-Type: application/json\r\n" + extra
            + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def test_an_inference_post_is_served_by_the_channel_with_a_content_length_and_kept_alive() -> None:
    served = Served()
    served.send(post(b'{"model":"m"}', b"/v1/chat/completions?x=1&x=2"))
    assert served.channel._inner is None  # never handed to twisted.web
    path, facts, reply, d = served.api.calls[0]
    assert (path, facts.body) == ("/v1/chat/completions", b'{"model":"m"}')
    assert facts.content_type == "application/json"
    assert facts.query == {"x": ["1", "2"]} and facts.header("host") == "node"
    reply.set_header(b"x-routerd-node", b"n1")
    d.callback(b'{"ok":true}')
    out = served.written()
    assert out.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"content-length: 11\r\n" in out and b"x-routerd-node: n1\r\n" in out
    assert out.endswith(b"\r\n\r\n{\"ok\":true}")
    assert not served.transport.disconnecting


def test_a_body_arriving_in_pieces_is_served_once_whole() -> None:
    served = Served()
    raw = post(b'{"model":"m","messages":[]}')
    for i in range(0, len(raw), 7):
        served.send(raw[i:i + 7])
    assert len(served.api.calls) == 1
    assert served.api.calls[0][1].body == b'{"model":"m","messages":[]}'


def test_pipelined_requests_are_answered_in_order_one_at_a_time() -> None:
    served = Served()
    served.send(post(b'{"n":1}') + post(b'{"n":2}'))
    assert [c[1].body for c in served.api.calls] == [b'{"n":1}']  # the second waits
    served.api.calls[0][3].callback(b"first")
    assert [c[1].body for c in served.api.calls] == [b'{"n":1}', b'{"n":2}']
    served.api.calls[1][3].callback(b"second")
    out = served.written()
    assert out.index(b"first") < out.index(b"second")


def test_a_streamed_answer_goes_out_chunked_and_ends_with_the_last_chunk() -> None:
    served = Served()
    served.send(post())
    _, _, reply, d = served.api.calls[0]
    reply.set_header(b"content-type", b"text/event-stream")
    reply.write(b"data: 1\n\n")
    assert reply.started
    reply.write(b"")  # an empty write never ends the chunked body early
    d.callback(b"")
    out = served.written()
    assert b"transfer-encoding: chunked\r\n" in out and b"content-length" not in out
    assert out.endswith(b"\r\n\r\n9\r\ndata: 1\n\n\r\n0\r\n\r\n")


def test_other_paths_are_handed_to_twisted_web_and_the_connection_goes_on_serving() -> None:
    served = Served()
    served.send(b"GET /health HTTP/1.1\r\nHost: node\r\n\r\n")
    assert served.channel._inner is not None
    assert b"healthy" in served.written()
    served.send(post(b'{"n":3}'))  # the same connection, now twisted.web's: Dispatch serves it
    _, facts, _, d = served.api.calls[0]
    assert facts.body == b'{"n":3}'
    d.callback(b"third")
    assert served.written().endswith(b"third\r\n0\r\n\r\n")


@pytest.mark.parametrize("raw", [
    post(extra=b"Origin: http://ui.example\r\n"),  # CORS: twisted.web's guard adds the headers
    post().replace(b"HTTP/1.1", b"HTTP/1.0", 1),
    post(extra=b"Expect: 100-continue\r\n"),
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: n\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"3\r\nabc\r\n0\r\n\r\n",
], ids=["origin", "http-1.0", "expect", "chunked-body"])
def test_requests_the_channel_does_not_fully_understand_are_handed_over_whole(raw: bytes) -> None:
    served = Served()
    served.send(raw)
    assert served.channel._inner is not None
    if served.api.calls:  # served by Dispatch from twisted.web's request: the same body
        assert served.api.calls[0][1].body in (b'{"model":"m"}', b"abc")


def test_a_body_over_the_limit_is_refused_413_at_head_time_and_the_connection_closed() -> None:
    """Issue 20: the lean channel refuses from the Content-Length, before reading the body."""
    served = Served(limit=8)
    served.send(post(b'{"model":"long"}'))
    assert served.channel._inner is None and not served.api.calls
    out = served.written()
    assert out.startswith(b"HTTP/1.1 413 ") and b"request_too_large" in out
    assert b"connection: close" in out and served.transport.disconnecting


def test_a_head_longer_than_the_limit_is_handed_over() -> None:
    served = Served()
    served.send(b"POST /v1/chat/completions HTTP/1.1\r\nX: " + b"a" * (HEAD_LIMIT + 10))
    assert served.channel._inner is not None


def test_a_node_that_is_not_ready_hands_over_and_twisted_web_answers_503() -> None:
    served = Served(phase="draining")
    served.send(post())
    assert served.written().startswith(b"HTTP/1.1 503 ")
    assert not served.api.calls


def test_a_caller_without_the_inference_key_is_refused_401_by_the_channel() -> None:
    served = Served(keys=("secret-key",))
    served.send(post())
    out = served.written()
    assert served.channel._inner is None and not served.api.calls
    assert out.startswith(b"HTTP/1.1 401 Unauthorized") and b"unauthorized" in out
    assert b"connection: close" in out and served.transport.disconnecting  # its body is never read
    served.send(post(extra=b"Authorization: Bearer secret-key\r\n"))
    assert not served.api.calls  # nothing more is read on a refused connection
    again = Served(keys=("secret-key",))
    again.send(post(extra=b"Authorization: Bearer secret-key\r\n"))
    assert len(again.api.calls) == 1


def test_a_handler_error_is_answered_with_its_envelope_and_a_bug_with_500() -> None:
    served = Served()
    served.send(post() + post())
    served.api.calls[0][3].errback(HTTPError(404, "model 'm' was not found", "not_found", "model_not_found"))
    first = served.written()
    assert first.startswith(b"HTTP/1.1 404 ")
    assert json.loads(first.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "model_not_found"
    served.api.calls[1][3].errback(ZeroDivisionError("bug"))
    assert served.written().startswith(b"HTTP/1.1 500 ")


def test_a_client_that_disconnects_cancels_the_handler_and_nothing_more_is_written() -> None:
    served = Served()
    served.send(post())
    _, _, reply, d = served.api.calls[0]
    served.channel.connectionLost()
    assert served.api.cancelled == ["/v1/chat/completions"] and reply.gone
    reply.write(b"late")
    assert served.written() == b""


def test_connection_close_closes_after_the_answer() -> None:
    served = Served()
    served.send(post(extra=b"Connection: close\r\n"))
    served.api.calls[0][3].callback(b"bye")
    assert b"connection: close\r\n" in served.written()
    assert served.transport.disconnecting


def test_a_held_body_counts_against_the_buffer_budget_until_answered() -> None:
    served = Served(buffer=100)
    body = b'{"model":"m"}'
    served.send(post(body))
    budget = served.site.buffer
    assert budget is not None and budget.used == len(body)
    served.api.calls[0][3].callback(b"done")
    assert budget.used == 0


def test_a_body_counts_as_arriving_only_until_it_is_whole() -> None:
    """A body still arriving after its head is counted to its client as arriving (what a key's
    max_concurrent is checked against) until it is whole; one that came with its head never is;
    either way its bytes stay held until the answer, then nothing is left."""
    served = Served(buffer=100)
    budget = served.site.buffer
    assert budget is not None
    body = b'{"model":"m"}'
    raw = post(body)
    served.send(raw[:-3])
    assert budget.arriving("client 127.0.0.1") == 1 and budget.used == len(body)
    served.send(raw[-3:])
    assert budget.arriving("client 127.0.0.1") == 0 and budget.used == len(body)
    served.api.calls[0][3].callback(b"one")
    served.send(raw)
    assert budget.arriving("client 127.0.0.1") == 0 and budget.used == len(body)
    served.api.calls[1][3].callback(b"two")
    assert budget.used == 0 and not budget._held


def test_a_full_buffer_budget_is_refused_503_by_twisted_web() -> None:
    served = Served(buffer=4)
    served.send(post(b'{"model":"m"}'))
    assert served.written().startswith(b"HTTP/1.1 503 ")


def test_klein_still_answers_the_lean_paths_for_a_twisted_request() -> None:
    """Dispatch keeps the inference paths for requests twisted.web parsed (handed-over ones)."""
    assert isinstance(Api.routes.klein, Klein)
    served = Served()
    served.send(b"GET /health HTTP/1.1\r\nHost: n\r\n\r\n" + post(b'{"n":1}', extra=b"Origin: http://x\r\n"))
    assert served.api.calls and served.api.calls[0][1].body == b'{"n":1}'


def test_connections_idle_longer_than_the_site_timeout_are_closed_but_not_busy_ones() -> None:
    busy = Served()
    clock = busy.site.reactor
    busy.site.timeOut = 100
    idle_transport = StringTransport()
    idle = busy.factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 50001))
    idle.makeConnection(idle_transport)
    busy.factory.startFactory()
    busy.send(post())  # in flight: never reaped
    clock.advance(60)
    assert not idle_transport.disconnecting
    clock.advance(60)  # idle for 120 s > 100 s
    assert idle_transport.disconnecting and not busy.transport.disconnecting
    busy.api.calls[0][3].callback(b"done")
    clock.advance(60)
    assert not busy.transport.disconnecting  # idle since the answer: 60 s
    clock.advance(60)
    assert busy.transport.disconnecting
    busy.factory.stopFactory()
    assert not clock.getDelayedCalls()


def test_an_aborted_stream_gets_no_clean_end() -> None:
    """A stream the request path aborts (the backend broke off) must look incomplete to the
    client: no last chunk follows, whatever the handler returns afterwards."""
    served = Served()
    served.send(post())
    _, _, reply, d = served.api.calls[0]
    reply.write(b"data: 1\n\n")
    reply.abort()
    d.callback(b"")
    out = served.written()
    assert not out.endswith(b"0\r\n\r\n") and served.transport.disconnecting


def test_a_held_request_keeps_a_slim_reply_shared_head_strings_and_one_callback() -> None:
    """Issue 24 (held-request memory): while its answer is pending, a request keeps its reply's
    headers as one flat list (no lower-cased name copies, no pairs), a head without its raw target
    whose method, version and path are objects every request shares, no record of the head it was
    read under, and one callback on the handler's Deferred; the answer is unchanged."""
    served = Served()
    served.send(post())
    served.api.calls[0][3].callback(b"first")
    served.written()
    served.send(post())
    first = served.api.calls[0][2]
    reply, d = served.api.calls[1][2], served.api.calls[1][3]
    reply.set_header(b"X-Routerd-Node", b"n1")
    reply.set_header(b"x-routerd-node", b"n2")  # replaced, whatever the case
    reply.set_header(b"Content-Type", b"text/plain")
    assert reply.headers == [b"x-routerd-node", b"n2", b"Content-Type", b"text/plain"]  # type: ignore[attr-defined]
    head, other = reply.request, first.request  # type: ignore[attr-defined]
    assert head.target == b"" and head.path == "/v1/chat/completions"
    assert head.method is other.method and head.version is other.version and head.path is other.path
    assert not [o for o in gc.get_objects() if type(o).__name__ == "_Head"]
    assert len([o for o in gc.get_referrers(reply) if isinstance(o, types.MethodType)]) == 1
    d.callback(b"answer")
    out = served.written()
    assert b"\r\nx-routerd-node: n2\r\n" in out and b"\r\nContent-Type: text/plain\r\n" in out
    assert b"application/json" not in out and out.endswith(b"\r\n\r\nanswer")
