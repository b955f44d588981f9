"""The site's lending reports (contract §7; the WebUI Lending tab and Nodes page read these): every
node's own report (:mod:`routerd.lending.reports`) merged.

* Site decisions: the rows of every selected node merged newest first and truncated to ``limit``,
  plus ``node_errors: [{node_id, error}]`` for nodes that are unknown, unhealthy or did not answer.
* Site states: every node's ``/state`` (the Nodes page) with ``node_errors``.
* Site summary: ``{nodes: [{node_id, build_version, settings_fingerprint, in_sync, held_requests}],
  leases}`` (+ ``node_errors``); ``leases`` are the coordinator's live leases with ``expires_in_ms``.

Remote nodes are asked through :meth:`routerd.site.service.SiteService.get_all`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlencode

from routerd.lending.reports import DecisionQuery, LendingReports
from routerd.paths import NODE_DECISIONS, NODE_STATE, NODE_SUMMARY
from routerd.site.service import SiteService


def _newest_first(row: dict[str, Any]) -> tuple[int, str, int]:
    # sorted() is stable and runs ascending: negate the numbers, and order ties by node id
    recorded = row.get("recorded_at")
    ident = row.get("id")
    return (-(recorded if isinstance(recorded, int) else 0), str(row.get("node_id", "")),
            -(ident if isinstance(ident, int) else 0))


def _records(answer: Any) -> bool:
    records = answer.get("records") if isinstance(answer, dict) else None
    return isinstance(records, list) and all(isinstance(r, dict) for r in records)


async def site_decisions(site: SiteService, reports: LendingReports, query: DecisionQuery,
                         node_ids: Sequence[str] | None, total_limit: int | None = None) -> dict[str, Any]:
    """The site decisions document: every selected node's rows merged newest first, truncated to
    ``total_limit`` rows (default: the query's own limit, which is also what each node is asked)."""
    include_self, _remotes, _errors = site.select(node_ids)
    rows: list[dict[str, Any]] = []
    if include_self:
        rows.extend(await reports.decisions(query))
    gathered = await site.get_all(node_ids, NODE_DECISIONS + "?" + urlencode(query.params()))
    for info, answer in gathered.replies("answer has no records list", _records):
        records = answer["records"]
        for record in records:
            if not record.get("node_id"):
                record["node_id"] = info.node_id
        rows.extend(records)
    rows.sort(key=_newest_first)
    return {"records": rows[:query.limit if total_limit is None else total_limit],
            "node_errors": gathered.node_errors()}


async def site_summary(site: SiteService, reports: LendingReports) -> dict[str, Any]:
    """The site summary: every node's build, settings fingerprint and held requests; live leases."""
    own = reports.summary()
    fingerprint = own["settings_fingerprint"]
    nodes = [own]
    gathered = await site.get_all(None, NODE_SUMMARY)
    for info, answer in gathered.replies("summary answer is not an object", lambda a: isinstance(a, dict)):
        held = answer.get("held_requests")
        nodes.append({"node_id": info.node_id,
                      "build_version": str(answer.get("build_version") or info.build_version),
                      "settings_fingerprint": str(answer.get("settings_fingerprint") or ""),
                      "held_requests": held if isinstance(held, list) else []})
    for entry in nodes:
        entry["in_sync"] = entry["settings_fingerprint"] == fingerprint
    nodes.sort(key=lambda e: str(e["node_id"]))
    out: dict[str, Any] = {"nodes": nodes, "leases": reports.leases()}
    if gathered.errors:
        out["node_errors"] = gathered.node_errors()
    return out


async def site_states(site: SiteService, own_state: dict[str, Any]) -> dict[str, Any]:
    """Every node's ``/state`` (runtimes, active and held requests) in one document, this node's
    own first-hand: ``{states: [state], node_errors: [{node_id, error}]}``, sorted by node id."""
    states = [own_state]
    gathered = await site.get_all(None, NODE_STATE)
    for info, answer in gathered.replies("state answer is not an object", lambda a: isinstance(a, dict)):
        states.append({**answer, "node_id": info.node_id})
    states.sort(key=lambda s: str(s.get("node_id", "")))
    return {"states": states, "node_errors": gathered.node_errors()}


__all__ = ["site_decisions", "site_states", "site_summary"]
