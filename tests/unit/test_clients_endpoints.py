"""The node's pooled client (readiness probes, asset pulls, node calls) connects to an IP address
directly, so a refused connection — a backend not listening yet — is "not yet" at once instead of
after ``HostnameEndpoint``'s 0.3 s attempt delay, which made a load look 0.3 s longer than it was.

No sockets: a memory reactor records the connections and the test refuses them.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.endpoints import HostnameEndpoint, TCP4ClientEndpoint, TCP6ClientEndpoint
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.testing import MemoryReactorClock
from twisted.python.failure import Failure
from twisted.web.client import URI

from routerd.assembly.clients import NodeClients
from routerd.clients.endpoints import DirectEndpoints


def test_a_refused_connection_to_a_backends_address_fails_the_probe_at_once() -> None:
    reactor = MemoryReactorClock()
    clients = NodeClients(reactor)
    outcome: list[Any] = []
    clients.http.get("http://127.0.0.1:41001/v1/models", timeout=5).addBoth(outcome.append)
    host, port, factory, _timeout, _bind = reactor.tcpClients[0]
    assert (host, port) == ("127.0.0.1", 41001)
    factory.clientConnectionFailed(reactor.connectors[0], Failure(ConnectionRefusedError()))
    assert outcome and isinstance(outcome[0], Failure) and outcome[0].check(ConnectionRefusedError), outcome
    assert reactor.seconds() == 0  # no clock turned: told at once


def test_an_address_is_connected_to_directly_and_a_name_is_resolved() -> None:
    reactor = MemoryReactorClock()
    endpoints = DirectEndpoints(reactor, connect_timeout=10)
    assert isinstance(endpoints.endpointForURI(URI.fromBytes(b"http://127.0.0.1:8080/x")), TCP4ClientEndpoint)
    assert isinstance(endpoints.endpointForURI(URI.fromBytes(b"http://[::1]:8080/x")), TCP6ClientEndpoint)
    assert isinstance(endpoints.endpointForURI(URI.fromBytes(b"http://node-b.lan:8080/x")), HostnameEndpoint)
    tls = endpoints.endpointForURI(URI.fromBytes(b"https://10.0.0.2:8443/x"))
    assert not isinstance(tls, TCP4ClientEndpoint | HostnameEndpoint)  # wrapped in TLS
