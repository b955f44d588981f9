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


class _Poller:
    """Stands in for the epoll object: the events of one turn, and the arguments it was asked with."""

    def __init__(self, events: list[tuple[int, int]]) -> None:
        self.events = events
        self.asked: list[tuple[float, int]] = []

    def poll(self, timeout: float, most: int) -> list[tuple[int, int]]:
        self.asked.append((timeout, most))
        return self.events


class _Selectable:
    def __init__(self, name: str, fails: bool = False) -> None:
        self.name = name
        self.fails = fails

    def logPrefix(self) -> str:  # noqa: N802 - Twisted's name
        return self.name


def _epoll_reactor(events: list[tuple[int, int]], selectables: dict[int, Any]) -> tuple[Any, list[Any]]:
    from twisted.internet.epollreactor import EPollReactor

    reactor: Any = EPollReactor.__new__(EPollReactor)  # not started: no waker, no epoll descriptor
    reactor._poller = _Poller(events)
    reactor._selectables = selectables
    handled: list[Any] = []

    def handle(selectable: Any, fd: int, event: int) -> None:
        handled.append((selectable.name, fd, event))
        if selectable.fails:
            raise RuntimeError("escaped")

    reactor._doReadOrWrite = handle
    return reactor, handled


def test_lean_poll_hands_every_ready_descriptor_to_the_reactors_handler_in_order() -> None:
    """The lean turn polls as doPoll does (-1 for no timeout, at most one event per descriptor)
    and passes each known descriptor to ``_doReadOrWrite``; an unknown one is skipped."""
    from routerd.transports import lean_poll

    a, b = _Selectable("a"), _Selectable("b")
    reactor, handled = _epoll_reactor([(5, 1), (9, 4), (7, 1)], {5: a, 7: b})
    assert lean_poll(reactor) is True
    reactor.doIteration(None)
    reactor.doPoll(0.25)
    assert reactor._poller.asked == [(-1, 2), (0.25, 2)]
    assert handled == [("a", 5, 1), ("b", 7, 1)] * 2


def test_lean_poll_logs_an_escaped_exception_with_the_descriptors_prefix_and_goes_on() -> None:
    """What ``callWithLogger`` did for an exception escaping a descriptor's handling: logged (as a
    legacy error with the descriptor's log prefix as its system), and the turn goes on."""
    from twisted.python import log as legacy_log

    from routerd.transports import lean_poll

    bad, good = _Selectable("BadProtocol,3,127.0.0.1", fails=True), _Selectable("good")
    reactor, handled = _epoll_reactor([(3, 1), (4, 1)], {3: bad, 4: good})
    lean_poll(reactor)
    seen: list[dict[str, Any]] = []
    legacy_log.addObserver(seen.append)
    try:
        reactor.doIteration(0)
    finally:
        legacy_log.removeObserver(seen.append)
    assert [name for name, _fd, _event in handled] == ["BadProtocol,3,127.0.0.1", "good"]
    errors = [event for event in seen if event.get("isError")]
    assert len(errors) == 1 and errors[0]["system"] == "BadProtocol,3,127.0.0.1"
    assert "escaped" in str(errors[0]["failure"].value)


def test_lean_poll_leaves_other_reactors_alone() -> None:
    from routerd.transports import lean_poll

    clock = Clock()
    assert lean_poll(clock) is False
    assert not hasattr(clock, "doIteration")


def test_the_epoll_reactor_internals_lean_poll_reads_are_those_of_the_pinned_twisted() -> None:
    from twisted.internet.epollreactor import EPollReactor

    reactor = EPollReactor()
    try:
        assert hasattr(reactor, "_poller") and isinstance(reactor._selectables, dict)
        assert callable(reactor._doReadOrWrite) and callable(reactor.doPoll)
    finally:
        reactor._poller.close()
        for reader in list(reactor.getReaders()):
            reader.connectionLost(None)
