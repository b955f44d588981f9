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

import errno
from functools import partial
from typing import Any

from twisted.internet.tcp import Client, Connection, Server
from twisted.python import log as legacy_log

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


def lean_poll(reactor: Any) -> bool:
    """Let an epoll reactor hand each ready descriptor to its handler without wrapping the call in
    the legacy log context; True when installed (an epoll reactor), False otherwise (left alone).

    Twisted's ``EPollReactor.doPoll`` calls every ready descriptor's handler through
    ``twisted.python.log.callWithLogger``, which asks the descriptor for its log prefix and copies
    and swaps the legacy log context dictionary for the call: 12 Python calls a ready descriptor,
    three descriptors a request at one client (client, backend, the backend's output pipe) and
    eight a 20-chunk stream, about 6 % of a request's calls at one client and 10 % of a stream's
    (``trees.py --profile``).  The context only names the "system" of legacy ``log.msg``/``log.err``
    events raised inside a handler; routerd logs through ``twisted.logger``, whose events carry
    their namespace instead.  :func:`_poll` is ``doPoll`` without that wrapper: the same poll, the
    same ``_doReadOrWrite`` per descriptor (which catches a handler's exception, logs it and drops
    the connection), and an exception escaping that is logged with the descriptor's log prefix as
    ``callWithLogger`` logged it.  Installed on the one reactor instance (``doIteration``, what
    ``mainLoop`` calls each turn); relies on ``_poller``, ``_selectables`` and ``_doReadOrWrite``
    of ``twisted.internet.epollreactor.EPollReactor``, checked by ``tests/unit/test_transports.py``.
    """
    from twisted.internet.epollreactor import EPollReactor

    if not isinstance(reactor, EPollReactor):
        return False
    reactor.doIteration = reactor.doPoll = partial(_poll, reactor)  # type: ignore[method-assign]
    return True


def _poll(reactor: Any, timeout: float | None) -> None:
    """One turn of ``EPollReactor.doPoll``, without the legacy log context (see :func:`lean_poll`)."""
    try:
        events = reactor._poller.poll(-1 if timeout is None else timeout, len(reactor._selectables))
    except OSError as err:
        if err.errno == errno.EINTR:
            return
        raise
    selectables = reactor._selectables
    handle = reactor._doReadOrWrite
    for fd, event in events:
        try:  # a subscript (no call, no None test), a descriptor gone meanwhile skipped as before
            selectable = selectables[fd]
        except KeyError:
            continue
        try:
            handle(selectable, fd, event)
        except KeyboardInterrupt:
            raise
        except BaseException:
            _log_escaped(selectable)


def _log_escaped(selectable: Any) -> None:
    """An exception escaped a descriptor's handling: logged as ``callWithLogger`` logs it."""
    try:
        prefix = selectable.logPrefix()
    except BaseException:  # noqa: BLE001 - as callWithLogger: a broken logPrefix still logs the error
        prefix = "(buggy logPrefix method)"
    legacy_log.err(system=prefix)
