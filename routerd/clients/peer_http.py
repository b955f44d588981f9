"""The lean client for calls to other nodes: forwards, relays and the control calls
(queue events, grants, registration, status polls) go over the keep-alive client the backends use
(:class:`~routerd.clients.backend_http.BackendAgent`) instead of twisted's ``Agent`` and treq.

One :class:`~routerd.clients.backend_http.BackendAgent` serves every peer: a pool per peer node
(host, port) keeping at most :data:`MAX_IDLE_PER_PEER` idle connections, the backend client's
connect timeout, and its retry-before-send rule (a reused connection that dies before any answer
byte is retried once on a fresh one; nothing is ever sent twice once the peer answered).  An
``https://`` peer, or a body that is not in memory, goes to the fallback ``Agent``.

:class:`PeerHTTP` is the "treq-like" face :class:`~routerd.clients.node_client.NodeClient` calls: its
``request`` takes treq's arguments and fires with the agent's response (``code``, ``headers``,
``length``, ``deliverBody``), which is all the node client reads.

Two pools, because the receiving lean channel hands a connection to twisted.web for good at its
first request it does not serve itself (a ``GET``, a registration, a push).  Forwards, relays,
queue events and grants (:data:`LEAN_PATHS`: the receiver's lean routes) share the ``lean`` agent,
whose connections never carry anything else, so the peer's lean channel serves every one of them;
the other control calls (status polls, registration, loads, pushes) go on the ``control`` agent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from twisted.internet.defer import Deferred
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent

from routerd.clients.backend_http import BackendAgent
from routerd.paths import LEAN_PATHS
from routerd.routing.body import BytesProducer

__all__ = ["LEAN_PATHS", "MAX_IDLE_PER_PEER", "PeerHTTP", "is_lean_path", "peer_agent"]

#: Idle keep-alive connections kept per peer node (the bound twisted's pool had per host).
MAX_IDLE_PER_PEER = 64


def peer_agent(reactor: Any, fallback: IAgent) -> BackendAgent:
    """The lean agent for other nodes (see the module docstring)."""
    return BackendAgent(reactor, fallback, max_idle_per_backend=MAX_IDLE_PER_PEER)


def is_lean_path(url: str) -> bool:
    """Whether ``url``'s path is one of the peer's lean routes (:data:`LEAN_PATHS`)."""
    scheme_end = url.find("//")
    slash = url.find("/", scheme_end + 2 if scheme_end >= 0 else 0)
    return slash >= 0 and url.startswith(LEAN_PATHS, slash)


class PeerHTTP:
    """treq's ``request`` over the peer agents: JSON control calls (see the module docstring)."""

    def __init__(self, lean: IAgent, control: IAgent) -> None:
        self.lean = lean
        self.control = control

    def request(self, method: str, url: str, *,
                headers: Mapping[bytes, Sequence[bytes]] | None = None, data: bytes | None = None,
                **_treq_options: Any) -> Deferred[Any]:
        """Send ``method url`` with ``headers`` and the body ``data``; fires with the response.
        Redirects are not followed (the node client follows them by hand); treq's other options
        (``allow_redirects``, ``unbuffered``) have nothing to change here."""
        raw = Headers()
        for name, values in (headers or {}).items():
            for value in values:
                raw.addRawHeader(name, value)
        producer = BytesProducer(data) if data is not None else None
        agent = self.lean if is_lean_path(url) else self.control
        return agent.request(method.encode("ascii"), url.encode("utf-8"), raw, producer)
