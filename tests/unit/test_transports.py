"""``routerd.transports.send``: straight to the socket when nothing is queued, else queued in
order (no sockets: a fake socket under a real ``tcp.Connection`` object)."""

from __future__ import annotations

from typing import Any

from twisted.internet.task import Clock
from twisted.internet.tcp import Connection
from twisted.internet.testing import StringTransport

from routerd.transports import send


class FakeSocket:
    def __init__(self, takes: int | None = None, error: type[Exception] | None = None) -> None:
        self.sent: list[bytes] = []
        self.takes = takes
        self.error = error

    def send(self, data: bytes) -> int:
        if self.error is not None:
            raise self.error()
        n = len(data) if self.takes is None else min(self.takes, len(data))
        self.sent.append(bytes(data[:n]))
        return n


def connection(sock: FakeSocket, queued: bytes = b"") -> Any:
    conn: Any = Connection.__new__(Connection)
    conn.socket = sock
    conn.dataBuffer = queued
    conn._tempDataBuffer = []
    conn.connected = True
    conn.disconnecting = False
    conn.written = []
    conn.write = conn.written.append  # what Twisted would queue
    return conn


def test_bytes_go_straight_to_the_socket_when_nothing_is_queued() -> None:
    sock = FakeSocket()
    conn = connection(sock)
    send(conn, b"answer")
    assert sock.sent == [b"answer"] and conn.written == []


def test_what_the_kernel_does_not_take_is_queued() -> None:
    sock = FakeSocket(takes=2)
    conn = connection(sock)
    send(conn, b"answer")
    assert sock.sent == [b"an"] and conn.written == [b"swer"]


def test_bytes_queue_behind_queued_bytes_to_keep_their_order() -> None:
    sock = FakeSocket()
    conn = connection(sock, queued=b"earlier")
    send(conn, b"later")
    assert sock.sent == [] and conn.written == [b"later"]


def test_a_full_or_failing_socket_leaves_everything_to_the_transport() -> None:
    for error in (BlockingIOError, ConnectionResetError):
        conn = connection(FakeSocket(error=error))
        send(conn, b"answer")
        assert conn.written == [b"answer"]


def test_a_closing_connection_and_other_transports_use_write() -> None:
    sock = FakeSocket()
    conn = connection(sock)
    conn.disconnecting = True
    send(conn, b"x")
    assert sock.sent == [] and conn.written == [b"x"]
    other = StringTransport()
    send(other, b"y")
    assert other.value() == b"y"


def test_no_delay_turns_nagle_off_where_the_transport_can() -> None:
    from routerd.transports import no_delay

    class Tcp:
        def __init__(self) -> None:
            self.nodelay: list[bool] = []

        def setTcpNoDelay(self, enabled: bool) -> None:  # noqa: N802 - Twisted's name
            self.nodelay.append(enabled)

    tcp = Tcp()
    no_delay(tcp)
    assert tcp.nodelay == [True]
    no_delay(StringTransport())  # no such method: left alone


def test_a_small_body_leaves_joined_to_its_head_and_a_large_one_after_it_uncopied() -> None:
    from routerd.transports import JOIN_BELOW, send_with_head

    sock = FakeSocket()
    send_with_head(connection(sock), b"HEAD", b"body")
    assert sock.sent == [b"HEADbody"]
    big = b"x" * JOIN_BELOW
    sock = FakeSocket()
    send_with_head(connection(sock), b"HEAD", big)
    assert sock.sent == [b"HEAD", big]


class _Unconnected:
    """What ``tcp.Connection.__init__`` asks of its socket (no socket is opened)."""

    def setblocking(self, flag: bool) -> None:
        pass

    def fileno(self) -> int:
        return -1


def test_the_connection_internals_send_reads_are_those_of_the_pinned_twisted() -> None:
    """A guard for the pin in pyproject.toml (``twisted[tls]>=24.3,<27``): a real Connection of
    the installed Twisted has every attribute ``send`` reads, with the meaning it assumes (a Twisted
    that renamed one would make ``send`` skip its queue check, or fail)."""
    conn = Connection(_Unconnected(), None, reactor=Clock())
    assert conn.dataBuffer == b"" and conn._tempDataBuffer == []
    assert not conn.disconnecting and conn._aborting is False
    assert isinstance(conn.socket, _Unconnected) and hasattr(conn, "connected")
    conn.connected = 1
    conn.startWriting = lambda: None  # type: ignore[method-assign]  # no reactor to watch the socket
    conn.write(b"queued")  # Twisted's own write queues in the buffer send checks first
    assert conn._tempDataBuffer == [b"queued"]
