"""Writing to a TCP connection at once when nothing is queued on it.

``ITransport.write`` in Twisted only queues: it asks the reactor to watch the socket for writing
(one ``epoll_ctl``), sends on the next loop iteration, then stops watching (another).  On the hot
path every answer and every backend request paid that round.  :func:`send` writes straight to the
socket when the transport has nothing queued (so bytes keep their order), as asyncio's transports
do, and queues only what the kernel did not take; anything but a plain TCP connection (TLS, test
transports), or a connection closing, goes through ``write`` as before.

Fenced here: this is the only module that reaches into a Twisted transport.  What it
measured: profiled under ``wrk``, every ``write`` on the hot path cost two
``epoll_ctl`` calls and a reactor loop turn before its bytes left; :func:`send` takes both away
when the kernel takes the bytes at once (the common case for an answer or a backend request).
What it relies on of ``twisted.internet.tcp.Connection`` beyond its documented API:
``dataBuffer`` and ``_tempDataBuffer`` (nothing queued), ``socket``, ``connected``,
``disconnecting`` and ``_aborting`` — pinned in ``pyproject.toml`` (``twisted[tls]>=24.3,<27``,
tested with 26.10), checked by ``tests/unit/test_transports.py``.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.tcp import Client, Connection, Server

_TCP: frozenset[type[Any]] = frozenset({Server, Client})


def send(transport: Any, data: bytes) -> None:
    """Write ``data`` to ``transport``: sent now when it can be, queued otherwise."""
    # a server's or client's TCP connection known by its class without isinstance, and
    # ``_aborting`` read as the class attribute every Connection has, not by getattr: 2 calls
    # a send fewer, 2 sends a request (trees.py --profile)
    if (transport.__class__ in _TCP or isinstance(transport, Connection)) and not transport.dataBuffer \
            and not transport._tempDataBuffer and transport.connected and not transport.disconnecting \
            and not transport._aborting:  # aborted: nothing more may go out
        try:
            sent = transport.socket.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            sent = 0  # the transport's own write finds and reports the failure
        if sent == len(data):
            return
        data = data[sent:]
    transport.write(data)


#: Bodies shorter than this go out joined to their head (one copy, one send).
JOIN_BELOW = 64 * 1024


def send_with_head(transport: Any, head: bytes, body: bytes) -> None:
    """:func:`send` a message's head and body: joined when the body is small (one segment), else
    one after the other (no copy of a large body)."""
    if len(body) < JOIN_BELOW:
        send(transport, head + body)
    else:
        send(transport, head)
        send(transport, body)


def no_delay(transport: Any) -> None:
    """Turn off Nagle's algorithm on a TCP transport (others are left alone): a streamed answer's
    chunks go out as written instead of waiting for the peer's ACK of the one before."""
    set_no_delay = getattr(transport, "setTcpNoDelay", None)
    if set_no_delay is not None:
        try:
            set_no_delay(True)
        except OSError:
            pass  # not a TCP socket after all (a UNIX socket or a test transport)
