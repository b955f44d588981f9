"""The site service: the master-only check, the here-or-there rule and the fan-out to every node.

A site route is served by a master and by a standalone node (a site of one); on a slave it answers
404 (:meth:`SiteService.require`).  A route about one named node runs here when the node is this one
and otherwise through the node API of that node (:meth:`SiteService.on_node`); a remote node's error
is answered as the node gave it, or 502 when it did not answer (:func:`remote_error`).  Reports ask
every healthy node at once, a bounded number at a time (:meth:`SiteService.ask_all`), each within
``NODE_TIMEOUT_S``; unknown and unhealthy nodes are named in ``node_errors``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

import attrs
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from routerd.clients.node_client import ClusterError, RemoteError
from routerd.cluster.fanout import failure_text, fan_out
from routerd.errors import HTTPError
from routerd.registry.records import NodeInfo
from routerd.wire.records import ModelRecord

T = TypeVar("T")

#: Remote nodes asked at once, and how long each may take.
FANOUT = 8
NODE_TIMEOUT_S = 5.0


class SiteRegistry(Protocol):
    """The registry's read side: every node and every model the site knows."""

    def nodes(self) -> Sequence[NodeInfo]: ...

    def node(self, node_id: str) -> NodeInfo | None: ...

    def node_urls(self) -> dict[str, str]: ...

    def records(self) -> Sequence[ModelRecord]: ...


class SiteClient(Protocol):
    """The node API client the site calls other nodes with."""

    @property
    def operation_timeout(self) -> float: ...

    def get_json(self, base: str, path: str, *, timeout: float | None = None) -> Deferred[Any]: ...

    def post_json(self, base: str, path: str, body: Any, *,
                  timeout: float | None = None) -> Deferred[Any]: ...

    def delete_json(self, base: str, path: str, *, timeout: float | None = None) -> Deferred[Any]: ...

    def load(self, url: str, model: str) -> Deferred[Any]: ...

    def unload(self, url: str, model: str | None = None, target: str | None = None) -> Deferred[Any]: ...


class SiteAgent(Protocol):
    """The master's agent (``routerd.cluster.master.MasterAgent`` is one), or a site of one's."""

    @property
    def registry(self) -> Any: ...  # a SiteRegistry

    @property
    def client(self) -> Any: ...  # a SiteClient

    def poll_all(self) -> Deferred[None]: ...

    def register(self, body: Any) -> dict[str, Any]: ...

    async def node_json(self, node_id: str, path: str) -> Any: ...


def master_only(master_url: str | None = None) -> HTTPError:
    """A site route on a slave (reference §12), naming the slave's master when it is known (the slave's
    WebUI links to it)."""
    where = f"; this node's master is {master_url}" if master_url else ""
    return HTTPError(404, "site routes are served by the master only" + where, "not_found", "not_found")


def not_master() -> HTTPError:
    """A node API call only the master answers (registration, lending's loop) on another node."""
    return HTTPError(409, "this node is not the master", "cluster_error", "not_master")


def remote_error(exc: ClusterError, who: str = "a node") -> HTTPError:
    """The answer to a failed call on another node: its own error as given, or 502 naming ``who``."""
    if isinstance(exc, RemoteError):
        return HTTPError(exc.status, exc.message, exc.type, exc.code)
    return HTTPError(502, f"{who} did not answer: {exc.reason}", "backend_error", "node_unreachable")


async def remote_answer(work: Awaitable[T], who: str = "a node") -> T:
    """Await a call that talks to other nodes; their errors answered by :func:`remote_error`."""
    try:
        return await work
    except ClusterError as exc:
        raise remote_error(exc, who) from None


@attrs.frozen
class Gathered:
    """What :meth:`SiteService.ask_all` brings back: whether this node was asked for too, each asked
    node's answer or failure, and ``node_errors`` so far (unknown and unhealthy nodes)."""

    include_self: bool
    answers: list[tuple[NodeInfo, Any]]
    errors: list[dict[str, str]]

    def replies(self, what: str, wanted: Callable[[Any], bool]) -> list[tuple[NodeInfo, Any]]:
        """The answers that are ``wanted``; each failure or unwanted answer named in ``errors``
        (``what`` says what the answer lacks)."""
        out: list[tuple[NodeInfo, Any]] = []
        for info, answer in self.answers:
            if isinstance(answer, Failure):
                self.errors.append({"node_id": info.node_id, "error": failure_text(answer)})
            elif not wanted(answer):
                self.errors.append({"node_id": info.node_id, "error": what})
            else:
                out.append((info, answer))
        return out

    def node_errors(self) -> list[dict[str, str]]:
        return sorted(self.errors, key=lambda e: e["node_id"])


@attrs.define
class SiteService:
    """What this node does for its site.  ``agent`` is the master's agent, a standalone node's site
    of one, or None on a slave; ``role`` is the node's (``master``, ``standalone`` or ``slave``)."""

    node_id: str
    agent: SiteAgent | None
    role: str = "master"
    #: A slave's ``cluster.master_url`` (named by its 404 on a site route); None elsewhere.
    master_url: str | None = None

    @property
    def serves(self) -> bool:
        """This node serves a site (a master or a standalone node)."""
        return self.agent is not None

    @property
    def master(self) -> SiteAgent | None:
        """The master's agent; None on a standalone node and on a slave."""
        return self.agent if self.role == "master" else None

    def require(self) -> SiteAgent:
        """The site's agent; 404 on a slave (the one master-only check)."""
        if self.agent is None:
            raise master_only(self.master_url)
        return self.agent

    def require_master(self) -> SiteAgent:
        """The master's agent; 409 ``not_master`` elsewhere."""
        if self.master is None:
            raise not_master()
        return self.master

    @property
    def registry(self) -> SiteRegistry:
        registry: SiteRegistry = self.require().registry
        return registry

    @property
    def client(self) -> SiteClient:
        client: SiteClient = self.require().client
        return client

    def is_here(self, node_id: object) -> bool:
        """``node_id`` names this node (or no node: this one)."""
        return node_id in (None, "", self.node_id)

    def node(self, node_id: object) -> NodeInfo:
        """The registered node ``node_id`` names; 400 for a non-string, 404 for an unknown one."""
        if not isinstance(node_id, str):
            raise HTTPError(400, "node_id must be a string")
        info = self.registry.node(node_id)
        if info is None:
            raise HTTPError(404, f"node {node_id[:80]!r} is not known", "not_found", "node_not_found")
        return info

    async def on_node(self, node_id: object, here: Callable[[], Awaitable[T]],
                      there: Callable[[NodeInfo], Awaitable[Any]]) -> Any:
        """Run an operation on the node ``node_id`` names: ``here()`` on this node, else
        ``there(info)`` through the node API with a remote error answered by :func:`remote_error`."""
        self.require()
        if self.is_here(node_id):
            return await here()
        info = self.node(node_id)
        return await remote_answer(there(info), f"node {info.node_id!r}")

    def select(self, wanted: Sequence[str] | None) -> tuple[bool, list[NodeInfo], list[dict[str, str]]]:
        """(ask this node too, healthy remote nodes to ask, errors for unknown/unhealthy ones);
        ``wanted`` None asks every node."""
        known = {n.node_id: n for n in self.registry.nodes() if n.node_id != self.node_id}
        if wanted is None:
            names, include_self = sorted(known), True
        else:
            names, include_self = sorted({w for w in wanted if w != self.node_id}), self.node_id in wanted
        remotes: list[NodeInfo] = []
        errors: list[dict[str, str]] = []
        for name in names:
            info = known.get(name)
            if info is None:
                errors.append({"node_id": name, "error": "node is not known"})
            elif not info.healthy:
                errors.append({"node_id": name, "error": "node is unhealthy"})
            else:
                remotes.append(info)
        return include_self, remotes, errors

    async def ask_all(self, wanted: Sequence[str] | None,
                      ask: Callable[[SiteClient, NodeInfo], Deferred[Any]]) -> Gathered:
        """``ask(client, node)`` of every selected remote node, ``FANOUT`` at a time."""
        include_self, remotes, errors = self.select(wanted)
        client = self.client
        answers = await fan_out(remotes, lambda info: ask(client, info), FANOUT)
        return Gathered(include_self, list(answers), errors)

    async def get_all(self, wanted: Sequence[str] | None, path: str) -> Gathered:
        """GET ``path`` from every selected remote node (:meth:`ask_all`)."""
        return await self.ask_all(wanted, lambda client, info: client.get_json(info.node_url, path,
                                                                               timeout=NODE_TIMEOUT_S))


__all__ = ["FANOUT", "NODE_TIMEOUT_S", "Gathered", "SiteAgent", "SiteClient", "SiteRegistry", "SiteService",
           "master_only", "not_master", "remote_answer", "remote_error"]
