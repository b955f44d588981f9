"""A raw HTTP/1.1 client over TCP that can drop its connection at any moment (client disconnects)."""

from __future__ import annotations

import json
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure


class RawClient(Protocol):
    def __init__(self) -> None:
        self.received = b""
        self.closed: Deferred[None] = Deferred()
        self.first_data: Deferred[None] = Deferred()

    def dataReceived(self, data: bytes) -> None:
        self.received += data
        if not self.first_data.called:
            self.first_data.callback(None)

    def connectionLost(self, reason: Failure | None = None) -> None:
        if not self.closed.called:
            self.closed.callback(None)

    def drop(self) -> None:
        assert self.transport is not None
        self.transport.abortConnection()  # type: ignore[attr-defined]

    @property
    def status(self) -> int:
        return int(self.received.split(b" ", 2)[1]) if self.received.startswith(b"HTTP/") else 0


async def raw_post(port: int, path: str, body: Any, headers: dict[str, str] | None = None) -> RawClient:
    """Send one POST with a JSON body and return the client (reading the answer as it comes)."""
    raw = json.dumps(body).encode()
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json",
             f"Content-Length: {len(raw)}", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    client = RawClient()
    await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), client)
    assert client.transport is not None
    client.transport.write(("\r\n".join(lines) + "\r\n\r\n").encode() + raw)
    return client
