"""Streaming an HTTP answer from a backend or another node to the client, chunk by chunk.

Shared by the local backend proxy and the master's forwarding, so both stream,
rewrite and fail the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss

TAIL_KEEP = 8192
_DONE = Failure(ResponseDone())


class StreamBroken(Exception):
    """The upstream answer ended abnormally after the client's answer had started."""


class Writer:
    """Anything with ``write(bytes)``: a client request or a buffer."""

    def write(self, data: bytes) -> None:  # pragma: no cover - protocol
        raise NotImplementedError


class Relay(Protocol):
    """Feeds an upstream body through a converter into ``sink``; ``done`` fires with the tail."""

    def __init__(self, sink: Any, feed: Callable[[bytes], bytes], flush: Callable[[], bytes],
                 done: Deferred[bytes]) -> None:
        self.sink = sink
        self.feed = feed
        self.flush = flush
        self.done = done
        self.tail = b""

    def dataReceived(self, data: bytes) -> None:
        self.tail = (self.tail + data)[-TAIL_KEEP:]
        out = self.feed(data)
        if out and not self.done.called:
            self.sink.write(out)

    def connectionLost(self, reason: Failure = _DONE) -> None:
        if self.done.called:
            return
        if reason.check(ResponseDone, PotentialDataLoss):
            out = self.flush()
            if out:
                self.sink.write(out)
            self.done.callback(self.tail)
        else:
            self.done.errback(StreamBroken(str(reason.value)))

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.stopProducing()  # type: ignore[attr-defined]


async def relay(response: Any, sink: Any, feed: Callable[[bytes], bytes],
                flush: Callable[[], bytes]) -> bytes:
    """Stream ``response``'s body into ``sink``; returns the last bytes seen.

    Cancelling the awaiting coroutine aborts the upstream connection.
    """
    done: Deferred[bytes] = Deferred(lambda _d: protocol.abort())
    protocol = Relay(sink, feed, flush, done)
    response.deliverBody(protocol)
    return await done


class _Buffer:
    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.chunks.append(data)


async def collect(response: Any) -> bytes:
    """The whole upstream body (for answers that are converted whole)."""
    buffer = _Buffer()
    await relay(response, buffer, _identity, _empty)
    return b"".join(buffer.chunks)


def _identity(data: bytes) -> bytes:
    return data


def _empty() -> bytes:
    return b""


def response_header(response: Any, name: bytes) -> str:
    values = response.headers.getRawHeaders(name)
    return str(values[0].decode("latin-1")) if values else ""
