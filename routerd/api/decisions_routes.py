"""Decision log and lending summary routes: node API (contract §6) and site API (§7).

Node API (cluster token):

* ``GET /router/v1/node/offload/decisions?lane&outcome&kind&limit&since_ms`` → ``{"records"}``,
  this node's rows newest first (the buffer is flushed first so recent rows show).
* ``GET /router/v1/node/offload/summary`` → ``{node_id, build_version, settings_fingerprint,
  held_requests}``.

Site API (master only; 404 elsewhere):

* ``GET /router/v1/site/offload/decisions?lane&outcome&kind&node_id…&limit&since_ms`` → the rows of
  every selected node merged newest first and truncated to ``limit`` (default 500), plus
  ``node_errors: [{node_id, error}]`` for nodes that are unknown, unhealthy or did not answer.
* ``GET /router/v1/site/offload/summary`` → ``{nodes: [{node_id, build_version,
  settings_fingerprint, in_sync, held_requests}], leases}`` (+ ``node_errors`` when a node failed).

Remote nodes are asked at most ``FANOUT`` at a time, each within ``NODE_TIMEOUT_S``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Protocol
from urllib.parse import urlencode

import attrs
from twisted.internet import defer
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest

from routerd import __version__
from routerd.api.errors import api_app, master_only
from routerd.api.jsonio import json_response
from routerd.errors import HTTPError
from routerd.lending.decisions import ALL_OUTCOMES, KINDS
from routerd.registry.records import NodeInfo
from routerd.store.decisions import DEFAULT_LIMIT, MAX_LIMIT
from routerd.wire.lending import LANES

#: Remote nodes asked at once, and how long each may take.
FANOUT = 8
NODE_TIMEOUT_S = 5.0
#: Rows the site query returns when no ``limit`` is given.
SITE_DEFAULT_LIMIT = 500

NODE_DECISIONS = "/router/v1/node/offload/decisions"
NODE_SUMMARY = "/router/v1/node/offload/summary"
SITE_DECISIONS = "/router/v1/site/offload/decisions"
SITE_SUMMARY = "/router/v1/site/offload/summary"

_DIGITS = re.compile(r"[0-9]+")


# -- what the routes use of the node ---------------------------------------------------------------


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


class DecisionsNode(Protocol):
    """The parts of ``routerd.node.Node`` these routes read."""

    @property
    def node_id(self) -> str: ...

    @property
    def store(self) -> _DecisionSource | None: ...

    @property
    def master(self) -> _Master | None: ...

    @property
    def lending(self) -> _Lending: ...


# -- query parameters ------------------------------------------------------------------------------


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


def _args(request: IRequest, name: str) -> list[str]:
    values = getattr(request, "args", {}).get(name.encode(), [])
    return [v.decode("utf-8", "replace") for v in values]


def _arg(request: IRequest, name: str) -> str | None:
    """The first non-empty value of ``name`` (an empty value counts as absent)."""
    for value in _args(request, name):
        if value.strip():
            return value.strip()
    return None


def _choice(request: IRequest, name: str, allowed: Sequence[str] | frozenset[str]) -> str | None:
    value = _arg(request, name)
    if value is not None and value not in allowed:
        raise HTTPError(400, f"{name} must be one of {', '.join(sorted(allowed))}, got {value!r}",
                        "invalid_request_error", "invalid_parameter")
    return value


def parse_query(request: IRequest, default_limit: int) -> DecisionQuery:
    """The decisions query of ``request``; ``HTTPError`` 400 naming the first bad parameter."""
    lane = _choice(request, "lane", LANES)
    kind = _choice(request, "kind", KINDS)
    outcome = _choice(request, "outcome", ALL_OUTCOMES)
    limit = default_limit
    text = _arg(request, "limit")
    if text is not None:
        if not _DIGITS.fullmatch(text) or not 1 <= int(text) <= MAX_LIMIT:
            raise HTTPError(400, f"limit must be an integer from 1 to {MAX_LIMIT}, got {text!r}",
                            "invalid_request_error", "invalid_parameter")
        limit = int(text)
    since_ms: int | None = None
    text = _arg(request, "since_ms")
    if text is not None:
        if not _DIGITS.fullmatch(text):
            raise HTTPError(400, f"since_ms must be a non-negative integer, got {text!r}",
                            "invalid_request_error", "invalid_parameter")
        since_ms = int(text)
    return DecisionQuery(lane=lane, outcome=outcome, kind=kind, limit=limit, since_ms=since_ms)


# -- documents -------------------------------------------------------------------------------------




def _master(node: DecisionsNode) -> _Master:
    if node.master is None:
        raise master_only()
    return node.master


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
    return {"node_id": node.node_id, "build_version": __version__,
            "settings_fingerprint": node.lending.settings.fingerprint(),
            "held_requests": list(held or [])}


def _newest_first(row: dict[str, Any]) -> tuple[int, str, int]:
    # sorted() is stable and runs ascending: negate the numbers, and order ties by node id
    recorded = row.get("recorded_at")
    ident = row.get("id")
    return (-(recorded if isinstance(recorded, int) else 0), str(row.get("node_id", "")),
            -(ident if isinstance(ident, int) else 0))


async def _fan_out(master: _Master, nodes: Sequence[NodeInfo],
                   path: str) -> list[tuple[NodeInfo, Any | Failure]]:
    """GET ``path`` from every node, ``FANOUT`` at a time; each node's answer or failure."""
    semaphore = defer.DeferredSemaphore(FANOUT)
    calls = [semaphore.run(master.client.get_json, n.node_url, path, timeout=NODE_TIMEOUT_S)
             for n in nodes]
    results = await defer.DeferredList(calls, consumeErrors=True)
    return [(n, value) for n, (_ok, value) in zip(nodes, results, strict=True)]


def _error_text(failure: Failure) -> str:
    reason = getattr(failure.value, "reason", None)
    return str(reason) if reason else (failure.getErrorMessage() or repr(failure.value))


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


async def site_decisions(node: DecisionsNode, query: DecisionQuery,
                         node_ids: Sequence[str] | None) -> dict[str, Any]:
    """The site decisions document: every selected node's rows merged newest first."""
    master = _master(node)
    include_self, remotes, errors = _select_nodes(master, node_ids, node.node_id)
    rows: list[dict[str, Any]] = []
    if include_self:
        rows.extend(await local_decisions(node, query))
    path = NODE_DECISIONS + "?" + urlencode(query.params())
    for info, answer in await _fan_out(master, remotes, path):
        if isinstance(answer, Failure):
            errors.append({"node_id": info.node_id, "error": _error_text(answer)})
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
    return {"records": rows[:query.limit], "node_errors": errors}


async def site_summary(node: DecisionsNode) -> dict[str, Any]:
    """The site summary: every node's build, settings fingerprint and held requests; live leases."""
    master = _master(node)
    _include_self, remotes, errors = _select_nodes(master, None, node.node_id)
    own = local_summary(node)
    fingerprint = own["settings_fingerprint"]
    nodes = [own]
    for info, answer in await _fan_out(master, remotes, NODE_SUMMARY):
        if isinstance(answer, Failure):
            errors.append({"node_id": info.node_id, "error": _error_text(answer)})
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
    leases: list[dict[str, Any]] = getattr(node.lending, "live_leases", lambda: [])()
    out: dict[str, Any] = {"nodes": nodes, "leases": list(leases or [])}
    if errors:
        errors.sort(key=lambda e: e["node_id"])
        out["node_errors"] = errors
    return out


# -- routes ----------------------------------------------------------------------------------------


class DecisionsAPI:
    """The four decision-log and summary routes."""

    app = api_app()

    def __init__(self, node: DecisionsNode) -> None:
        self.node = node

    @app.route(NODE_DECISIONS, methods=["GET"])
    async def node_decisions(self, request: IRequest) -> bytes:
        query = parse_query(request, DEFAULT_LIMIT)
        return json_response(request, {"records": await local_decisions(self.node, query)})

    @app.route(NODE_SUMMARY, methods=["GET"])
    def node_summary(self, request: IRequest) -> bytes:
        return json_response(request, local_summary(self.node))

    @app.route(SITE_DECISIONS, methods=["GET"])
    async def site_decisions(self, request: IRequest) -> bytes:
        _master(self.node)
        query = parse_query(request, SITE_DEFAULT_LIMIT)
        wanted = [v.strip() for v in _args(request, "node_id") if v.strip()]
        return json_response(request, await site_decisions(self.node, query, wanted or None))

    @app.route(SITE_SUMMARY, methods=["GET"])
    async def site_summary(self, request: IRequest) -> bytes:
        return json_response(request, await site_summary(self.node))
