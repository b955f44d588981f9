"""A node's HTTP clients: one persistent connection pool behind an ``Agent`` for node-to-node calls
and readiness probes (treq over it), and the lean keep-alive client for its own backends
(issue 14).  Tests inject their own agent and treq client; the backend client is then that agent.
"""

from __future__ import annotations

from typing import Any, cast

from treq.client import HTTPClient
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.iweb import IAgent

from routerd.serve.backend_http import BackendAgent


class NodeClients:
    def __init__(self, reactor: Any, *, agent: Any = None, http: Any = None) -> None:
        self.pool = HTTPConnectionPool(reactor, persistent=True)
        self.pool.maxPersistentPerHost = 64
        self.pool.retryAutomatically = False
        self.agent: Any = agent if agent is not None else Agent(reactor, pool=self.pool, connectTimeout=10)
        self.backend_agent: IAgent = self.agent if agent is not None else BackendAgent(reactor, self.agent)
        # treq for node-to-node calls and readiness probes (cookies/redirects handled by NodeClient)
        self.http = cast(Any, http if http is not None else HTTPClient(self.agent))

    def close(self) -> Any:
        """Close the backend client's connections and the pool's cached ones (a Deferred)."""
        if isinstance(self.backend_agent, BackendAgent):
            self.backend_agent.close()
        return self.pool.closeCachedConnections()
