"""``routerd.transports.send`` after ``abortConnection``: nothing more reaches the socket, so a
stream cut off mid-answer is never completed by a late last chunk."""

from __future__ import annotations

from routerd.transports import send
from tests.unit.test_transports import FakeSocket, connection


def test_nothing_is_sent_straight_to_the_socket_of_an_aborted_connection() -> None:
    sock = FakeSocket()
    conn = connection(sock)
    conn._aborting = True  # what tcp.Connection.abortConnection sets until the loss is delivered
    send(conn, b"0\r\n\r\n")
    assert sock.sent == []
    assert conn.written == [b"0\r\n\r\n"]  # handed to Twisted's write, which drops it when aborting
