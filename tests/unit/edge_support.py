"""A node's two HTTP edges over in-memory transports (issue 20): the lean channel a connection starts
in, and twisted.web's channel (:class:`~routerd.api.site.NodeHTTPChannel`) that serves what the lean
one hands over.  ``Edges.answer(raw, edge=...)`` sends the same bytes through either and reads back
the status and the error code."""

from __future__ import annotations

import json
import re
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.web.iweb import IRequest

from routerd.api.channel import LeanChannel, NodeServerFactory
from routerd.api.dispatch import Dispatch
from routerd.api.routes import Routes
from routerd.api.site import GuardResource, NodeSite
from routerd.cluster.auth import AuthPolicy
from routerd.config.schema import ServerConfig
from routerd.errors import StatusError
from routerd.routing.call import Incoming, Reply

KEY = "inference-key-0123"
#: The native APIs' paths, served as chat is (the parity rows send them through both edges).
NATIVE_API_PATHS = ("/v1/messages", "/v1/messages/count_tokens", "/v1/responses", "/v1/rerank", "/rerank")
ADMIN = "admin-key-0123456"


class EdgeApi:
    """``/v1/chat/completions``, Ollama's ``/api/chat`` and the native APIs' routes (Messages, token
    counting, Responses, rerank: one lean route answering at once) and ``GET /health`` (Klein)."""

    routes = Routes()

    def __init__(self) -> None:
        self.served: list[Incoming] = []
        self.hold = False  # answer later: the Deferreds wait in ``pending``
        self.pending: list[Deferred[bytes]] = []
        self.fail: StatusError | None = None  # raised by the lean route instead of an answer

    @routes.route("/health", methods=["GET"], auth="health")
    def health(self, request: IRequest) -> bytes:
        return b'{"status":"ok"}'

    @routes.lean(["/v1/chat/completions", "/api/chat", *NATIVE_API_PATHS], methods=["POST"], auth="inference")
    def chat(self, method: str, path: str, facts: Incoming, reply: Reply) -> Deferred[bytes] | bytes:
        self.served.append(facts)
        if self.fail is not None:
            raise self.fail
        reply.set_header(b"content-type", b"application/json")
        if self.hold:
            d: Deferred[bytes] = Deferred()
            self.pending.append(d)
            return d
        return b'{"ok":true}'


class Edges:
    """One node's edge: its guard, site and lean factory, with a Clock."""

    def __init__(self, *, keys: tuple[str, ...] = (KEY,),
                 cidrs: tuple[str, ...] = ("127.0.0.0/8", "10.0.0.0/8"),
                 proxies: tuple[str, ...] = ("127.0.0.2/32",), limit: int = 1024, buffer: int | None = 4096,
                 phase: str = "ready", server: ServerConfig | None = None,
                 cors: tuple[str, ...] = ()) -> None:
        self.api = EdgeApi()
        self.phase = phase
        self.clock = Clock()
        self.clock.advance(1_000_000)
        policy = AuthPolicy.build(keys, (ADMIN,), "cluster-token", cidrs, trusted_proxies=proxies)
        self.guard = GuardResource(Dispatch([self.api]), policy, limit, cors, lambda: self.phase,
                                   server or ServerConfig())
        self.site = NodeSite(self.guard, limit, buffer)
        self.site.reactor = self.clock
        self.site.timeOut = None
        self.factory = NodeServerFactory(self.site, lambda: self.phase)

    def connect(self, edge: str = "lean", peer: str = "127.0.0.1") -> tuple[Any, StringTransport]:
        """A connection from ``peer`` to the ``lean`` edge (where every connection starts) or
        straight to ``twisted`` (twisted.web's channel, as after a hand-over)."""
        address = IPv4Address("TCP", peer, 50000)
        transport = StringTransport(peerAddress=address)
        protocol: Any = self.factory.buildProtocol(address) if edge == "lean" \
            else self.site.buildProtocol(address)
        protocol.makeConnection(transport)
        return protocol, transport

    def answer(self, raw: bytes, edge: str = "lean", peer: str = "127.0.0.1") -> tuple[int, str]:
        """(status, error code or "") of the first answer to ``raw`` sent on a new connection."""
        protocol, transport = self.connect(edge, peer)
        protocol.dataReceived(raw)
        return status_and_code(transport.value())


def handed_over(protocol: Any) -> bool:
    return isinstance(protocol, LeanChannel) and protocol._inner is not None


def status_and_code(out: bytes) -> tuple[int, str]:
    if not out:
        return 0, ""
    head, _, body = out.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        size, _, rest = body.partition(b"\r\n")
        body = rest[:int(size, 16)]
    match = re.search(rb"\r\ncontent-length: *(\d+)", head, re.IGNORECASE)
    if match is not None:
        body = body[:int(match.group(1))]
    try:
        parsed = json.loads(body)
    except ValueError:
        return status, ""
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict):
        return status, str(error.get("code", ""))
    return status, "error" if isinstance(error, str) else ""


def request(path: bytes = b"/v1/chat/completions", *, method: bytes = b"POST", version: bytes = b"HTTP/1.1",
            fields: tuple[bytes, ...] = (b"Host: node", b"Authorization: Bearer " + KEY.encode()),
            body: bytes | None = b'{"model":"m"}') -> bytes:
    lines = [method + b" " + path + b" " + version, *fields]
    if body is not None:
        lines += [b"Content-Type: application/json", b"Content-Length: %d" % len(body)]
    return b"\r\n".join(lines) + b"\r\n\r\n" + (body or b"")
