"""The node's HTTP/1.1 server protocol: a lean channel for the inference paths, under the same
rules as twisted.web's.

twisted.web builds a ``Request`` (two ``Headers`` objects, a body buffer, producer and timeout
plumbing, a ``Deferred`` per ``notifyFinish``) for every request, and its line-by-line parser runs in
Python per header; on the hot path that cost as much as routerd's own work.  :class:`LeanChannel`
serves the requests it fully understands itself and hands everything else to twisted.web.

Every connection starts here.  A head is split with ``bytes`` methods (C) into the request line and
field lines, and given to the shared :func:`~routerd.api.head.build_head` (the message rules: a
malformed or oversized head, a repeated singleton field, a missing ``Host``… is refused here as
twisted.web's channel would refuse it).  What it serves itself: ``POST <inference path> HTTP/1.1``
(see :class:`~routerd.api.dispatch.LeanRoutes`) with a ``Content-Length`` body (or none), without
``Transfer-Encoding``, ``Expect``, ``Upgrade`` or ``Origin``.  For those it asks the shared
:func:`~routerd.api.admission.decide` as soon as the head is complete: a refusal is written by the
shared :func:`~routerd.api.access.refusal` with ``Connection: close`` and no byte of its body is
kept; an admitted request reserves its ``Content-Length`` from the replay budget at once and gives
it back exactly once.  The handler gets the request's facts and a
:class:`~routerd.api.lean_reply.LeanReply`, which writes the answer (see there).  Pipelined requests
wait in the buffer until the answer before them is finished *and* the client has read it (the
channel is the transport's producer: while its output is backed up nothing more is read or served);
a client that disconnects cancels the handler.

Anything else (another path or method, HTTP/1.0, chunked bodies, CORS, a request line that is not
three words) is handed over, with every byte of the connection from the start of that request
on, to :class:`~routerd.api.site.NodeHTTPChannel`, which applies the same head rules and the same
admission and serves the rest of the connection.  The hand-over happens only between requests.

Deadlines (one reaper per node for both edges, :meth:`NodeServerFactory.reap`) are those of
:mod:`routerd.api.deadlines`; who may hold a connection is decided at accept (:mod:`~routerd.api.accept`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple
from urllib.parse import parse_qs

from twisted.internet import protocol
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionAborted
from twisted.internet.interfaces import IAddress
from twisted.python.failure import Failure
from twisted.web.http import datetimeToString

from routerd.api.accept import ConnectionBook, Refused, accept
from routerd.api.access import refusal
from routerd.api.admission import Verdict
from routerd.api.deadlines import body_deadline, due
from routerd.api.dispatch import LeanHandler, LeanRoutes
from routerd.api.head import MAX_HEAD_BYTES, RequestHead, clean_head, head_of_lines
from routerd.api.lean_reply import LeanReply
from routerd.api.site import GuardResource, NodeHTTPChannel, NodeSite, log_refusal
from routerd.config.schema import ServerConfig
from routerd.errors import ErrorStyle, StatusError
from routerd.routing.call import Incoming
from routerd.transports import no_delay

#: A head longer than this is refused (431, by twisted.web's channel after the hand-over).
HEAD_LIMIT = MAX_HEAD_BYTES
#: How often the reaper looks at every connection's deadline (seconds).
REAP_EVERY = 1.0
#: A connection that has sent nothing for this long (seconds) is closed first when the node is at
#: ``server.max_connections`` (a fresh one has not had the time to).
EVICT_SILENT_AFTER = 2.0
#: Bytes buffered behind a request in flight before the connection stops reading.
_PIPELINE_LIMIT = 64 * 1024
#: Request fields whose presence sends the request to twisted.web.
_HANDED_OVER = frozenset({"transfer-encoding", "expect", "upgrade", "origin"})
_CRLF = b"\r\n"
#: Request fields the access line reads after routing.
_ACCESS_FIELDS = ("x-routerd-model", "content-type")


class NodeServerFactory(protocol.Factory):
    """Builds a :class:`LeanChannel` per connection, tracks the open ones (``protocols``: a stop
    closes them) and runs the deadlines of all of them (:meth:`reap`)."""

    def __init__(self, site: NodeSite, phase: Callable[[], str]) -> None:
        self.site = site
        self.phase = phase
        guard = site.resource
        assert isinstance(guard, GuardResource)
        self.guard = guard
        self.routes: LeanRoutes = guard.inner.lean  # type: ignore[attr-defined]
        self.protocols: set[LeanChannel] = set()
        self.book = ConnectionBook()  # what the accept-time rules count
        self._date_second = -1
        self._date = b""
        self._reaper: Any = None

    def give_back(self, size: int, holder: str = "", arriving: bool = False) -> None:
        """Give ``size`` bytes ``holder`` held (for a body still ``arriving`` or not) back to the
        site's replay budget (if the node keeps one)."""
        budget = self.site.buffer
        if budget is not None:
            budget.give(size, holder, arriving)

    @property
    def limits(self) -> ServerConfig:
        limits: ServerConfig = self.guard.limits
        return limits

    def buildProtocol(self, addr: IAddress | None) -> protocol.Protocol:  # noqa: N802 - Twisted's name
        """The accept-time rules (:func:`~routerd.api.accept.accept`): a foreign connection is
        served uncounted, one over a limit refused, and at the limit the oldest connection that
        has sent nothing is closed to make room."""
        limits = self.limits
        peer = getattr(addr, "host", None)
        silent = self._silent() if self.book.counted >= limits.max_connections else None
        verdict = accept(self.book, limits, self.guard.policy, peer, silent is not None)
        if isinstance(verdict, StatusError):
            return Refused(self.date(self.seconds()), self.guard.route_facts("/").errors, verdict)
        if verdict == "evict" and silent is not None:
            silent.abort()
            silent.connectionLost(Failure(ConnectionAborted()))  # its slot is free now, not at the next turn
        return LeanChannel(self, addr, peer or "", verdict == "foreign")

    def _silent(self) -> LeanChannel | None:
        """The oldest counted connection that has sent nothing for ``EVICT_SILENT_AFTER`` seconds."""
        oldest = self.seconds() - EVICT_SILENT_AFTER
        found: LeanChannel | None = None
        for channel in self.protocols:
            if not channel.heard and not channel.foreign and channel.opened_at <= oldest \
                    and (found is None or channel.opened_at < found.opened_at):
                found = channel
        return found

    def startFactory(self) -> None:  # noqa: N802 - Twisted's name
        self.site.doStart()  # type: ignore[no-untyped-call]
        if self._reaper is None:
            self._reaper = self.site.reactor.callLater(REAP_EVERY, self.reap)

    def stopFactory(self) -> None:  # noqa: N802 - Twisted's name
        reaper, self._reaper = self._reaper, None
        if reaper is not None and reaper.active():
            reaper.cancel()
        self.site.doStop()  # type: ignore[no-untyped-call]

    def reap(self) -> None:
        """Every connection's deadline (see the module docstring), once a second: one pass over
        the open connections instead of a timer per request."""
        self._reaper = self.site.reactor.callLater(REAP_EVERY, self.reap)
        now = self.seconds()
        limits = self.limits
        idle = self.site.timeOut
        for channel in list(self.protocols):
            action = due(limits, idle, now, *channel.deadline(), channel.foreign and not channel.heard)
            if action == "abort":
                channel.abort()
            elif action == "close":
                channel.close()
            elif action is not None:
                channel.expire(action)

    def seconds(self) -> float:
        return float(self.site.reactor.seconds())

    def date(self, now: float) -> bytes:
        """The ``Date`` header value, rendered once a second."""
        second = int(now)
        if second != self._date_second:
            self._date_second = second
            self._date = datetimeToString(second)
        return self._date


class _Head(NamedTuple):
    """A head the lean channel serves: the shared :class:`RequestHead`, its handler and admission's
    verdict (a named tuple, built in one C call: seven fields set one by one were ~30 opcodes, ops.py)."""

    handler: LeanHandler
    request: RequestHead
    size: int  # bytes of the head, with its blank line
    total: int  # bytes of the head and its body
    client: str
    verdict: Verdict  # the admitting key's name and class, the route's error family


class LeanChannel(protocol.Protocol):
    """One client connection (see the module docstring)."""

    def __init__(self, factory: NodeServerFactory, addr: IAddress | None, peer: str = "",
                 foreign: bool = False) -> None:
        self.server = factory
        self.addr = addr
        self.peer = peer
        #: from outside ``server.allowed_cidrs``: not counted, a head due ``head_timeout`` after accept
        self.foreign = foreign
        self.heard = False  # a byte has arrived
        self._parts: list[bytes] = []  # bytes received and not yet consumed
        self._have = 0
        self._head: _Head | None = None  # admitted head whose body is still arriving
        self._reserved = 0  # budget bytes the arriving body holds
        self._holder = ""  # who they are counted to (admission's verdict)
        self._busy: LeanReply | None = None  # the request being answered
        self._inner: NodeHTTPChannel | None = None  # the twisted.web channel after a hand-over
        self._paused = False  # reading stopped by this channel
        self._write_blocked = False  # the transport's output is backed up
        self._blocked_at: float | None = None  # since when (None: it is not)
        self._body_by = 0.0  # when the arriving body must be complete (server.min_body_rate)
        self._closing = False
        self._serving = False  # inside _serve_buffered (an answer given at once must not recurse)
        self._client = ""  # the peer's address (read at the first request)
        #: the deadline that applies (see NodeServerFactory.reap) and since when: a connection
        #: that has sent nothing yet is idle; a head's deadline runs from its first byte
        self.state = "idle"
        self.since = self.opened_at = factory.seconds()

    # -- connection --------------------------------------------------------------

    def connectionMade(self) -> None:  # noqa: N802 - Twisted's name
        self.server.protocols.add(self)
        self.server.book.opened(self.peer, self.foreign)
        no_delay(self.transport)
        self.transport.registerProducer(self, True)  # type: ignore[union-attr]

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:  # noqa: N802
        if self not in self.server.protocols:
            return  # already lost (a silent connection closed to make room)
        self.server.protocols.discard(self)
        self.server.book.closed(self.peer, self.foreign)
        if self._inner is not None:
            self._inner.connectionLost(reason)  # type: ignore[no-untyped-call]
        busy, self._busy = self._busy, None
        if busy is not None:
            busy.lost()
        self._release_reserved()
        self._parts = []

    def dataReceived(self, data: bytes) -> None:  # noqa: N802 - Twisted's name
        self.heard = True
        if self._inner is not None:
            self._inner.dataReceived(data)
            return
        if self._closing:
            return  # a refused request's body, or bytes after Connection: close
        now = self.server.seconds()  # read once for what this data starts (it was read 5 times a request)
        if self.state == "idle":
            self.state, self.since = "head", now
        elif self.state == "body":
            self.since = now
        self._parts.append(data)
        self._have += len(data)
        if self._busy is None and not self._write_blocked:
            self._serve_buffered(now)
        elif self._have > _PIPELINE_LIMIT and not self._paused:
            self._paused = True
            self.transport.pauseProducing()  # type: ignore[union-attr]

    # -- the transport's producer (its output backed up, or drained) -------------

    def pauseProducing(self) -> None:  # noqa: N802 - Twisted's name
        if not self._write_blocked:
            self._write_blocked = True
            self._blocked_at = self.server.seconds()
            if self.state == "busy":
                self.since = self.server.seconds()
            if not self._paused:
                self._paused = True
                self.transport.pauseProducing()  # type: ignore[union-attr]

    def resumeProducing(self) -> None:  # noqa: N802 - Twisted's name
        if self._write_blocked:
            self._write_blocked = False
            self._blocked_at = None
            self._resume_reading()
            if self._busy is None and self._have:
                self._serve_buffered()

    def stopProducing(self) -> None:  # noqa: N802 - Twisted's name
        pass  # the connection is going: connectionLost follows

    def _resume_reading(self) -> None:
        if self._paused and not self._write_blocked and self._have <= _PIPELINE_LIMIT:
            self._paused = False
            self.transport.resumeProducing()  # type: ignore[union-attr]

    def deadline(self) -> tuple[str, float, float | None, float]:
        """(state, since, since when its output is backed up or None, when the arriving body must
        be complete or 0.0) for the reaper; a handed-over connection's come from twisted.web's
        channel."""
        inner = self._inner
        if inner is not None:
            return inner.state, inner.since, inner.blocked_at, inner.body_by
        return self.state, self.since, self._blocked_at, self._body_by

    def expire(self, err: StatusError) -> None:
        """A head or body deadline passed: 408 and close."""
        inner = self._inner
        if inner is not None:
            inner.refuse(err)
            return
        head = self._head
        self._head = None
        self._release_reserved()
        self._refuse(err, (), head.request if head is not None else None, linger=False)

    def close(self, linger: bool = False) -> None:
        """Close once what was written has gone out (the reaper aborts it if that never happens).

        ``linger``: only the sending side is closed and what still arrives is read and dropped
        until the client closes (an answer before the body: a close with the body unread would
        reset the connection, and a proxy still sending it would lose the answer and say 502)."""
        if self.transport is not None:
            # the state the reaper reads: twisted.web's channel's after a hand-over
            holder: Any = self._inner if self._inner is not None else self
            if holder.state != "closing":
                holder.state, holder.since = "closing", self.server.seconds()
            self._closing = True
            lose_write = getattr(self.transport, "loseWriteConnection", None) if linger else None
            (lose_write or self.transport.loseConnection)()

    def abort(self) -> None:
        """Drop the connection now."""
        if self.transport is not None:
            self.transport.abortConnection()  # type: ignore[attr-defined]

    def between_requests(self) -> bool:
        """Whether nothing is under way here: the connection has spoken and waits for its next
        request.  A stop closes these at once; one that has sent nothing yet may have its first
        request on the way (connected just before the listener closed), one mid-request is being
        answered."""
        return self.heard and self.deadline()[0] == "idle"

    # -- requests ----------------------------------------------------------------

    def _buffered(self) -> bytes:
        parts = self._parts
        try:  # one part, as a small request arrives: no len() call
            [data] = parts
        except ValueError:
            data = b"".join(parts)
            self._parts = [data]
        return data

    def _serve_buffered(self, now: float | None = None) -> None:
        """Serve the complete requests in the buffer, one at a time, or hand the connection over
        (``now``: the clock, when the caller has read it)."""
        if self._serving:
            return
        self._serving = True
        if now is None:
            now = self.server.seconds()
        try:
            while self._busy is None and self._inner is None and self._have and not self._closing \
                    and not self._write_blocked:
                head = self._head
                if head is None:
                    data = self._buffered()
                    end = data.find(b"\r\n\r\n", 0, HEAD_LIMIT + 4)
                    if end < 0:
                        if self._have > HEAD_LIMIT:
                            self._hand_over()
                        return
                    head = self._admit(data, end)
                    if head is None:
                        return  # refused or handed over
                    if self._have < head.total:  # the body is still arriving: its deadlines run from now
                        # (one that came with its head is served at once: no deadline, no second join; ops.py)
                        self._head, self.state, self.since = head, "body", now
                        self._body_by = body_deadline(self.server.limits, now, head.request.length or 0)
                        return
                else:
                    if self._have < head.total:
                        return  # the body is still arriving
                    self._head = None
                    if self._reserved and self.server.site.buffer is not None:
                        self.server.site.buffer.arrived(self._holder)  # whole now: no longer arriving
                    data = self._buffered()
                body = data[head.size:head.total]
                rest = data[head.total:]
                self._parts = [rest] if rest else []
                self._have -= head.total  # len(rest)
                self._start(head, body, now)
        finally:
            self._serving = False

    def _admit(self, data: bytes, end: int) -> _Head | None:
        """The head ``data[:end]`` if this channel serves it and admission admits it; a refused one
        is answered here, any other is handed over.  None in both cases."""
        line_end = data.find(_CRLF, 0, end)
        if line_end < 0:
            line_end = end  # no field lines
        try:  # three words (no len() call), else twisted.web's channel serves it
            method, target, version = data[:line_end].split(b" ")
        except ValueError:
            self._hand_over()
            return None
        try:  # a clean head in a few calls (clean_head), any other line by line (build_head)
            request = clean_head(method, target, version, end, data[line_end + 2:end + 2]) \
                or head_of_lines(method, target, version, data[:end].split(_CRLF)[1:])
        except StatusError as err:
            self._refuse(err, (), None, method, target)
            return None
        handler = self.server.routes.find(target.partition(b"?")[0]) \
            if method == b"POST" and version == b"HTTP/1.1" else None
        if handler is None or not _HANDED_OVER.isdisjoint(request.fields):
            self._hand_over()
            return None
        client = self._client
        if not client:  # the peer's address, read once a connection
            client = self._client = getattr(self.transport.getPeer(), "host", "127.0.0.1")  # type: ignore[union-attr]
        verdict = self.server.guard.decide(request, client)
        if verdict.error is not None:
            self._refuse(verdict.error, verdict.headers, request, family=verdict.errors,
                         client=verdict.client)
            return None
        total = end + 4 + (request.length or 0)
        if verdict.reserve:
            budget = self.server.site.buffer
            # a body that came with its head is whole: not arriving, no arrived() follows (-32 ops.py)
            if budget is not None and budget.take(verdict.reserve, verdict.holder, self._have < total):
                self._reserved, self._holder = verdict.reserve, verdict.holder
        return _Head(handler, request, end + 4, total, verdict.client or client, verdict)

    def _refuse(self, err: StatusError, headers: tuple[tuple[bytes, bytes], ...],
                request: RequestHead | None, method: bytes = b"-", target: bytes = b"-",
                family: ErrorStyle | None = None, linger: bool = True, client: str = "") -> None:
        """Answer ``err`` before the body and close (nothing more of the connection is served), in
        the route's error ``family`` (by default the one the facts of its path give); a request
        that declared a body lingers (:meth:`close`) unless ``linger`` is False (a deadline); the
        access line names ``client`` (admission's), by default the peer."""
        server = self.server
        path = request.path if request is not None else target.partition(b"?")[0].decode("latin-1")
        assert self.transport is not None
        if family is None:
            family = server.guard.route_facts(path).errors
        self.transport.write(refusal(err, family, headers, server.date(server.seconds())))
        log_refusal(request.method if request is not None else method.decode("latin-1"), path, err.status,
                    client or getattr(self.transport.getPeer(), "host", "-"), request)
        self._parts, self._have = [], 0
        self.close(linger=linger and request is not None and bool(request.length or request.chunked))

    def _release_reserved(self) -> None:
        reserved, self._reserved = self._reserved, 0
        if reserved:
            self.server.give_back(reserved, self._holder, arriving=True)

    def _start(self, head: _Head, body: bytes, now: float) -> None:
        reply = LeanReply(self, head.request, head.client, head.verdict.errors, body, now)
        reply.held, reply.holder, self._reserved = self._reserved, self._holder, 0
        self._busy = reply
        self.state, self.since = "busy", now
        request = head.request
        # one shared string per lean route's path (RequestHead interns it), kept by routing too
        path = request.path
        fields = request.fields
        try:
            query = parse_qs(request.query.decode("ascii"), keep_blank_values=True) if request.query else {}
            facts = Incoming(path=path, body=body,
                             content_type=fields["content-type"] if "content-type" in fields else "",
                             query=query, headers=request.fields, key_name=head.verdict.key_name,
                             key_class=head.verdict.key_class)
            result = head.handler(request.method, path, facts, reply)
        except Exception:  # noqa: BLE001 - answered by the one error handler
            reply.failed(Failure())
            return
        finally:
            request.keep_only(_ACCESS_FIELDS)  # routing has read them; a held request keeps two values
        if isinstance(result, Deferred):
            reply.pending = result
            result.addBoth(reply.settle)  # one bound method kept while held, not two
        else:
            reply.finish(result)

    def answered(self, reply: LeanReply, now: float | None = None) -> None:
        """``reply`` is complete: the next request may be served (once its output has drained).
        ``now``: the clock, when the reply has read it."""
        if self._busy is not reply:
            return
        self._busy = None
        if now is None:
            now = self.server.seconds()
        self.state, self.since = "idle", now
        if reply.request.close:
            self.close()
            return
        self._resume_reading()
        if self._have:
            self.state = "head"
            if not self._write_blocked:
                self._serve_buffered(now)

    def _hand_over(self) -> None:
        """From here on twisted.web's channel serves this connection, from the buffered bytes."""
        data = b"".join(self._parts)
        self._parts, self._have, self._head = [], 0, None
        transport = self.transport
        assert transport is not None
        transport.unregisterProducer()  # type: ignore[attr-defined]  # twisted.web's registers itself
        self._write_blocked, self._blocked_at = False, None
        if self._paused:
            self._paused = False
            transport.resumeProducing()  # type: ignore[attr-defined]
        inner = self.server.site.buildProtocol(self.addr)  # type: ignore[no-untyped-call]
        self._inner = inner
        inner.makeConnection(transport)
        if data:
            inner.dataReceived(data)
