"""One answer of the lean HTTP channel (:mod:`routerd.api.channel`), written straight to its connection.

:class:`LeanReply` is the :class:`~routerd.routing.call.Reply` a lean route's handler writes to: its
status and headers are kept until the first byte, then the answer goes out as one write with
``Content-Length`` (the handler returned its bytes at once) or chunked (it streamed).  It gives the
request's replay-budget bytes back exactly once (finished, failed, aborted or lost), answers a
handler's failure with the one error writer (:mod:`routerd.api.errors`), and writes the access line.
"""

from __future__ import annotations

from typing import Any, Protocol
from urllib.parse import parse_qs

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import ITransport
from twisted.logger import Logger
from twisted.python.failure import Failure

from routerd.api.access import access_logged, answer_head, log_access
from routerd.api.errors import INTERNAL_ERROR, reply_error, reply_failure
from routerd.api.head import RequestHead
from routerd.errors import ErrorStyle
from routerd.header_names import LOWER, LOWERED, lowered
from routerd.logs import request_model
from routerd.transports import send, send_with_head

log = Logger()


class Server(Protocol):
    """What an answer reads of the channel's server: the clock, the ``Date`` value, the replay
    budget its request's bytes go back to."""

    def seconds(self) -> float: ...

    def date(self, now: float) -> bytes: ...

    def give_back(self, size: int, holder: str = "") -> None: ...


class Connection(Protocol):
    """The connection an answer is written to (:class:`~routerd.api.channel.LeanChannel`)."""

    @property
    def transport(self) -> ITransport | None: ...

    @property
    def server(self) -> Server: ...

    def answered(self, reply: LeanReply, now: float | None = None) -> None: ...


class LeanReply:
    """A :class:`~routerd.routing.call.Reply` written straight to the connection."""

    __slots__ = ("channel", "request", "client", "error_family", "body", "started_at", "status", "headers",
                 "typed", "cased", "started", "gone", "finished", "sent", "held", "holder", "pending",
                 "model")

    def __init__(self, channel: Connection, request: RequestHead, client: str, error_family: ErrorStyle,
                 body: bytes, now: float) -> None:
        self.channel = channel
        self.request = request  # the head: what the answer and its access line read
        self.client = client
        self.error_family = error_family  # the route's: what an error answer is written in
        self.body = body  # kept for the access line's model only while the request lives
        self.started_at = now
        self.status = 200
        # name, value, name, value...: a flat list, not a dict of (name, value) pairs under
        # lower-cased copies of the names (a held request's reply kept ~410 B of headers that
        # way, ~120 B like this; set once or twice, read when the answer starts)
        self.headers: list[bytes] = []
        self.typed = False  # a content-type header was set
        self.cased = False  # a name set is not lower-case (then names are compared lower-cased)
        self.started = False
        self.gone = False
        self.finished = False
        self.sent = 0
        self.held = 0  # bytes taken from the site's buffer budget
        self.holder = ""  # who they are counted to
        self.pending: Deferred[Any] | None = None
        self.model: str | None = None  # named by routing (else the access line reads the body)

    # -- Reply -------------------------------------------------------------------

    def set_status(self, code: int) -> None:
        if not self.started:
            self.status = code

    def set_header(self, name: bytes, value: bytes) -> None:
        # find(), not `in`: on CPython 3.11 `sub in data` for bytes first tries ``sub`` as an integer
        # and builds and drops a TypeError (~1,850 machine instructions a test, callgrind; twice
        # for each of ~5 headers a request: ~2 % of a request's instructions)
        if value.find(b"\r") >= 0 or value.find(b"\n") >= 0:
            value = value.replace(b"\r", b" ").replace(b"\n", b" ")
        headers = self.headers
        if name in LOWER and not self.cased:
            # a lower-case name, every name set before lower-case too (not cased): a name matches
            # it in any case only as it is spelled, found without a scan (set_header took 373
            # opcodes a request with a scan each, 5 headers; ops.py)
            if name not in headers:
                headers += (name, value)
                if name == b"content-type":
                    self.typed = True
                return
            at = headers.index(name)
            if not at & 1:  # the name (not a value spelled as it): set again
                headers[at + 1] = value
                return
        # names compared lower-cased through the shared LOWERED (subscripts and slices, no calls)
        key = LOWERED[name] if name in LOWERED else lowered(name)
        if key != name:
            self.cased = True
        at = 0
        for known in headers[::2]:  # the same name again (any case) replaces it
            if known == name or (LOWERED[known] if known in LOWERED else lowered(known)) == key:
                headers[at] = name
                headers[at + 1] = value
                return
            at += 2
        headers += (name, value)
        if key == b"content-type":
            self.typed = True

    def write(self, data: bytes) -> None:
        if self.gone or self.finished or not data:
            return
        transport = self.channel.transport
        assert transport is not None
        size = len(data)  # once: a streamed answer writes ~20 chunks
        chunk = b"%x\r\n%b\r\n" % (size, data)
        if not self.started:
            self.started = True
            send(transport, self._head_bytes(None, self.channel.server.seconds()) + chunk)
        else:
            # every chunk goes out at once too: a backend's chunks that arrive in one read are
            # already relayed as one write, so queueing them for the next reactor turn (Twisted's
            # write: an epoll_ctl to watch the socket, a turn, the send, an epoll_ctl to stop) only
            # delayed each by a turn; per 20-chunk stream that was ~7 epoll_ctl calls and ~50 Python
            # calls more than sending (trees.py --profile)
            send(transport, chunk)
        self.sent += size

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

    def settle(self, outcome: bytes | Failure) -> None:
        """The handler's Deferred fired: with its final bytes, or failed."""
        if isinstance(outcome, Failure):
            self.failed(outcome)
        else:
            self.finish(outcome)

    def finish(self, body: bytes) -> None:
        """The handler's final bytes: the answer is complete."""
        if self.gone or self.finished:
            return
        self.finished = True
        channel = self.channel
        transport = channel.transport
        assert transport is not None
        now = channel.server.seconds()  # read once: the Date, the access line's ms, the channel's idle
        size = len(body)
        if not self.started:
            self.started = True
            send_with_head(transport, self._head_bytes(size, now), body)
        elif body:
            send(transport, b"%x\r\n%b\r\n0\r\n\r\n" % (size, body))
        else:
            send(transport, b"0\r\n\r\n")
        self.sent += size
        self._release()
        if access_logged():
            self._log(now)
        channel.answered(self, now)

    def failed(self, failure: Failure) -> None:
        if self.gone or self.finished:
            if not failure.check(CancelledError):
                log.failure("unhandled error after the request finished", failure=failure)
            return
        if self.started:
            log.failure("error after the answer to {path} started", failure=failure, path=self.request.path)
            self.finished = True
            self.abort()
            return
        try:
            body = reply_failure(self, self.request.path, failure)
        except Exception:  # noqa: BLE001 - never leave the request open
            log.failure("error handler failed")
            body = reply_error(self, self.request.path, INTERNAL_ERROR)
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
        if held:
            self.channel.server.give_back(held, self.holder)

    def _head_bytes(self, length: int | None, now: float) -> bytes:
        return answer_head(self.status, self.headers, length, self.request.close,
                           self.channel.server.date(now), self.typed)

    def _log(self, now: float) -> None:
        request = self.request
        fields = request.fields
        model = self.model
        if model is None:
            query_model = None
            if request.query:
                values = parse_qs(request.query.decode("ascii")).get("model")
                query_model = values[0] if values else None
            model = request_model(query_model, fields.get("x-routerd-model"),
                                  fields.get("content-type", ""), self.body)
            self.body = b""
        headers = self.headers
        keys = headers[::2]
        if self.cased:  # else the names are their own lower case (see set_header)
            keys = [LOWERED[name] if name in LOWERED else lowered(name) for name in keys]
        # the answer's headers by lower-case name, made in C and looked up three times: a loop
        # over every header was 68 opcodes a request of _log's 132 (ops.py)
        named = dict(zip(keys, headers[1::2], strict=True))
        log_access(method=request.method, path=request.path, status=self.status, bytes=self.sent,
                   ms=round((now - self.started_at) * 1000), model=model, client=self.client,
                   node=_shown(named, _NODE), lent_to=_shown(named, _LENT_TO),
                   request_id=_shown(named, _REQUEST_ID))


def _shown(named: dict[bytes, bytes], name: bytes) -> str:
    """An answer header's value as the access line shows it ("-" when it was not set)."""
    return named[name].decode("utf-8", "replace") if name in named else "-"


#: Answer headers the access line reads.
_NODE, _LENT_TO, _REQUEST_ID = b"x-routerd-node", b"x-routerd-lent-to", b"x-routerd-request-id"


__all__ = ["Connection", "LeanReply"]
