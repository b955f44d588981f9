"""In-memory HTTP for unit tests: an ``IAgent`` that reaches twisted.web sites by URL host:port.

Each request gets its own client/server pair of ``iosim`` transports; nothing moves until
:meth:`MemoryNetwork.flush` pumps the bytes, so a test decides when the network runs.  An address
nobody serves refuses the connection, like a closed port.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from treq.client import HTTPClient
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.testing import MemoryReactorClock
from twisted.test import iosim
from twisted.web.client import Agent
from twisted.web.iweb import IBodyProducer
from twisted.web.server import Site
from zope.interface import implementer

from routerd.api.channel import NodeServerFactory


class _Endpoints:
    def __init__(self, reactor: MemoryReactorClock) -> None:
        self.reactor = reactor

    def endpointForURI(self, uri: Any) -> TCP4ClientEndpoint:
        return TCP4ClientEndpoint(self.reactor, uri.host.decode(), uri.port)


@implementer(IBodyProducer)
class SyncProducer:
    """A request body written at once (treq's default producer needs the global reactor)."""

    def __init__(self, body: bytes | str) -> None:
        self.body = body.encode() if isinstance(body, str) else body
        self.length = len(self.body)

    def startProducing(self, consumer: Any) -> Deferred[None]:
        consumer.write(self.body)
        return succeed(None)

    def stopProducing(self) -> None:
        pass

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass


class MemoryNetwork:
    """Serves ``Site`` objects at ``host:port`` addresses; use it as the ``IAgent`` of any client."""

    def __init__(self) -> None:
        self._reactor = MemoryReactorClock()  # owns the transports' own timers, never advanced
        self._agent = Agent.usingEndpointFactory(self._reactor, _Endpoints(self._reactor))
        self.sites: dict[str, Site | NodeServerFactory] = {}
        self._pumps: list[iosim.IOPump] = []
        self.requests: list[tuple[bytes, bytes]] = []

    def serve(self, netloc: str, site: Site | NodeServerFactory) -> None:
        """Serve ``site`` (a twisted.web site, or a node's lean channel factory over one)."""
        inner = site.site if isinstance(site, NodeServerFactory) else site
        inner.reactor = self._reactor  # channel timers stay off the test's Clock
        inner.timeOut = None
        self.sites[netloc] = site

    def unplug(self, netloc: str) -> None:
        self.sites.pop(netloc, None)

    def request(self, method: bytes, uri: bytes, headers: Any = None, bodyProducer: Any = None) -> Any:
        self.requests.append((method, uri))
        site = self.sites.get(urlsplit(uri.decode()).netloc)
        if site is None:
            return fail(ConnectionRefusedError(f"nothing serves {uri.decode()}"))
        d = self._agent.request(method, uri, headers, bodyProducer)
        port = self._reactor.tcpClients[-1][1]
        factory = self._reactor.tcpClients[-1][2]
        client_addr = IPv4Address("TCP", "127.0.0.1", 40000 + len(self.requests))
        server_addr = IPv4Address("TCP", "127.0.0.1", port)
        server = site.buildProtocol(client_addr)
        client = factory.buildProtocol(server_addr)
        self._pumps.append(iosim.connect(
            server, iosim.FakeTransport(server, True, server_addr, client_addr),
            client, iosim.FakeTransport(client, False, client_addr, server_addr), greet=False))
        return d

    def flush(self) -> bool:
        """Move bytes on every open connection until none moves; True if any did."""
        moved = False
        while any([pump.flush() for pump in list(self._pumps)]):
            moved = True
            self._pumps = [p for p in self._pumps
                           if not (p.clientIO.disconnected and p.serverIO.disconnected)]
        return moved

    def client(self, reactor: Any) -> HTTPClient:
        """A treq client on this network whose timeouts run on ``reactor`` (a ``task.Clock``)."""
        return _ClockedClient(self, data_to_body_producer=SyncProducer, reactor=reactor)


class _ClockedClient(HTTPClient):
    def __init__(self, agent: Any, *, data_to_body_producer: Any, reactor: Any) -> None:
        super().__init__(agent, data_to_body_producer=data_to_body_producer)
        self._clock = reactor

    def request(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("reactor", self._clock)
        return super().request(*args, **kwargs)
