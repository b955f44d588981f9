"""The lending reports: a node's decision rows and summary, and the master's site-wide merge of them
(contract §6 node API, §7 site API; the WebUI Lending tab and Nodes page read these).

* A node's decisions: its rows newest first (the log's buffer flushed first so recent rows show).
* A node's summary: ``{node_id, build_version, settings_fingerprint, held_requests}``.
* Site decisions: the rows of every selected node merged newest first and truncated to ``limit``,
  plus ``node_errors: [{node_id, error}]`` for nodes that are unknown, unhealthy or did not answer.
* Site states: every node's ``/state`` (the Nodes page) with ``node_errors``.
* Site summary: ``{nodes: [{node_id, build_version, settings_fingerprint, in_sync, held_requests}],
  leases}`` (+ ``node_errors``); ``leases`` are the coordinator's live leases with ``expires_in_ms``.

Remote nodes are asked at most ``FANOUT`` at a time, each within ``NODE_TIMEOUT_S``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol
from urllib.parse import urlencode

import attrs
from twisted.internet import defer
from twisted.python.failure import Failure

from routerd import __version__
from routerd.cluster.fanout import failure_text, fan_out
from routerd.paths import NODE_DECISIONS, NODE_STATE, NODE_SUMMARY
from routerd.registry.records import NodeInfo
from routerd.store.decisions import DEFAULT_LIMIT

#: Remote nodes asked at once, and how long each may take.
FANOUT = 8
NODE_TIMEOUT_S = 5.0



class _Fingerprinted(Protocol):
    def fingerprint(self) -> str: ...


class _Lending(Protocol):
    @property
    def settings(self) -> _Fingerprinted: ...

    @property
    def decisions(self) -> Any: ...  # a DecisionLog once the store is open, else None


class _DecisionSource(Protocol):
    def query_decisions(self, *, lane: str | None = None, outcome: str | None = None,
                        kind: str | None = None, limit: int = DEFAULT_LIMIT,
                        since_ms: int | None = None) -> defer.Deferred[list[dict[str, Any]]]: ...


class _Registry(Protocol):
    def nodes(self) -> Sequence[NodeInfo]: ...


class _Client(Protocol):
    def get_json(self, base: str, path: str, *, timeout: float | None = None) -> defer.Deferred[Any]: ...


class _Master(Protocol):
    @property
    def registry(self) -> _Registry: ...

    @property
    def client(self) -> _Client: ...


class _Leases(Protocol):
    def live_leases(self) -> list[dict[str, Any]]: ...


class DecisionsNode(Protocol):
    """The parts of ``routerd.node.Node`` a node's own reports read."""

    @property
    def node_id(self) -> str: ...

    @property
    def store(self) -> _DecisionSource | None: ...

    @property
    def site(self) -> _Master | None: ...

    @property
    def lending(self) -> _Lending: ...


class SiteNode(DecisionsNode, Protocol):
    """A node serving the site: its site agent is there (the HTTP edge checks before calling); the
    coordinator is a master's only."""

    @property
    def site(self) -> _Master: ...

    @property
    def coordinator(self) -> _Leases | None: ...


@attrs.frozen
class DecisionQuery:
    """Validated filters of a decisions query."""

    lane: str | None = None
    outcome: str | None = None
    kind: str | None = None
    limit: int = DEFAULT_LIMIT
    since_ms: int | None = None

    def params(self) -> dict[str, str]:
        """The query-string parameters that reproduce these filters on a node."""
        out: dict[str, str] = {}
        for name in ("lane", "outcome", "kind"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        out["limit"] = str(self.limit)
        if self.since_ms is not None:
            out["since_ms"] = str(self.since_ms)
        return out


async def local_decisions(node: DecisionsNode, query: DecisionQuery) -> list[dict[str, Any]]:
    """This node's rows for ``query`` (the log's buffer flushed first); [] before the store opens."""
    filters: dict[str, Any] = {"lane": query.lane, "outcome": query.outcome, "kind": query.kind,
                               "limit": query.limit, "since_ms": query.since_ms}
    decisions = node.lending.decisions
    if decisions is not None:
        rows: list[dict[str, Any]] = await decisions.query(**filters)
        return rows
    if node.store is not None:
        return await node.store.query_decisions(**filters)
    return []


def local_summary(node: DecisionsNode) -> dict[str, Any]:
    """This node's lending summary (node API document)."""
    held: list[dict[str, Any]] = getattr(node.lending, "held_requests", lambda: [])()
    # the settings folded with the guardian models (LendingService.sync_fingerprint), so in_sync
    # covers both; a lending without guardians reports the settings' own fingerprint
    fingerprint = getattr(node.lending, "sync_fingerprint", node.lending.settings.fingerprint)()
    return {"node_id": node.node_id, "build_version": __version__,
            "settings_fingerprint": fingerprint,
            "held_requests": list(held or [])}


def _newest_first(row: dict[str, Any]) -> tuple[int, str, int]:
    # sorted() is stable and runs ascending: negate the numbers, and order ties by node id
    recorded = row.get("recorded_at")
    ident = row.get("id")
    return (-(recorded if isinstance(recorded, int) else 0), str(row.get("node_id", "")),
            -(ident if isinstance(ident, int) else 0))


async def _ask_all(master: _Master, nodes: Sequence[NodeInfo],
                   path: str) -> list[tuple[NodeInfo, Any | Failure]]:
    """GET ``path`` from every node, ``FANOUT`` at a time; each node's answer or failure."""
    def ask(node: NodeInfo) -> defer.Deferred[Any]:
        return master.client.get_json(node.node_url, path, timeout=NODE_TIMEOUT_S)

    return await fan_out(nodes, ask, FANOUT)


def _select_nodes(master: _Master, wanted: Sequence[str] | None,
                  own_id: str) -> tuple[bool, list[NodeInfo], list[dict[str, str]]]:
    """(include the master itself, healthy remotes to ask, errors for unknown/unhealthy ones)."""
    known = {n.node_id: n for n in master.registry.nodes() if n.node_id != own_id}
    if wanted is None:
        names = sorted(known)
        include_self = True
    else:
        names = sorted({w for w in wanted if w != own_id})
        include_self = own_id in wanted
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


#: The node selection every site report makes (analytics and load errors too).
select_nodes = _select_nodes


async def site_decisions(node: SiteNode, query: DecisionQuery,
                         node_ids: Sequence[str] | None, total_limit: int | None = None) -> dict[str, Any]:
    """The site decisions document: every selected node's rows merged newest first, truncated to
    ``total_limit`` rows (default: the query's own limit, which is also what each node is asked)."""
    master = node.site
    include_self, remotes, errors = _select_nodes(master, node_ids, node.node_id)
    rows: list[dict[str, Any]] = []
    if include_self:
        rows.extend(await local_decisions(node, query))
    path = NODE_DECISIONS + "?" + urlencode(query.params())
    for info, answer in await _ask_all(master, remotes, path):
        if isinstance(answer, Failure):
            errors.append({"node_id": info.node_id, "error": failure_text(answer)})
            continue
        records = answer.get("records") if isinstance(answer, dict) else None
        if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
            errors.append({"node_id": info.node_id, "error": "answer has no records list"})
            continue
        for record in records:
            if not record.get("node_id"):
                record["node_id"] = info.node_id
        rows.extend(records)
    rows.sort(key=_newest_first)
    errors.sort(key=lambda e: e["node_id"])
    return {"records": rows[:query.limit if total_limit is None else total_limit], "node_errors": errors}


async def site_summary(node: SiteNode) -> dict[str, Any]:
    """The site summary: every node's build, settings fingerprint and held requests; live leases."""
    master = node.site
    _include_self, remotes, errors = _select_nodes(master, None, node.node_id)
    own = local_summary(node)
    fingerprint = own["settings_fingerprint"]
    nodes = [own]
    for info, answer in await _ask_all(master, remotes, NODE_SUMMARY):
        if isinstance(answer, Failure):
            errors.append({"node_id": info.node_id, "error": failure_text(answer)})
            continue
        if not isinstance(answer, dict):
            errors.append({"node_id": info.node_id, "error": "summary answer is not an object"})
            continue
        held = answer.get("held_requests")
        nodes.append({"node_id": info.node_id,
                      "build_version": str(answer.get("build_version") or info.build_version),
                      "settings_fingerprint": str(answer.get("settings_fingerprint") or ""),
                      "held_requests": held if isinstance(held, list) else []})
    for entry in nodes:
        entry["in_sync"] = entry["settings_fingerprint"] == fingerprint
    nodes.sort(key=lambda e: str(e["node_id"]))
    leases = node.coordinator.live_leases() if node.coordinator is not None else []
    out: dict[str, Any] = {"nodes": nodes, "leases": leases}
    if errors:
        errors.sort(key=lambda e: e["node_id"])
        out["node_errors"] = errors
    return out


async def site_states(master: _Master, own_id: str, own_state: dict[str, Any]) -> dict[str, Any]:
    """Every node's ``/state`` (runtimes, active and held requests) in one document, the master's
    own first-hand: ``{states: [state], node_errors: [{node_id, error}]}``, sorted by node id."""
    _include_self, remotes, errors = _select_nodes(master, None, own_id)
    states = [own_state]
    for info, answer in await _ask_all(master, remotes, NODE_STATE):
        if isinstance(answer, Failure):
            errors.append({"node_id": info.node_id, "error": failure_text(answer)})
        elif not isinstance(answer, dict):
            errors.append({"node_id": info.node_id, "error": "state answer is not an object"})
        else:
            states.append({**answer, "node_id": info.node_id})
    states.sort(key=lambda s: str(s.get("node_id", "")))
    errors.sort(key=lambda e: e["node_id"])
    return {"states": states, "node_errors": errors}


__all__ = [
    "FANOUT",
    "NODE_TIMEOUT_S",
    "DecisionQuery",
    "DecisionsNode",
    "SiteNode",
    "local_decisions",
    "local_summary",
    "select_nodes",
    "site_decisions",
    "site_states",
    "site_summary",
]
