"""The site's analytics and load errors (contract §7, §9): every node's answer merged.

The master (or a standalone node, a site of one) asks every healthy node's node API at once
(``routerd.cluster.fanout``), its own answer taken first-hand, and merges: model rows, node rows and
series points are summed with their latency histograms, so percentiles and rates are those of the
whole site, not an average of averages.  Nodes that are unknown, unhealthy or did not answer are
listed in ``node_errors``; the others still answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

import attrs

from routerd.errors import HTTPError
from routerd.inference.analytics import LOAD_ERRORS_KEPT, series_point
from routerd.paths import NODE_ANALYTICS, NODE_ANALYTICS_FLUSH, NODE_LOAD_ERRORS, NODE_RECENT
from routerd.site.names import SiteNames
from routerd.site.service import NODE_TIMEOUT_S, SiteService
from routerd.store.analytics import ANALYTICS_LANES, FIGURES, PERIODS, Query, Sums, figures


def parse_query(args: Mapping[str, str | None]) -> Query:
    """An analytics query from request parameters; 400 naming a bad ``period`` or ``lane``."""
    period = args.get("period") or "24h"
    if period not in PERIODS:
        raise HTTPError(400, f"period must be one of {', '.join(PERIODS)}, got {period!r}",
                        "invalid_request_error", "invalid_parameter")
    lane = args.get("lane") or None
    if lane is not None and lane not in ANALYTICS_LANES:
        raise HTTPError(400, f"lane must be one of {', '.join(ANALYTICS_LANES)}, got {lane!r}",
                        "invalid_request_error", "invalid_parameter")
    return Query(period=period, model=args.get("model") or None, lane=lane,
                 node_id=args.get("node_id") or None)


def node_params(query: Query, locals_: Sequence[str] = ()) -> str:
    """The node API query string reproducing ``query`` (a node filters by model and lane; with
    ``locals_``, its local IDs the model's public ID covers)."""
    params = [("period", query.period)]
    if query.model is not None:
        params.append(("model", query.model))
        params.extend(("local", local) for local in locals_)
    if query.lane is not None:
        params.append(("lane", query.lane))
    return urlencode(params)


def _wanted(node_id: str | None) -> list[str] | None:
    return None if node_id is None else [node_id]


async def site_analytics(site: SiteService, own: Callable[[Query], Awaitable[dict[str, Any]]],
                         query: Query, now_ms: int) -> dict[str, Any]:
    """The site analytics document: every selected node's answer merged (contract §9), each model
    under its public ID (a public image ID in the filter names its model)."""
    names = SiteNames(site.registry.records())
    if query.model is not None:
        query = attrs.evolve(query, model=names.canonical(query.model))
    gathered = await site.ask_all(_wanted(query.node_id), lambda client, info: client.get_json(
        info.node_url, NODE_ANALYTICS + "?" + node_params(query, names.locals_of(query.model, info.node_id)),
        timeout=NODE_TIMEOUT_S))
    docs: list[dict[str, Any]] = []
    if gathered.include_self:
        docs.append(await own(attrs.evolve(query, locals=names.locals_of(query.model, site.node_id))))
    for info, answer in gathered.replies("analytics answer has no models list",
                                         lambda a: isinstance(a, dict) and isinstance(a.get("models"), list)):
        docs.append({**answer, "node_id": info.node_id})
    document = merge(docs, query, now_ms, names)
    document["node_errors"] = gathered.node_errors()
    return document


def merge(docs: Sequence[Mapping[str, Any]], query: Query, now_ms: int,
          names: SiteNames | None = None) -> dict[str, Any]:
    """Node analytics documents → one site document (pure; contract §9).  With ``names``, a model
    row a node recorded under its local name is the public ID's (rows that then share a key are
    summed)."""
    since, until, level, width = query.window(now_ms)
    total = Sums()
    keyed: dict[tuple[str, str, str, str], list[Mapping[str, Any]]] = {}
    nodes: list[dict[str, Any]] = []
    points: dict[int, tuple[Sums, dict[str, int]]] = {}
    for doc in docs:
        node_id = str(doc.get("node_id", ""))
        for row in _objects(doc.get("models")):
            node = str(row.get("node_id") or node_id)
            model = str(row.get("model", ""))
            local = str(row.get("local_id") or model)
            if names is not None:
                model = names.of_row(node, model, local)
            keyed.setdefault((model, node, local, str(row.get("lane", ""))), []).append(row)
        totals = doc.get("totals")
        own = Sums.from_json(totals if isinstance(totals, dict) else {})
        total.merge(own)
        nodes.append({"node_id": node_id, "enabled": doc.get("enabled") is True, **figures(own)})
        for point in _objects(doc.get("series")):
            bucket = point.get("t_ms")
            if not isinstance(bucket, int) or isinstance(bucket, bool) or bucket < since:
                continue
            bucket -= bucket % width
            at, by_lane = points.setdefault(bucket, (Sums(), {}))
            at.merge(Sums.from_json(point))
            lanes = point.get("by_lane")
            for lane in ANALYTICS_LANES:
                count = lanes.get(lane, 0) if isinstance(lanes, dict) else 0
                if isinstance(count, int) and not isinstance(count, bool):
                    by_lane[lane] = by_lane.get(lane, 0) + count
    models = [{"model": model, "local_id": local, "node_id": node, "lane": lane, **_row_figures(rows)}
              for (model, node, local, lane), rows in sorted(keyed.items())]
    series = []
    for bucket in range(since, until + 1, width):
        sums, by_lane = points.get(bucket, (Sums(), {}))
        series.append(series_point(bucket, sums, by_lane, detail=False))
    return {
        "period": query.period, "since_ms": since, "until_ms": until, "bucket_ms": width, "level": level,
        "filters": query.filters(), "totals": figures(total),
        "models": models,
        "nodes": sorted(nodes, key=lambda n: str(n["node_id"])),
        "series": series,
    }


def _row_figures(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One node's model row as given (its own figures stand), or several summed with their
    histograms."""
    if len(rows) == 1:
        return _figures_of(rows[0])
    sums = Sums()
    for row in rows:
        sums.merge(Sums.from_json(row))
    return figures(sums)


def _figures_of(row: Mapping[str, Any]) -> dict[str, Any]:
    """A node's figures as given; a field that is not a number is 0 (a count) or null."""
    out: dict[str, Any] = {}
    for name in FIGURES:
        value = row.get(name)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        out[name] = value if number else (None if name.endswith(("_ms", "_per_s")) else 0)
    return out


def _objects(value: object) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


async def site_flush(site: SiteService, own: Callable[[], Awaitable[dict[str, int]]]) -> dict[str, Any]:
    """Every node writes its buffered analytics rows now."""
    gathered = await site.ask_all(None, lambda client, info: client.post_json(
        info.node_url, NODE_ANALYTICS_FLUSH, {}, timeout=NODE_TIMEOUT_S))
    nodes = [{"node_id": site.node_id, "written": await own()}] if gathered.include_self else []
    for info, answer in gathered.replies("", lambda _a: True):
        written = answer.get("written") if isinstance(answer, dict) else None
        nodes.append({"node_id": info.node_id, "written": written if isinstance(written, dict) else {}})
    return {"ok": True, "nodes": sorted(nodes, key=lambda n: str(n["node_id"])),
            "node_errors": gathered.node_errors()}


async def site_load_errors(site: SiteService, own: list[dict[str, Any]], node_id: str | None,
                           model: str | None, limit: int = LOAD_ERRORS_KEPT) -> dict[str, Any]:
    """Every selected node's failed loads, newest first, each with its model's ``public_id``;
    ``model`` is a public ID (or public image ID) or a local ID."""
    names = SiteNames(site.registry.records())
    found = await merged_lists(site, own, node_id, NODE_LOAD_ERRORS, "errors", "load-errors", None)
    public = names.canonical(model) if model is not None else None
    rows = []
    for row in found["errors"]:
        row["public_id"] = names.public(str(row.get("node_id", "")), str(row.get("model", "")))
        if model is None or model == row.get("model") or public == row["public_id"]:
            rows.append(row)
    found["errors"] = rows[:limit]
    return found


async def site_recent(site: SiteService, own: Callable[[str | None, tuple[str, ...]], list[dict[str, Any]]],
                      node_id: str | None, model: str | None, lane: str | None, limit: int) -> dict[str, Any]:
    """Every selected node's newest requests, newest first, at most ``limit``: each under its
    public ID, a lent request once (the helper's row, naming its owner)."""
    names = SiteNames(site.registry.records())
    public = names.canonical(model) if model is not None else None

    def path(node: str) -> str:
        params = [(k, v) for k, v in (("model", public), ("lane", lane), ("limit", str(limit))) if v]
        params.extend(("local", local) for local in names.locals_of(public, node))
        return NODE_RECENT + "?" + urlencode(params)

    found = await merged_lists(site, own(public, names.locals_of(public, site.node_id)), node_id, path,
                               "requests", "recent", None)
    found["requests"] = one_row_each(found["requests"], names)[:limit]
    return found


def one_row_each(rows: Sequence[dict[str, Any]], names: SiteNames) -> list[dict[str, Any]]:
    """Request rows of several nodes (newest first) as the site lists them: under the public ID, and
    a lent request once: the owner's row is left out where the helper's row (same request ID) is
    there."""
    borrowed = {row.get("request_id") for row in rows
                if row.get("borrowed") is True and row.get("request_id")}
    out = []
    for row in rows:
        if row.get("lent") is True and row.get("borrowed") is not True and row.get("request_id") in borrowed:
            continue
        node, model = str(row.get("node_id", "")), str(row.get("model", ""))
        row["model"] = names.of_row(node, model, str(row.get("local_id") or model))
        out.append(row)
    return out


async def merged_lists(site: SiteService, own: list[dict[str, Any]], node_id: str | None,
                       path: str | Callable[[str], str], field: str, what: str,
                       limit: int | None) -> dict[str, Any]:
    """The ``field`` lists of every selected node's answer to ``path`` (a node's own path when it
    is a function of the node ID; this node's: ``own``), each row named by its node, newest first,
    at most ``limit``; a node that failed or answered without the list is named in ``node_errors``."""
    path_of = path if callable(path) else (lambda _node, fixed=path: fixed)
    gathered = await site.ask_all(_wanted(node_id), lambda client, info: client.get_json(
        info.node_url, path_of(info.node_id), timeout=NODE_TIMEOUT_S))
    rows = list(own) if gathered.include_self else []
    for info, answer in gathered.replies(f"{what} answer has no {field} list",
                                         lambda a: isinstance(a, dict) and isinstance(a.get(field), list)):
        rows.extend({**row, "node_id": info.node_id} for row in answer[field] if isinstance(row, dict))
    rows.sort(key=_newest_first)
    return {field: rows[:limit], "node_errors": gathered.node_errors()}


def _newest_first(row: Mapping[str, Any]) -> int:
    at = row.get("at_ms")
    return -at if isinstance(at, int) else 0


async def site_clear_load_errors(site: SiteService, own: Callable[[], int],
                                 node_id: str | None) -> dict[str, Any]:
    """Forget the failed loads of every selected node."""
    gathered = await site.ask_all(_wanted(node_id), lambda client, info: client.delete_json(
        info.node_url, NODE_LOAD_ERRORS, timeout=NODE_TIMEOUT_S))
    removed = own() if gathered.include_self else 0
    for _info, answer in gathered.replies("", lambda _a: True):
        if isinstance(answer, dict) and isinstance(answer.get("removed"), int):
            removed += answer["removed"]
    return {"ok": True, "removed": removed, "node_errors": gathered.node_errors()}


__all__ = ["merge", "one_row_each",
           "merged_lists", "node_params", "parse_query", "site_analytics", "site_clear_load_errors",
           "site_flush", "site_load_errors", "site_recent"]
