"""Where the node's pooled ``Agent`` connects: an IP address directly, a name through
``HostnameEndpoint``.

Twisted's default (``HostnameEndpoint`` for every host) reports a refused connection only when its
next connection attempt would start, ``0.3 s`` later, even for a single address.  A readiness probe
of a backend that is not listening yet is refused, so each such probe took 0.3 s and a 0.05 s load
looked like 0.35 s (the load time the router records and prices).  The backends and, mostly, the
other nodes are addressed by IP: those connect with a plain TCP endpoint, which fails at once.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.abstract import isIPAddress, isIPv6Address
from twisted.internet.endpoints import HostnameEndpoint, TCP4ClientEndpoint, TCP6ClientEndpoint, wrapClientTLS
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.web.client import URI, BrowserLikePolicyForHTTPS
from twisted.web.error import SchemeNotSupported
from twisted.web.iweb import IAgentEndpointFactory, IPolicyForHTTPS
from zope.interface import implementer


@implementer(IAgentEndpointFactory)
class DirectEndpoints:
    """An ``IAgentEndpointFactory`` (``Agent.usingEndpointFactory``): TCP to an IP address, TCP via
    name resolution otherwise, TLS over either for ``https``."""

    def __init__(self, reactor: Any, *, connect_timeout: float = 30,
                 tls: IPolicyForHTTPS | None = None) -> None:
        self._reactor = reactor
        self._timeout = connect_timeout
        self._tls: IPolicyForHTTPS = tls if tls is not None else BrowserLikePolicyForHTTPS()

    def endpointForURI(self, uri: URI) -> IStreamClientEndpoint:  # noqa: N802 - Twisted's name
        if uri.scheme not in (b"http", b"https"):
            raise SchemeNotSupported(f"Unsupported scheme: {uri.scheme!r}")
        host = uri.host.decode("ascii")
        endpoint: IStreamClientEndpoint
        if isIPAddress(host):
            endpoint = TCP4ClientEndpoint(self._reactor, host, uri.port, timeout=self._timeout)
        elif isIPv6Address(host):
            endpoint = TCP6ClientEndpoint(self._reactor, host, uri.port, timeout=self._timeout)
        else:
            endpoint = HostnameEndpoint(self._reactor, host, uri.port, timeout=self._timeout)
        if uri.scheme == b"https":
            return wrapClientTLS(self._tls.creatorForNetloc(uri.host, uri.port), endpoint)
        return endpoint
