"""Clock-driven resource rules of the HTTP edge (issue 20), on both edges where both apply: the replay
budget held per connection, the head and body deadlines, the reaper's abort, the connection cap and
the write-buffer bound on pipelining.  No sockets, no sleeps: a Clock and in-memory transports."""

from __future__ import annotations

from twisted.internet.error import ConnectionDone
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from routerd.config.schema import ServerConfig
from tests.unit.edge_support import Edges, handed_over, request, status_and_code


def head_only(length: int, version: bytes = b"HTTP/1.1") -> bytes:
    raw = request(version=version, body=b"x" * length)
    return raw[:len(raw) - length]


def test_the_budget_is_reserved_from_content_length_at_head_time_and_refused_beyond_it() -> None:
    edges = Edges(buffer=1000)
    first, _ = edges.connect()
    first.dataReceived(head_only(600))
    assert edges.site.buffer is not None and edges.site.buffer.used == 600  # before a body byte
    second, out = edges.connect()
    second.dataReceived(head_only(600))
    assert status_and_code(out.value()) == (503, "buffer_full") and b"Retry-After: 1" in out.value()
    assert edges.site.buffer.used == 600
    first.connectionLost()  # gone mid-body: its reservation comes back
    assert edges.site.buffer.used == 0


def test_the_twisted_edge_reserves_at_head_time_too() -> None:
    edges = Edges(buffer=1000)
    channel, _ = edges.connect("twisted")
    channel.dataReceived(head_only(600, b"HTTP/1.0"))
    assert edges.site.buffer is not None and edges.site.buffer.used == 600
    other, out = edges.connect("twisted")
    other.dataReceived(head_only(600, b"HTTP/1.0"))
    assert status_and_code(out.value()) == (503, "buffer_full")
    channel.dataReceived(b"x" * 600)  # served at once (the test route answers synchronously)
    assert edges.api.served and edges.site.buffer.used == 0
    channel.connectionLost(Failure(ConnectionDone()))
    assert edges.site.buffer.used == 0


def test_a_reservation_is_given_back_exactly_once_when_answered_then_disconnected() -> None:
    edges = Edges(buffer=1000)
    edges.api.hold = True
    held, _ = edges.connect()
    held.dataReceived(request(body=b"y" * 300))
    answered, _ = edges.connect()
    answered.dataReceived(request(body=b"x" * 600))
    assert edges.site.buffer is not None and edges.site.buffer.used == 900
    edges.api.pending[1].callback(b"{}")
    assert edges.site.buffer.used == 300
    answered.connectionLost()
    assert edges.site.buffer.used == 300  # not given back a second time
    held.connectionLost()
    assert edges.site.buffer.used == 0


def test_a_head_trickled_past_the_head_timeout_gets_408_and_the_connection_closes() -> None:
    for edge in ("lean", "twisted"):
        edges = Edges(server=ServerConfig(head_timeout=10))
        edges.factory.startFactory()
        channel, out = edges.connect()
        if edge == "twisted":  # a first request handed over, then the next head on twisted.web's channel
            channel.dataReceived(b"GET /health HTTP/1.1\r\nHost: n\r\n\r\n")
            assert handed_over(channel)
            out.clear()
        raw = request()
        for i in range(12):
            channel.dataReceived(raw[i:i + 1])
            edges.clock.advance(1)
        assert status_and_code(out.value()) == (408, "request_timeout"), edge
        assert out.disconnecting and not edges.api.served, edge


def test_a_body_that_stops_arriving_gets_408_after_the_body_timeout() -> None:
    edges = Edges(server=ServerConfig(body_timeout=5), buffer=1000)
    edges.factory.startFactory()
    channel, out = edges.connect()
    channel.dataReceived(head_only(100) + b"x" * 10)
    edges.clock.advance(3)
    channel.dataReceived(b"x" * 10)  # progress moves the deadline
    edges.clock.advance(4)
    assert out.value() == b""
    edges.clock.advance(3)
    assert status_and_code(out.value()) == (408, "request_timeout") and out.disconnecting
    assert edges.site.buffer is not None and edges.site.buffer.used == 0


def test_the_reaper_aborts_a_connection_whose_output_never_drains_after_close() -> None:
    edges = Edges(server=ServerConfig(send_timeout=20))
    edges.site.timeOut = 30
    edges.factory.startFactory()
    _, out = edges.connect()
    edges.clock.advance(32)
    assert out.disconnecting and not out.disconnected  # asked to close, output still queued
    edges.clock.advance(22)
    assert out.disconnected  # aborted


def test_a_client_that_stops_reading_holds_the_next_request_and_is_aborted_after_send_timeout() -> None:
    edges = Edges(server=ServerConfig(send_timeout=20))
    edges.api.hold = True
    edges.factory.startFactory()
    channel, out = edges.connect()
    channel.dataReceived(request(body=b'{"n":1}') + request(body=b'{"n":2}'))
    assert len(edges.api.served) == 1
    channel.pauseProducing()  # the transport's buffer is full: the client is not reading
    edges.api.pending[0].callback(b"{}")
    assert len(edges.api.served) == 1  # the pipelined request waits for the client to read
    channel.resumeProducing()
    assert len(edges.api.served) == 2
    channel.pauseProducing()  # the second answer's output backs up while it is in flight
    edges.clock.advance(22)
    assert out.disconnected


def test_connections_beyond_max_connections_get_503_and_are_closed() -> None:
    edges = Edges(server=ServerConfig(max_connections=2))
    edges.connect()
    edges.connect()
    protocol = edges.factory.buildProtocol(None)
    transport = StringTransport()
    protocol.makeConnection(transport)
    assert status_and_code(transport.value()) == (503, "too_many_connections")
    assert transport.disconnecting
