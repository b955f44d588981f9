"""A lean HTTP/1.1 client for this node's own backend processes (loopback, plain HTTP).

Why: ``twisted.web.client.Agent`` costs more CPU per request than everything routerd does
itself (endpoint and pool machinery, per-request ``Deferred`` chains, the state-machine parser of
``_newclient``).  :class:`BackendAgent` keeps what the request path uses of an ``IAgent`` —
``request(method, uri, headers, body_producer)`` firing with a response that has ``code``,
``headers`` and ``deliverBody`` — over persistent keep-alive connections, with the response parsed
by ``httptools`` (C).  Semantics kept from ``Agent``:

* cancelling the request's ``Deferred`` before the answer aborts the connection (first-byte
  timeout, a client gone); ``deliverBody``'s transport ``stopProducing`` aborts it mid-body;
* a body ends with ``ResponseDone``; a close-delimited body with ``PotentialDataLoss``; a
  connection lost mid-body with ``ResponseFailed``;
* a connection is reused only after its answer was read whole and both sides keep it alive;
  a reused connection that dies before any answer byte is retried once on a fresh one (the
  backend closed it while idle and never saw the request).

Anything it does not handle (another scheme, a streaming body producer) goes to ``fallback``.

Three cuts for forwarded requests (the master's own time from the slave's answer to
the send to the client at one client, timed inside the process: 84-88 us before, 69 us after):
an answer's headers are kept as parsed (:class:`AnswerHeaders`, indexed once) instead
of a twisted ``Headers`` that sanitises and re-encodes each one; the request's ``Deferred`` fires
once the whole read is parsed, so a small answer that arrived in one read is complete when its
reader asks for the body (one suspension and resumption of the request's coroutines fewer, no
idle-stream timer armed); and such an answer is taken whole
(:meth:`BackendResponse.body_if_complete`, asked by :func:`routerd.routing.relay.collect`)
without a relay protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httptools
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionDone, ConnectionRefusedError
from twisted.internet.protocol import ClientFactory, Protocol
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone, ResponseFailed
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent
from zope.interface import implementer

from routerd.clients.backend_headers import AnswerHeaders, RequestHeaders, request_lines
from routerd.transports import no_delay, send_with_head

__all__ = ["AnswerHeaders", "BackendAgent", "BackendResponse"]

_DONE = Failure(ResponseDone())
#: Delays before connecting again to a backend that refused the connection (then the refusal fails
#: the request).
REFUSED_BACKOFF_S = (0.02, 0.05, 0.1)


class _BodyTransport:
    """What a body protocol sees as its transport: ``stopProducing`` aborts the answer."""

    __slots__ = ("_connection",)

    def __init__(self, connection: _Connection) -> None:
        self._connection = connection

    def stopProducing(self) -> None:
        self._connection.abort()

    def pauseProducing(self) -> None:
        transport = self._connection.transport
        if transport is not None:
            transport.pauseProducing()  # type: ignore[attr-defined]

    def resumeProducing(self) -> None:
        transport = self._connection.transport
        if transport is not None:
            transport.resumeProducing()  # type: ignore[attr-defined]


class BackendResponse:
    """One answer: status, headers, and its body delivered to one protocol."""

    __slots__ = ("code", "phrase", "headers", "_connection", "_protocol", "_early", "_ended")

    def __init__(self, code: int, headers: AnswerHeaders, connection: _Connection) -> None:
        self.code = code
        self.phrase = b""
        self.headers = headers
        self._connection = connection
        self._protocol: Any = None
        self._early: list[bytes] = []  # body bytes that arrived before deliverBody
        self._ended: Failure | None = None

    @property
    def length(self) -> int | None:
        """The body's ``Content-Length`` (None when it names none)."""
        return self.headers.content_length()

    def deliverBody(self, protocol: Any) -> None:
        self._protocol = protocol
        protocol.makeConnection(_BodyTransport(self._connection))
        early, self._early = self._early, []
        for data in early:
            protocol.dataReceived(data)
        if self._ended is not None:
            ended, self._ended = self._ended, None
            protocol.connectionLost(ended)

    def body_if_complete(self) -> bytes | None:
        """The whole body, taken at once, when it has all arrived and ended cleanly before anyone
        asked for it (a small answer read in one go); None otherwise (then :meth:`deliverBody`).
        :func:`routerd.routing.relay.collect` asks this first: it spares a forwarded answer the
        relay protocol, its tail and its Deferred (~10 us of the master's path to the client at
        one client)."""
        if self._protocol is not None or self._ended is not _DONE:
            return None
        early, self._early = self._early, []
        self._ended = None
        self._protocol = _Ended  # delivered: a later deliverBody gets nothing more
        return b"".join(early)  # one piece: joining returns it as it is

    def _data(self, data: bytes) -> None:
        if self._protocol is None:
            self._early.append(data)
        else:
            self._protocol.dataReceived(data)

    def _end(self, reason: Failure) -> None:
        if self._protocol is None:
            self._ended = reason
        else:
            protocol, self._protocol = self._protocol, _Ended
            protocol.connectionLost(reason)


class _EndedProtocol:
    def dataReceived(self, data: bytes) -> None:
        pass

    def connectionLost(self, reason: Failure) -> None:
        pass


_Ended = _EndedProtocol()


class _Connection(Protocol):
    """One keep-alive connection to one backend; one request at a time."""

    def __init__(self, pool: _Pool) -> None:
        self.pool = pool
        self._batch: list[bytes] = []  # body pieces parsed from the bytes being fed
        # httptools hands each body piece straight to the batch's append: no Python frame a piece
        # (benchmarks/trees.py --profile: 2 calls a piece fewer, 46 a 20-chunk stream); set before
        # the parser, which looks its callbacks up when made.  The batch stays the same list.
        self.on_body: Callable[[bytes], None] = self._batch.append
        self.parser = httptools.HttpResponseParser(self)
        self.answer: Deferred[BackendResponse] | None = None
        #: How to send the request again on a fresh connection: a reused connection that dies
        #: before any answer byte (the backend closed it while idle and never saw the request).
        self.resend: Callable[[Deferred[BackendResponse]], None] | None = None
        self.response: BackendResponse | None = None
        self.reused = False
        self.got_bytes = False
        self.complete = False
        self.lost = False
        self._headers: list[bytes] = []  # names and values in turn
        self.connected_d: Deferred[_Connection] | None = None
        #: The request's Deferred and its answer, parsed in the read being fed: fired after it.
        self._ready: tuple[Deferred[BackendResponse], BackendResponse] | None = None

    # -- sending ------------------------------------------------------------------------

    def send(self, head: bytes, body: bytes, answer: Deferred[BackendResponse],
             resend: Callable[[Deferred[BackendResponse]], None] | None = None) -> None:
        self.answer = answer
        self.resend = resend
        self.response = None
        self.got_bytes = False
        self.complete = False
        self._headers = []
        assert self.transport is not None
        send_with_head(self.transport, head, body)  # sent now when the socket is free

    def abort(self) -> None:
        if self.transport is not None and not self.lost:
            self.transport.abortConnection()  # type: ignore[attr-defined]

    # -- Protocol ---------------------------------------------------------------------

    def connectionMade(self) -> None:
        no_delay(self.transport)
        if self.connected_d is not None:
            d, self.connected_d = self.connected_d, None
            d.callback(self)

    def dataReceived(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(Failure(ResponseFailed([Failure(ValueError("backend answered with an upgrade"))])))
        except httptools.HttpParserError as exc:
            self._fail(Failure(ResponseFailed([Failure(exc)])))
        else:
            if self._batch:
                self._flush()
        finally:
            ready = self._ready
            if ready is not None:
                # Fired once the whole read is parsed: an answer whose body came in the same
                # read is complete (or failed) by the time its reader asks for the body.
                self._ready = None
                answer, response = ready
                if not answer.called:
                    answer.callback(response)

    def _flush(self) -> None:
        """Hand the body pieces of one read to the response at once: a streamed answer's chunks
        that arrived together are relayed (rewritten, written) together, not one by one."""
        batch = self._batch
        if batch:
            data = b"".join(batch)  # one piece: joining returns it as it is
            del batch[:]  # the same list: httptools appends to it
            if self.response is not None:
                self.response._data(data)

    def connectionLost(self, reason: Failure = _DONE) -> None:
        self.lost = True
        self.pool.forget(self)
        answer, self.answer = self.answer, None
        response, self.response = self.response, None
        if answer is not None and not answer.called:
            if self.reused and not self.got_bytes:
                if self.resend is None:
                    answer.errback(Failure(ResponseFailed([Failure(ConnectionDone())])))
                else:
                    self.resend(answer)
            else:
                answer.errback(Failure(ResponseFailed([reason])))
        elif response is not None and not self.complete:
            # the framing is read here, where it decides, not for every answer (ops.py, one
            # client: about 25 opcodes a request)
            headers = response.headers
            if headers.content_length() is None and not headers.chunked() and reason.check(ConnectionDone):
                response._end(Failure(PotentialDataLoss()))  # close-delimited body: ends here
            else:
                response._end(Failure(ResponseFailed([reason])))

    def _fail(self, failure: Failure) -> None:
        self._flush()
        answer, self.answer = self.answer, None
        response, self.response = self.response, None
        self.abort()
        if answer is not None and not answer.called:
            answer.errback(failure)
        elif response is not None:
            response._end(failure)

    # -- httptools callbacks ----------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        # extended by both rather than appended a pair: no call a header (timeit: 10% faster)
        self._headers += (name, value)

    def on_headers_complete(self) -> None:
        response = BackendResponse(self.parser.get_status_code(), AnswerHeaders(self._headers), self)
        self._headers = []
        self.response = response
        answer, self.answer = self.answer, None
        self.resend = None  # answered: never sent again (nor its body kept while idle)
        if answer is not None and not answer.called:
            self._ready = (answer, response)

    def on_message_complete(self) -> None:
        if self._batch:
            self._flush()
        self.complete = True
        response, self.response = self.response, None
        keep = self.parser.should_keep_alive()
        if keep:
            self.parser = httptools.HttpResponseParser(self)
            self.reused = True
            self.pool.release(self)
        else:
            self.abort()
        if response is not None:
            response._end(_DONE)


class _Factory(ClientFactory):
    noisy = False

    def __init__(self, pool: _Pool, pending: Deferred[_Connection]) -> None:
        self.pool = pool
        self.pending = pending
        self.connection: _Connection | None = None

    def buildProtocol(self, addr: Any) -> _Connection:
        self.connection = _Connection(self.pool)
        self.connection.connected_d = self.pending
        return self.connection

    def clientConnectionFailed(self, connector: Any, reason: Failure) -> None:
        if not self.pending.called:
            self.pending.errback(reason)


class _Pool:
    """Idle connections to one backend (host, port), and the requests they carry."""

    def __init__(self, agent: BackendAgent, host: str, port: int) -> None:
        self.agent = agent
        self.host = host
        self.port = port
        self.idle: list[_Connection] = []

    def forget(self, connection: _Connection) -> None:
        if connection in self.idle:
            self.idle.remove(connection)

    def release(self, connection: _Connection) -> None:
        if connection.lost or len(self.idle) >= self.agent.max_idle_per_backend:
            connection.abort()
            return
        self.idle.append(connection)

    def request(self, head: bytes, body: bytes) -> Deferred[BackendResponse]:
        current: list[_Connection | None] = [None]
        connecting: list[Deferred[_Connection] | None] = [None]
        backoff: list[Any] = []  # the delayed next connect attempt, while refused

        def cancel(_d: Deferred[BackendResponse]) -> None:
            for call in backoff:
                if call.active():
                    call.cancel()
            if connecting[0] is not None:
                connecting[0].cancel()
            connection = current[0]
            if connection is not None:
                connection.answer = None
                connection.abort()

        answer: Deferred[BackendResponse] = Deferred(cancel)

        def fresh(answer_: Deferred[BackendResponse]) -> None:
            # what a new connection needs is made here, not for every request: most go out on an
            # idle connection (ops.py, one client: 105 -> 91 opcodes a request)
            def on(connection: _Connection) -> None:
                connecting[0] = None
                current[0] = connection
                connection.send(head, body, answer)

            def refused(failure: Failure) -> None:
                connecting[0] = None
                if answer_.called:
                    return
                if failure.check(ConnectionRefusedError) and len(backoff) < len(REFUSED_BACKOFF_S):
                    # A backend that refuses is stopping or restarting (nothing was sent): try again
                    # a little later rather than fail at once, so a queue released onto a dying
                    # backend does not drain into errors before the node sees the process end.
                    backoff.append(self.agent.reactor.callLater(REFUSED_BACKOFF_S[len(backoff)],
                                                                fresh, answer_))
                    return
                answer_.errback(failure)  # the connect error itself, as Agent gives it

            d = self._connect()
            connecting[0] = d
            d.addCallbacks(on, refused)

        while self.idle:
            connection = self.idle.pop()
            if not connection.lost:
                # the connection keeps how to send again (no entry kept by the pool, no callback
                # on the answer to drop it: 5 calls a request fewer)
                current[0] = connection
                connection.send(head, body, answer, fresh)
                return answer
        fresh(answer)
        return answer

    def _connect(self) -> Deferred[_Connection]:
        connector: list[Any] = []

        def cancel(_d: Deferred[_Connection]) -> None:
            if connector:
                connector[0].disconnect()

        factory = _Factory(self, Deferred(cancel))
        connector.append(self.agent.reactor.connectTCP(self.host, self.port, factory,
                                                       timeout=self.agent.connect_timeout))
        return factory.pending


@implementer(IAgent)
class BackendAgent:
    """An ``IAgent`` for plain-HTTP backends on this node (see the module docstring)."""

    def __init__(self, reactor: Any, fallback: IAgent, *, max_idle_per_backend: int = 128,
                 connect_timeout: float = 10) -> None:
        self.reactor = reactor
        self.fallback = fallback
        self.max_idle_per_backend = max_idle_per_backend
        self.connect_timeout = connect_timeout
        self._pools: dict[bytes, _Pool] = {}
        #: Each URI sent to, read once: its pool, path and authority (a backend is sent the same few
        #: URIs; ops.py, one client: 28 opcodes a request fewer than splitting it each time).
        #: Bounded (ports change with loads): once full it starts again.
        self._targets: dict[bytes, tuple[_Pool, bytes, bytes]] = {}

    def request(self, method: bytes, uri: bytes, headers: Headers | None = None,
                bodyProducer: Any = None) -> Deferred[Any]:
        body = getattr(bodyProducer, "body", None) if bodyProducer is not None else b""
        # an exact type first: a call fewer than isinstance (benchmarks/trees.py --profile)
        if type(body) is not bytes and not isinstance(body, bytes):
            return self.fallback.request(method, uri, headers, bodyProducer)
        targets = self._targets
        target = targets[uri] if uri in targets else self._target(uri)
        if target is None:
            return self.fallback.request(method, uri, headers, bodyProducer)
        pool, path, authority = target
        if headers is None:
            lines = b""
        elif type(headers) is RequestHeaders:
            lines = headers.lines  # rendered once for every request that shares them
        else:
            lines = request_lines(headers)
        head = (method, b" ", path, b" HTTP/1.1\r\nHost: ", authority, b"\r\nContent-Length: ",
                b"%d" % len(body), b"\r\n", lines, b"\r\n")
        return pool.request(b"".join(head), body)

    def _target(self, uri: bytes) -> tuple[_Pool, bytes, bytes] | None:
        """The pool, path and authority of a plain-HTTP ``uri`` (kept), or None for another."""
        if uri[:7] != b"http://":
            return None
        slash = uri.find(b"/", 7)
        authority, path = (uri[7:], b"/") if slash < 0 else (uri[7:slash], uri[slash:])
        pool = self._pools.get(authority)
        if pool is None:
            host, _, port = authority.rpartition(b":")
            if not host or not port.isdigit():
                return None
            pool = self._pools[authority] = _Pool(self, host.decode("ascii").strip("[]"), int(port))
        if len(self._targets) >= 256:
            self._targets.clear()
        target = self._targets[uri] = (pool, path, authority)
        return target

    def close(self) -> None:
        """Close every idle connection (a stop)."""
        for pool in self._pools.values():
            for connection in list(pool.idle):
                connection.abort()
            pool.idle.clear()
