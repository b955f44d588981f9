"""A node's HTTP clients: one persistent connection pool behind an ``Agent`` for readiness probes,
asset pulls and anything the lean clients hand back (treq over it); the lean keep-alive client for
its own backends (:mod:`routerd.clients.backend_http`); and another for other nodes (forwards, relays
and the control calls, :mod:`routerd.clients.peer_http`).  Tests inject their own agent and treq client; the
backend and peer clients are then those.
"""

from __future__ import annotations

from typing import Any, cast

from treq.client import HTTPClient
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.iweb import IAgent

from routerd.clients.backend_http import BackendAgent
from routerd.clients.endpoints import DirectEndpoints
from routerd.clients.peer_http import PeerHTTP, peer_agent


class NodeClients:
    def __init__(self, reactor: Any, *, agent: Any = None, http: Any = None) -> None:
        self.pool = HTTPConnectionPool(reactor, persistent=True)
        self.pool.maxPersistentPerHost = 64
        self.pool.retryAutomatically = False
        # an IP address (a backend, most peers) is connected to directly: refused at once, not 0.3 s later
        self.agent: Any = agent if agent is not None else Agent.usingEndpointFactory(
            reactor, DirectEndpoints(reactor, connect_timeout=10), pool=self.pool)
        self.backend_agent: IAgent = self.agent if agent is not None else BackendAgent(reactor, self.agent)
        # treq for node-to-node calls and readiness probes (cookies/redirects handled by NodeClient)
        self.http = cast(Any, http if http is not None else HTTPClient(self.agent))
        #: Other nodes: forwards, relays, events and grants on ``peer_agent`` (the peers' lean
        #: routes), the other control calls on ``control_agent``; ``peer_http`` picks by path.
        self.peer_agent: IAgent = self.agent if agent is not None else peer_agent(reactor, self.agent)
        self.control_agent: IAgent = self.agent if agent is not None else peer_agent(reactor, self.agent)
        self.peer_http: Any = http if http is not None else PeerHTTP(self.peer_agent, self.control_agent)

    def close(self) -> Any:
        """Close the lean clients' idle connections and the pool's cached ones (a Deferred)."""
        for lean in (self.backend_agent, self.peer_agent, self.control_agent):
            if isinstance(lean, BackendAgent):
                lean.close()
        return self.pool.closeCachedConnections()
