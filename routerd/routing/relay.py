"""Streaming an HTTP answer from a backend or another node to the client, chunk by chunk.

Shared by the local backend proxy and the master's forwarding, so both stream,
rewrite and fail the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss

from routerd.errors import HTTPError
from routerd.routing.upstream import upstream_gone

T = TypeVar("T")
log = Logger()
TAIL_KEEP = 8192
_DONE = Failure(ResponseDone())


class StreamBroken(Exception):
    """The upstream answer ended abnormally after the client's answer had started."""


class StreamIdle(StreamBroken):
    """The upstream answer went silent for longer than the idle-stream timeout (and was aborted)."""


class Idle:
    """An idle-stream timeout: ``seconds`` of silence on ``clock`` end an upstream answer."""

    __slots__ = ("clock", "seconds")

    def __init__(self, clock: IReactorTime, seconds: float) -> None:
        self.clock = clock
        self.seconds = seconds


class Writer:
    """Anything with ``write(bytes)``: a client request or a buffer."""

    def write(self, data: bytes) -> None:  # pragma: no cover - protocol
        raise NotImplementedError


class FirstByteTimeout(HTTPError):
    """No answer (status line and headers) arrived within the first-byte timeout; the upstream
    call was cancelled.  A 504 unless the caller names the upstream more precisely."""

    def __init__(self, seconds: float) -> None:
        super().__init__(504, f"no answer within {seconds:g} s", "timeout", "upstream_timeout")
        self.seconds = seconds


class Timeouts:
    """The limits on one upstream answer: ``first_byte`` seconds until its headers arrive, then
    ``idle`` seconds of silence at most between chunks (``limits.first_byte_timeout`` and
    ``limits.idle_stream_timeout``; a reload sets both)."""

    __slots__ = ("_due", "_idle", "_watch", "_watch_at", "clock", "first_byte", "streaming")

    def __init__(self, clock: IReactorTime, first_byte: float, idle: float) -> None:
        self.clock = clock
        self.first_byte = first_byte
        self.idle = idle
        # Each awaited answer's first-byte deadline, watched by one timer at the earliest while
        # any is awaited (none when none is): a timer made and cancelled per answer cost about
        # 150 opcodes a request (ops.py, 16 clients), the reactor's timer heap included.
        self._due: dict[Deferred[Any], float] = {}
        self._watch: IDelayedCall | None = None
        self._watch_at = 0.0

    @property
    def idle(self) -> float:
        return self._idle

    @idle.setter
    def idle(self, seconds: float) -> None:
        self._idle = seconds
        #: The idle-stream timeout every answer shares until the next reload (one per setting,
        #: not one per request).
        self.streaming = Idle(self.clock, seconds)

    def stream(self) -> Idle:
        return self.streaming

    async def answer(self, pending: Deferred[T]) -> T:
        """``pending``'s result, or :class:`FirstByteTimeout` (``pending`` cancelled) when it
        takes longer than ``first_byte`` seconds."""
        due = self._due
        deadline = due[pending] = self.clock.seconds() + self.first_byte
        if self._watch is None:
            self._watch_at = deadline
            self._watch = self.clock.callLater(self.first_byte, self._expire)
        elif deadline < self._watch_at:  # a reload shortened the limit
            self._watch_from(deadline)
        try:
            return await pending
        except Exception:
            if pending not in due:  # only the watch takes it out before this: it was too late
                raise FirstByteTimeout(self.first_byte) from None
            raise
        finally:
            due.pop(pending, None)
            if not due and self._watch is not None:
                self._watch.cancel()
                self._watch = None

    def _watch_from(self, deadline: float) -> None:
        """The timer is due at ``deadline`` (earlier than any it had)."""
        if self._watch is not None:
            self._watch.cancel()
        self._watch_at = deadline
        self._watch = self.clock.callLater(max(0.0, deadline - self.clock.seconds()), self._expire)

    def _expire(self) -> None:
        """Cancel every answer past its deadline; watch for the next deadline."""
        self._watch = None
        now = self.clock.seconds()
        due = self._due
        late = [pending for pending, deadline in due.items() if deadline <= now]
        for pending in late:
            del due[pending]
        for pending in late:
            try:
                pending.cancel()
            except Exception:  # noqa: BLE001 - one canceller's bug stops no other timeout
                log.failure("cancelling an answer past its first-byte timeout failed")
        if due:
            earliest = min(due.values())
            if self._watch is None or earliest < self._watch_at:
                self._watch_from(earliest)


def stream_idle(timeouts: Timeouts | None) -> Idle | None:
    return timeouts.streaming if timeouts is not None else None


class Relay(Protocol):
    """Feeds an upstream body through a converter into ``sink``; ``done`` fires with the tail."""

    def __init__(self, sink: Any, feed: Callable[[bytes], bytes], flush: Callable[[], bytes],
                 done: Deferred[bytes], idle: Idle | None = None, *, defer_idle: bool = False) -> None:
        """``defer_idle``: the idle-stream timer starts at :meth:`start`, not here (a body that is
        complete when it is delivered never arms one)."""
        self.sink = sink
        self.feed = feed
        self.flush = flush
        self.done = done
        self._tail: list[bytes] = []  # the last chunks, at least TAIL_KEEP bytes when there are
        self._tail_size = 0
        self.idle = idle
        self._timer: IDelayedCall | None = None
        self._heard = 0.0  # when the upstream was last heard (the idle clock's time)
        if idle is not None and not defer_idle:
            self._arm()

    def _arm(self) -> None:
        if self.idle is None:
            return
        self._heard = self.idle.clock.seconds()
        if self._timer is None or not self._timer.active():
            self._timer = self.idle.clock.callLater(self.idle.seconds, self._silent)

    def _disarm(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def _silent(self) -> None:
        """The idle timer is due: the stream is silent if nothing arrived since it was last heard
        ``idle`` seconds ago; else the timer waits again for what is left of that time.  (A chunk
        only notes the time it was heard: moving a timer for every chunk re-sorted the reactor's
        timers each time, ~8 calls a chunk.)"""
        self._timer = None
        if self.done.called:
            return
        assert self.idle is not None
        left = self._heard + self.idle.seconds - self.idle.clock.seconds()
        if left > 0:
            self._timer = self.idle.clock.callLater(left, self._silent)
            return
        self.done.errback(StreamIdle(f"no data for {self.idle.seconds:g} s"))
        self.abort()

    def start(self) -> None:
        """Arm the idle-stream timer unless the body has already ended (``defer_idle``)."""
        if not self.done.called and self._timer is None:
            self._arm()

    def dataReceived(self, data: bytes) -> None:
        if self._timer is not None:
            self._heard = self.idle.clock.seconds()  # type: ignore[union-attr]  # a timer means an idle limit
        tail = self._tail
        tail.append(data)
        self._tail_size += len(data)
        while self._tail_size - len(tail[0]) >= TAIL_KEEP:
            self._tail_size -= len(tail.pop(0))
        out = self.feed(data)
        if out and not self.done.called:
            self.sink.write(out)

    @property
    def tail(self) -> bytes:
        """The last TAIL_KEEP bytes seen (kept as chunks: no copy per chunk)."""
        return b"".join(self._tail)[-TAIL_KEEP:]

    def connectionLost(self, reason: Failure = _DONE) -> None:
        self._disarm()
        if self.done.called:
            return
        if reason.check(ResponseDone, PotentialDataLoss):
            out = self.flush()
            if out:
                self.sink.write(out)
            self.done.callback(self.tail)
        else:
            gone = upstream_gone(reason.value) if reason.value is not None else None
            self.done.errback(StreamBroken(gone or str(reason.value)))

    def abort(self) -> None:
        self._disarm()
        if self.transport is not None:
            self.transport.stopProducing()  # type: ignore[attr-defined]


async def relay(response: Any, sink: Any, feed: Callable[[bytes], bytes],
                flush: Callable[[], bytes], idle: Idle | None = None) -> bytes:
    """Stream ``response``'s body into ``sink``; returns the last bytes seen.

    Cancelling the awaiting coroutine aborts the upstream connection; so does ``idle`` seconds
    of silence (raising :class:`StreamIdle`).
    """
    done: Deferred[bytes] = Deferred(lambda _d: protocol.abort())
    protocol = Relay(sink, feed, flush, done, idle, defer_idle=True)
    response.deliverBody(protocol)
    protocol.start()  # an answer that arrived whole is already done: no timer to arm and cancel
    return await done


class _Buffer:
    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.chunks.append(data)


async def collect(response: Any, idle: Idle | None = None) -> bytes:
    """The whole upstream body (for answers that are converted whole).  A response that offers
    ``body_if_complete()`` (the lean client's) is asked first: a body that has already arrived
    whole is taken without a relay protocol."""
    whole = getattr(response, "body_if_complete", None)
    if whole is not None:
        body = whole()
        if body is not None:
            return body  # type: ignore[no-any-return]
    buffer = _Buffer()
    await relay(response, buffer, _identity, _empty, idle)
    return b"".join(buffer.chunks)


def _identity(data: bytes) -> bytes:
    return data


def _empty() -> bytes:
    return b""


def response_header(response: Any, name: bytes) -> str:
    values = response.headers.getRawHeaders(name)
    return str(values[0].decode("latin-1")) if values else ""
