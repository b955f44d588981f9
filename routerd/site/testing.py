"""Fakes of what a site is built from, for tests (as ``treq.testing`` ships ``StubTreq``): a registry
of hand-made records and nodes, a node API client that answers by node URL and records every call,
and the master's agent holding both.  :func:`fake_site` puts them behind a real
:class:`~routerd.site.service.SiteService`, so a test exercises the real master-only check,
here-or-there rule and fan-out.
"""

from __future__ import annotations

from typing import Any

import attrs
from twisted.internet.defer import Deferred, fail, succeed

from routerd.errors import HTTPError
from routerd.paths import NODE_LOAD, NODE_UNLOAD
from routerd.registry.records import NodeInfo
from routerd.site.service import SiteService
from routerd.wire.records import ModelRecord
from routerd.wire.status import RuntimeStatus


def node_info(node_id: str, healthy: bool = True, url: str | None = None) -> NodeInfo:
    """A registered node (``http://<node_id>:1`` unless ``url`` is given)."""
    return NodeInfo(node_id=node_id, node_url=url or f"http://{node_id}:1", healthy=healthy,
                    build_version="1.0", protocol_version=1)


@attrs.define
class FakeRegistry:
    """The registry's read side over ``models`` and ``infos``."""

    models: list[ModelRecord] = attrs.Factory(list)
    infos: list[NodeInfo] = attrs.Factory(list)

    def records(self) -> list[ModelRecord]:
        return list(self.models)

    def nodes(self) -> list[NodeInfo]:
        return sorted(self.infos, key=lambda n: n.node_id)

    def node(self, node_id: str) -> NodeInfo | None:
        return next((n for n in self.infos if n.node_id == node_id), None)

    def node_urls(self) -> dict[str, str]:
        return {n.node_id: n.node_url for n in self.infos}

    def add_node(self, node_id: str, healthy: bool = True, url: str | None = None) -> NodeInfo:
        info = node_info(node_id, healthy, url)
        self.remove_node(node_id)
        self.infos.append(info)
        return info

    def remove_node(self, node_id: str) -> None:
        self.infos[:] = [n for n in self.infos if n.node_id != node_id]


@attrs.define
class FakeClient:
    """A node API client answering by node URL: a JSON value, an exception, a Deferred the test
    fires later, or a callable of the path; a URL without an answer answers ``{}`` and one in
    ``failing`` fails.  GETs and DELETEs are recorded in ``calls`` as (url, path, timeout), POSTs in
    ``posts`` as (url, path, body)."""

    answers: dict[str, Any] = attrs.Factory(dict)
    calls: list[tuple[str, str, float | None]] = attrs.Factory(list)
    posts: list[tuple[str, str, Any]] = attrs.Factory(list)
    failing: set[str] = attrs.Factory(set)
    operation_timeout: float = 30.0

    def _answer(self, base: str, path: str) -> Deferred[Any]:
        if base in self.failing:
            return fail(ConnectionError(f"{base} is down"))
        answer = self.answers.get(base, {})
        if isinstance(answer, Deferred):
            return answer
        if isinstance(answer, Exception):
            return fail(answer)
        return succeed(answer(path) if callable(answer) else answer)

    def get_json(self, base: str, path: str, *, timeout: float | None = None) -> Deferred[Any]:
        self.calls.append((base, path, timeout))
        return self._answer(base, path)

    def delete_json(self, base: str, path: str, *, timeout: float | None = None) -> Deferred[Any]:
        self.calls.append((base, path, timeout))
        return self._answer(base, path)

    def post_json(self, base: str, path: str, body: Any, *, timeout: float | None = None) -> Deferred[Any]:
        self.posts.append((base, path, body))
        return self._answer(base, path)

    def load(self, url: str, model: str) -> Deferred[Any]:
        return self.post_json(url, NODE_LOAD, {"model": model})

    def unload(self, url: str, model: str | None = None, target: str | None = None) -> Deferred[Any]:
        return self.post_json(url, NODE_UNLOAD, {"model": model, "target": target})

    def to(self, path: str) -> list[tuple[str, Any]]:
        """The (url, body) of every POST to ``path``."""
        return [(base, body) for base, p, body in self.posts if p == path]


@attrs.define
class FakeAgent:
    """The master's agent: its registry and client, the runtime statuses it collects (``polls``
    counts the collections; ``gate`` holds them until fired; the next ``failures`` of them raise),
    the registry re-reads it was asked for (``polled_all``) and the registrations it kept."""

    registry: FakeRegistry = attrs.Factory(FakeRegistry)
    client: FakeClient = attrs.Factory(FakeClient)
    status: dict[str, RuntimeStatus] = attrs.Factory(dict)
    polls: int = 0
    gate: Deferred[None] | None = None
    failures: int = 0
    polled_all: int = 0
    registered: list[Any] = attrs.Factory(list)

    async def statuses(self) -> dict[str, RuntimeStatus]:
        self.polls += 1
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("own runtime status failed")
        if self.gate is not None:
            await self.gate
        return dict(self.status)

    def poll_all(self) -> Deferred[None]:
        self.polled_all += 1
        return succeed(None)

    def register(self, body: Any) -> dict[str, Any]:
        self.registered.append(body)
        return {"ok": True, "protocol_version": 1}

    async def node_json(self, node_id: str, path: str) -> Any:
        info = self.registry.node(node_id)
        if info is None:
            raise HTTPError(404, f"node {node_id!r} is not known", "not_found", "node_not_found")
        return await self.client.get_json(info.node_url, path)


def fake_site(node_id: str = "master", agent: FakeAgent | None = None, *,
              role: str = "master") -> SiteService:
    """The site service of a node in ``role`` over a :class:`FakeAgent` (a new one unless given); a
    slave has none."""
    if role == "slave":
        return SiteService(node_id, None, role)
    return SiteService(node_id, agent if agent is not None else FakeAgent(), role)


def agent_of(site: SiteService) -> FakeAgent:
    """The fake agent behind ``site``."""
    assert isinstance(site.agent, FakeAgent)
    return site.agent


__all__ = ["FakeAgent", "FakeClient", "FakeRegistry", "agent_of", "fake_site", "node_info"]
