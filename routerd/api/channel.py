"""The node's HTTP/1.1 server protocol: a lean channel for the inference paths (issue 14).

twisted.web builds a ``Request`` (two ``Headers`` objects, a body buffer, producer and timeout
plumbing, a ``Deferred`` per ``notifyFinish``) for every request, and its line-by-line parser runs in
Python per header; on the hot path that cost as much as routerd's own work.  :class:`LeanChannel`
serves the requests it fully understands itself and hands everything else to twisted.web.

What it serves: ``POST <inference path> HTTP/1.1`` (see :class:`~routerd.api.dispatch.LeanRoutes`)
with a ``Content-Length`` body within the site's body limit and buffer budget, on a node that is
``ready``, without ``Transfer-Encoding``, ``Expect``, ``Upgrade`` or ``Origin`` (CORS).  The head is
split with ``bytes`` methods (C) and each header line checked against RFC 9110's token grammar;
the caller is admitted by the same guard as twisted.web's path (:meth:`GuardResource.admit`), the
handler gets the request's facts and a :class:`LeanReply`, and the answer goes out as one write
(``Content-Length``) or, once the handler streams, chunked.  Pipelined requests wait in the buffer
until the answer before them is finished; a client that disconnects cancels the handler.

Anything else — another path or method, HTTP/1.0, an odd or oversized head, a malformed header,
CORS, a node starting or draining, a body over the limit — is handed over, with every byte of the
connection from the start of that request on, to a twisted.web ``HTTPChannel`` of the node's site,
which serves the rest of the connection (errors, 413s, 503s and all other routes answered there as
before).  The hand-over happens only between requests, so the two never share a request.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

from twisted.internet import protocol
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IAddress
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.http import RESPONSES, datetimeToString

from routerd.api.dispatch import LeanHandler, LeanRoutes
from routerd.api.errors import INTERNAL_ERROR, reply_error, reply_failure
from routerd.api.site import GuardResource, NodeSite, access_logged, log_access
from routerd.logs import request_model
from routerd.routing.call import Incoming
from routerd.transports import no_delay, send, send_with_head

log = Logger()

#: A head longer than this is twisted.web's to refuse.
HEAD_LIMIT = 16 * 1024
#: How often idle connections are looked for (seconds).
_REAP_EVERY = 60.0
#: Bytes buffered behind a request in flight before the connection stops reading.
_PIPELINE_LIMIT = 64 * 1024
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
#: Request headers whose presence sends the request to twisted.web.
_HANDED_OVER = frozenset({b"transfer-encoding", b"expect", b"upgrade", b"origin"})
_CRLF = b"\r\n"
#: Request headers the access line reads after routing.
_ACCESS_HEADERS = ("x-routerd-model", "content-type")
_NO_HEADERS: dict[str, str] = {}


class NodeServerFactory(protocol.Factory):
    """Builds a :class:`LeanChannel` per connection and tracks the open ones (``protocols``: a stop
    closes them)."""

    def __init__(self, site: NodeSite, phase: Callable[[], str]) -> None:
        self.site = site
        self.phase = phase
        guard = site.resource
        assert isinstance(guard, GuardResource)
        self.guard = guard
        self.routes: LeanRoutes = guard.inner.lean  # type: ignore[attr-defined]
        self.protocols: set[LeanChannel] = set()
        self._date_second = -1
        self._date = b""
        self._reaper: Any = None

    def buildProtocol(self, addr: IAddress | None) -> LeanChannel:  # noqa: N802 - Twisted's name
        return LeanChannel(self, addr)

    def startFactory(self) -> None:  # noqa: N802 - Twisted's name
        self.site.doStart()  # type: ignore[no-untyped-call]
        if self.site.timeOut and self._reaper is None:
            self._reaper = self.site.reactor.callLater(_REAP_EVERY, self._reap)

    def stopFactory(self) -> None:  # noqa: N802 - Twisted's name
        reaper, self._reaper = self._reaper, None
        if reaper is not None and reaper.active():
            reaper.cancel()
        self.site.doStop()  # type: ignore[no-untyped-call]

    def _reap(self) -> None:
        """Close the connections the lean channel still owns that sat idle (no request in flight)
        longer than the site's ``timeOut``, as twisted.web's channel times out its own."""
        self._reaper = self.site.reactor.callLater(_REAP_EVERY, self._reap)
        limit = self.site.timeOut
        if not limit:
            return
        now = self.seconds()
        for channel in list(self.protocols):
            if channel.idle_since is not None and now - channel.idle_since > limit:
                channel.close()

    def seconds(self) -> float:
        return float(self.site.reactor.seconds())

    def date(self, now: float) -> bytes:
        """The ``Date`` header value, rendered once a second."""
        second = int(now)
        if second != self._date_second:
            self._date_second = second
            self._date = datetimeToString(second)
        return self._date


class _Head:
    """A parsed request head the lean channel serves."""

    __slots__ = ("handler", "method", "path", "query", "headers", "length", "close", "size")

    def __init__(self, handler: LeanHandler, method: str, path: str, query: bytes,
                 headers: dict[str, str], length: int, close: bool, size: int) -> None:
        self.handler = handler
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.length = length
        self.close = close
        self.size = size  # bytes of the head, with its blank line

    def forget_headers(self) -> None:
        """Keep only the header values the access line may read (issue 14: held requests)."""
        headers = self.headers
        kept = {name: headers[name] for name in _ACCESS_HEADERS if name in headers}
        self.headers = kept or _NO_HEADERS


class LeanChannel(protocol.Protocol):
    """One client connection (see the module docstring)."""

    def __init__(self, factory: NodeServerFactory, addr: IAddress | None) -> None:
        self.server = factory
        self.addr = addr
        self._parts: list[bytes] = []  # bytes received and not yet consumed
        self._have = 0
        self._head: _Head | None = None  # parsed head whose body is still arriving
        self._busy: LeanReply | None = None  # the request being answered
        self._inner: Any = None  # the twisted.web channel after a hand-over
        self._paused = False
        self._closing = False
        self._serving = False  # inside _serve_buffered (an answer given at once must not recurse)
        #: since when nothing was received or answered; None while a request is in flight or
        #: once twisted.web's channel (with its own timeout) serves the connection
        self.idle_since: float | None = factory.seconds()

    # -- connection --------------------------------------------------------------

    def connectionMade(self) -> None:  # noqa: N802 - Twisted's name
        self.server.protocols.add(self)
        no_delay(self.transport)

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:  # noqa: N802
        self.server.protocols.discard(self)
        if self._inner is not None:
            self._inner.connectionLost(reason)
        busy, self._busy = self._busy, None
        if busy is not None:
            busy.lost()
        self._parts = []

    def dataReceived(self, data: bytes) -> None:  # noqa: N802 - Twisted's name
        if self._inner is not None:
            self._inner.dataReceived(data)
            return
        self.idle_since = self.server.seconds()
        self._parts.append(data)
        self._have += len(data)
        if self._busy is None:
            self._serve_buffered()
        elif self._have > _PIPELINE_LIMIT and not self._paused:
            self._paused = True
            self.transport.pauseProducing()  # type: ignore[union-attr]

    def close(self) -> None:
        """Close once what was written has gone out."""
        if self.transport is not None:
            self.transport.loseConnection()

    def abort(self) -> None:
        """Drop the connection now."""
        if self.transport is not None:
            self.transport.abortConnection()  # type: ignore[attr-defined]

    # -- requests ----------------------------------------------------------------

    def _buffered(self) -> bytes:
        parts = self._parts
        if len(parts) != 1:
            joined = b"".join(parts)
            self._parts = parts = [joined]
        return parts[0]

    def _serve_buffered(self) -> None:
        """Serve the complete requests in the buffer, one at a time, or hand the connection over."""
        if self._serving:
            return
        self._serving = True
        try:
            self._serve_loop()
        finally:
            self._serving = False

    def _serve_loop(self) -> None:
        while self._busy is None and self._inner is None and self._have and not self._closing:
            head = self._head
            if head is None:
                if self.server.phase() != "ready":
                    self._hand_over()
                    return
                data = self._buffered()
                end = data.find(b"\r\n\r\n", 0, HEAD_LIMIT + 4)
                if end < 0:
                    if self._have > HEAD_LIMIT:
                        self._hand_over()
                    return
                head = self._parse(data, end)
                if head is None:
                    self._hand_over()
                    return
                self._head = head
            if self._have < head.size + head.length:
                return  # the body is still arriving
            data = self._buffered()
            total = head.size + head.length
            body = data[head.size:total]
            rest = data[total:]
            self._parts = [rest] if rest else []
            self._have = len(rest)
            self._head = None
            self._start(head, body)

    def _parse(self, data: bytes, end: int) -> _Head | None:
        """The head ``data[:end]`` if this channel serves it, else None (handed over)."""
        lines = data[:end].split(_CRLF)
        request_line = lines[0].split(b" ")
        if len(request_line) != 3 or request_line[0] != b"POST" or request_line[2] != b"HTTP/1.1":
            return None
        target = request_line[1]
        raw_path, _, query = target.partition(b"?")
        handler = self.server.routes.find(raw_path)
        if handler is None:
            return None
        headers: dict[str, str] = {}
        length: int | None = None
        close = False
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or _TOKEN.fullmatch(name) is None:
                return None
            value = value.strip(b" \t")
            if _BAD_VALUE.search(value) is not None:
                return None
            lower = name.lower()
            if lower in _HANDED_OVER:
                return None
            if lower == b"content-length":
                if length is not None or not value.isdigit():
                    return None
                length = int(value)
            elif lower == b"connection":
                close = b"close" in value.lower()
            key = lower.decode("latin-1")
            if key not in headers:
                headers[key] = value.decode("latin-1")
        length = length or 0
        site = self.server.site
        if length > site.max_body_bytes or (site.buffer is not None and not site.buffer.fits(length)):
            return None  # twisted.web's LimitedRequest answers 413 / 503
        try:
            path = raw_path.decode("utf-8")
        except UnicodeDecodeError:
            return None
        return _Head(handler, "POST", path, query, headers, length, close, end + 4)

    def _start(self, head: _Head, body: bytes) -> None:
        server = self.server
        reply = LeanReply(self, head, body, server.seconds())
        self._busy = reply
        self.idle_since = None
        budget = server.site.buffer
        if budget is not None and body and budget.take(len(body)):
            reply.held = len(body)
        path = head.path
        try:
            peer = getattr(self.transport.getPeer(), "host", "127.0.0.1")  # type: ignore[union-attr]
            reply.client = peer
            server.guard.admit(path, peer, head.headers.get("x-forwarded-for"),
                               head.headers["authorization"].encode("latin-1")
                               if "authorization" in head.headers else None)
            query = parse_qs(head.query.decode("utf-8", "replace"), keep_blank_values=True) \
                if head.query else {}
            facts = Incoming(path=path, body=body, content_type=head.headers.get("content-type", ""),
                             query=query, headers=head.headers)
            result = head.handler(head.method, path, facts, reply)
        except Exception:  # noqa: BLE001 - answered by the one error handler
            reply.failed(Failure())
            return
        finally:
            head.forget_headers()  # routing has read them; a held request keeps two values
        if isinstance(result, Deferred):
            reply.pending = result
            result.addCallbacks(reply.finish, reply.failed)
        else:
            reply.finish(result)

    def answered(self, reply: LeanReply) -> None:
        """``reply`` is complete: the next request may be served."""
        if self._busy is not reply:
            return
        self._busy = None
        self.idle_since = self.server.seconds()
        if reply.head.close:
            self._closing = True
            self.transport.loseConnection()  # type: ignore[union-attr]
            return
        if self._paused:
            self._paused = False
            self.transport.resumeProducing()  # type: ignore[union-attr]
        if self._have:
            self._serve_buffered()

    def _hand_over(self) -> None:
        """From here on twisted.web's channel serves this connection, from the buffered bytes."""
        data = b"".join(self._parts)
        self._parts, self._have, self._head = [], 0, None
        if self._paused:
            self._paused = False
            self.transport.resumeProducing()  # type: ignore[union-attr]
        inner = self.server.site.buildProtocol(self.addr)  # type: ignore[no-untyped-call]
        self._inner = inner
        self.idle_since = None
        inner.makeConnection(self.transport)
        if data:
            inner.dataReceived(data)


class LeanReply:
    """A :class:`~routerd.routing.call.Reply` written straight to the connection."""

    __slots__ = ("channel", "head", "body", "started_at", "status", "headers", "started", "gone",
                 "finished", "sent", "held", "client", "pending", "model")

    def __init__(self, channel: LeanChannel, head: _Head, body: bytes, now: float) -> None:
        self.channel = channel
        self.head = head
        self.body = body  # kept for the access line's model only while the request lives
        self.started_at = now
        self.status = 200
        self.headers: dict[bytes, tuple[bytes, bytes]] = {}
        self.started = False
        self.gone = False
        self.finished = False
        self.sent = 0
        self.held = 0  # bytes taken from the site's buffer budget
        self.client = "-"
        self.pending: Deferred[Any] | None = None
        self.model: str | None = None  # named by routing (else the access line reads the body)

    # -- Reply -------------------------------------------------------------------

    def set_status(self, code: int) -> None:
        if not self.started:
            self.status = code

    def set_header(self, name: bytes, value: bytes) -> None:
        if b"\r" in value or b"\n" in value:
            value = value.replace(b"\r", b" ").replace(b"\n", b" ")
        self.headers[name.lower()] = (name, value)

    def write(self, data: bytes) -> None:
        if self.gone or self.finished or not data:
            return
        transport = self.channel.transport
        assert transport is not None
        chunk = b"%x\r\n%b\r\n" % (len(data), data)
        if not self.started:
            self.started = True
            send(transport, self._head_bytes(None) + chunk)  # the first chunk goes out at once
        else:
            # later chunks are queued: those written in one reactor turn leave in one send
            transport.write(chunk)
        self.sent += len(data)

    def abort(self) -> None:
        """End the answer incomplete: the connection is dropped and nothing more is written (not
        even the last chunk the handler's return would add)."""
        self.gone = True
        self._release()
        transport = self.channel.transport
        if transport is not None:
            transport.abortConnection()  # type: ignore[attr-defined]

    def name_model(self, name: str) -> None:
        self.model = name
        self.body = b""  # the access line no longer needs it

    # -- completion ----------------------------------------------------------------

    def finish(self, body: bytes) -> None:
        """The handler's final bytes: the answer is complete."""
        if self.gone or self.finished:
            return
        self.finished = True
        transport = self.channel.transport
        assert transport is not None
        if not self.started:
            self.started = True
            send_with_head(transport, self._head_bytes(len(body)), body)
        elif body:
            send(transport, b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body))
        else:
            send(transport, b"0\r\n\r\n")
        self.sent += len(body)
        self._release()
        if access_logged():
            self._log()
        self.channel.answered(self)

    def failed(self, failure: Failure) -> None:
        if self.gone or self.finished:
            if not failure.check(CancelledError):
                log.failure("unhandled error after the request finished", failure=failure)
            return
        if self.started:
            log.failure("error after the answer to {path} started", failure=failure, path=self.head.path)
            self.finished = True
            self.abort()
            return
        try:
            body = reply_failure(self, self.head.path, failure)
        except Exception:  # noqa: BLE001 - never leave the request open
            log.failure("error handler failed")
            body = reply_error(self, self.head.path, INTERNAL_ERROR)
        self.finish(body)

    def lost(self) -> None:
        """The client went away before the answer was complete."""
        if self.finished:
            return
        self.gone = True
        self._release()
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.cancel()

    def _release(self) -> None:
        held, self.held = self.held, 0
        budget = self.channel.server.site.buffer
        if held and budget is not None:
            budget.give(held)

    def _head_bytes(self, length: int | None) -> bytes:
        status = self.status
        out = [b"HTTP/1.1 %d %s\r\n" % (status, RESPONSES.get(status, b"Unknown"))]
        headers = self.headers
        for name, value in headers.values():
            out += (name, b": ", value, _CRLF)
        if b"content-type" not in headers:
            out.append(b"content-type: application/json\r\n")
        if length is None:
            out.append(b"transfer-encoding: chunked\r\n")
        else:
            out.append(b"content-length: %d\r\n" % length)
        if self.head.close:
            out.append(b"connection: close\r\n")
        server = self.channel.server
        out += (b"date: ", server.date(server.seconds()), b"\r\n\r\n")
        return b"".join(out)

    def _log(self) -> None:
        head = self.head
        headers = head.headers
        model = self.model
        if model is None:
            query_model = None
            if head.query:
                values = parse_qs(head.query.decode("utf-8", "replace")).get("model")
                query_model = values[0] if values else None
            model = request_model(query_model, headers.get("x-routerd-model"),
                                  headers.get("content-type", ""), self.body)
            self.body = b""
        out = self.headers
        log_access(method=head.method, path=head.path, status=self.status, bytes=self.sent,
                   ms=round((self.channel.server.seconds() - self.started_at) * 1000), model=model,
                   node=_out(out, b"x-routerd-node"), lent_to=_out(out, b"x-routerd-lent-to"),
                   request_id=_out(out, b"x-routerd-request-id"), client=self.client)


def _out(headers: dict[bytes, tuple[bytes, bytes]], name: bytes) -> str:
    entry = headers.get(name)
    return entry[1].decode("utf-8", "replace") if entry is not None else "-"

