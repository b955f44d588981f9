"""An answer before the body (401, 413, 503 at head time) closes only the channel's sending side
and reads and drops the rest of the body until the client closes: a close with the body unread
resets the connection, and a proxy still sending the body (nginx) would lose the answer and tell
its client 502.  The reaper still ends a connection that lingers past ``send_timeout``."""

from __future__ import annotations

from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport

from routerd.api.channel import LeanChannel
from routerd.errors import HTTPError
from tests.unit.test_api_channel import Served


class HalfCloseTransport(StringTransport):
    """A transport that can close its sending side alone, as TCP's can."""

    write_closed = False

    def loseWriteConnection(self) -> None:  # noqa: N802 - Twisted's name
        self.write_closed = True


def _served(keys: tuple[str, ...] = ("secret-key",), limit: int = 1024) -> Served:
    served = Served(keys=keys, limit=limit)
    served.transport = HalfCloseTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 50001))
    channel = served.factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 50001))
    assert isinstance(channel, LeanChannel)
    served.channel = channel
    channel.makeConnection(served.transport)
    return served


def _head(length: int, extra: bytes = b"") -> bytes:
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: node\r\nContent-Type: application/json\r\n" + extra
            + b"Content-Length: " + str(length).encode() + b"\r\n\r\n")


def test_a_refusal_before_the_body_half_closes_and_drops_the_body_that_still_arrives() -> None:
    for served, extra, status in ((_served(), b"", b"401"),
                                  (_served(limit=8), b"Authorization: Bearer secret-key\r\n", b"413")):
        served.send(_head(4_000_000, extra) + b"x" * 65536)
        out = served.written()
        assert out.startswith(b"HTTP/1.1 " + status) and b"connection: close" in out
        transport = served.transport
        assert isinstance(transport, HalfCloseTransport)
        assert transport.write_closed and not transport.disconnecting  # still reading
        served.send(b"x" * 65536 + _head(2, b"Authorization: Bearer secret-key\r\n") + b"{}")
        assert served.written() == b"" and not served.api.calls  # dropped, nothing served


def test_a_lingering_connection_is_aborted_after_send_timeout() -> None:
    served = _served()
    served.send(_head(4_000_000) + b"x" * 100)
    clock = served.site.reactor
    served.factory.startFactory()
    timeout = served.factory.limits.send_timeout
    clock.advance(timeout - 1)
    assert not served.transport.disconnected
    clock.advance(2)
    assert served.transport.disconnected  # StringTransport's abortConnection


def test_a_refusal_on_a_connection_handed_to_twisted_web_lingers_too() -> None:
    """After a request twisted.web served (``/health``), the connection is its channel's: a refusal
    there half-closes as well (a proxy reuses its upstream connections)."""
    served = _served()
    served.send(b"GET /health HTTP/1.1\r\nHost: node\r\n\r\n")
    assert served.channel._inner is not None and served.written().startswith(b"HTTP/1.1 200 ")
    served.send(_head(4_000_000) + b"x" * 65536)
    out = served.written()
    assert out.startswith(b"HTTP/1.1 401 ") and b"unauthorized" in out
    transport = served.transport
    assert isinstance(transport, HalfCloseTransport)
    assert transport.write_closed and not transport.disconnecting
    served.send(b"x" * 65536)
    assert served.written() == b""


def test_a_deadlines_refusal_and_a_bodiless_one_close_at_once() -> None:
    served = _served()
    served.send(_head(100, b"Authorization: Bearer secret-key\r\n") + b"x" * 10)
    served.channel.expire(HTTPError(408, "the body did not arrive in time", "timeout", "body_timeout"))
    transport = served.transport
    assert isinstance(transport, HalfCloseTransport)
    assert served.written().startswith(b"HTTP/1.1 408 ")
    assert transport.disconnecting and not transport.write_closed
    bodiless = _served()
    bodiless.send(b"GET /v1/models HTTP/1.1\r\nHost: node\r\n\r\n")
    assert bodiless.written().startswith(b"HTTP/1.1 401 ")
    assert bodiless.transport.disconnecting
