"""Decision log and lending summary routes: node API (contract §6) and site API (§7).

Node API (cluster token): ``GET /router/v1/node/offload/decisions?lane&outcome&kind&limit&since_ms&after``
→ ``{"records", "cursor"}``; ``GET /router/v1/node/offload/summary``.  ``after`` is the ``cursor`` of
an earlier answer: the rows recorded since, each once (``routerd.lending.follow``; what
``routerd decisions --follow`` and the WebUI's live tail poll with).  Site API (a master or a standalone
node; 404 on a slave): ``GET /router/v1/site/offload/decisions?…&node_id…``, the same rows folded
for the WebUI (``GET /router/v1/site/offload/decisions/folded?…&page&page_size``) and
``GET /router/v1/site/offload/summary``.
The documents are built by ``routerd.lending.reports`` (a node's) and ``routerd.site.reports`` (the
site's merge); this module parses and answers.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import attrs
from twisted.web.iweb import IRequest

from routerd.api.jsonio import json_response
from routerd.api.reply import query_values
from routerd.api.routes import Routes
from routerd.errors import HTTPError
from routerd.lending.decisions import ALL_OUTCOMES, KINDS
from routerd.lending.fold import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, fold, page
from routerd.lending.follow import Cursor, advance
from routerd.lending.reports import DecisionQuery, LendingReports
from routerd.paths import NODE_DECISIONS, NODE_SUMMARY
from routerd.site.reports import site_decisions, site_summary
from routerd.site.service import SiteService
from routerd.store.decisions import DEFAULT_LIMIT, MAX_LIMIT
from routerd.wire.lending import LANES

#: Rows the site query returns when no ``limit`` is given.
SITE_DEFAULT_LIMIT = 500

SITE_DECISIONS = "/router/v1/site/offload/decisions"
SITE_FOLDED = "/router/v1/site/offload/decisions/folded"
#: Rows the folded site query gathers (from all nodes together) when no ``limit`` is given, and at
#: most; each node is still asked for at most ``MAX_LIMIT`` of its own.
SITE_FOLD_DEFAULT_LIMIT = 10000
SITE_FOLD_MAX_LIMIT = 100000
SITE_SUMMARY = "/router/v1/site/offload/summary"

_DIGITS = re.compile(r"[0-9]+")
#: SQLite's largest integer: a larger since_ms cannot be bound to the query (it was a 500).
_MAX_SINCE_MS = 2**63 - 1


def _arg(request: IRequest, name: str) -> str | None:
    """The first non-empty value of ``name`` (an empty value counts as absent)."""
    return next((value for value in query_values(request, name) if value), None)


def _choice(request: IRequest, name: str, allowed: Sequence[str] | frozenset[str]) -> str | None:
    value = _arg(request, name)
    if value is not None and value not in allowed:
        raise HTTPError(400, f"{name} must be one of {', '.join(sorted(allowed))}, got {value!r}",
                        "invalid_request_error", "invalid_parameter")
    return value


def _count(request: IRequest, name: str, default: int, low: int, high: int) -> int:
    text = _arg(request, name)
    if text is None:
        return default
    if not _DIGITS.fullmatch(text) or not low <= int(text) <= high:
        raise HTTPError(400, f"{name} must be an integer from {low} to {high}, got {text!r}",
                        "invalid_request_error", "invalid_parameter")
    return int(text)


def parse_after(request: IRequest) -> Cursor | None:
    """The follow cursor ``after`` of ``request``, or None; ``HTTPError`` 400 for one the API did not
    write."""
    text = _arg(request, "after")
    if text is None:
        return None
    try:
        return Cursor.decode(text)
    except ValueError:
        raise HTTPError(400, f"after must be the cursor of an earlier answer, got {text!r}",
                        "invalid_request_error", "invalid_parameter") from None


def parse_query(request: IRequest, default_limit: int, max_limit: int = MAX_LIMIT,
                after: Cursor | None = None) -> DecisionQuery:
    """The decisions query of ``request`` (rows from ``after.since_ms`` with a cursor);
    ``HTTPError`` 400 naming the first bad parameter."""
    lane = _choice(request, "lane", LANES)
    kind = _choice(request, "kind", KINDS)
    outcome = _choice(request, "outcome", ALL_OUTCOMES)
    limit = _count(request, "limit", default_limit, 1, max_limit)
    since_ms: int | None = None if after is None else after.since_ms
    text = _arg(request, "since_ms")
    if text is not None and after is not None:
        raise HTTPError(400, "give since_ms or after, not both", "invalid_request_error",
                        "invalid_parameter")
    if text is not None:
        if not _DIGITS.fullmatch(text) or int(text) > _MAX_SINCE_MS:
            raise HTTPError(400, f"since_ms must be an integer from 0 to {_MAX_SINCE_MS}, got {text!r}",
                            "invalid_request_error", "invalid_parameter")
        since_ms = int(text)
    return DecisionQuery(lane=lane, outcome=outcome, kind=kind, limit=limit, since_ms=since_ms)


@attrs.define(slots=False, kw_only=True)
class DecisionsAPI:
    """The four decision-log and summary routes."""

    site: SiteService
    reports: LendingReports

    routes = Routes()

    @routes.route(NODE_DECISIONS, methods=["GET"], auth="cluster")
    async def node_decisions(self, request: IRequest) -> bytes:
        after = parse_after(request)
        query = parse_query(request, DEFAULT_LIMIT, after=after)
        records, cursor = advance(await self.reports.decisions(query), after)
        return json_response(request, {"records": records, "cursor": cursor.encode()})

    @routes.route(NODE_SUMMARY, methods=["GET"], auth="cluster")
    def node_summary(self, request: IRequest) -> bytes:
        return json_response(request, self.reports.summary())

    @routes.route(SITE_DECISIONS, methods=["GET"], auth="admin")
    async def site_decisions(self, request: IRequest) -> bytes:
        self.site.require()
        after = parse_after(request)
        query = parse_query(request, SITE_DEFAULT_LIMIT, after=after)
        wanted: Sequence[str] = [v for v in query_values(request, "node_id") if v]
        document = await site_decisions(self.site, self.reports, query, wanted or None)
        document["records"], cursor = advance(document["records"], after)
        document["cursor"] = cursor.encode()
        return json_response(request, document)

    @routes.route(SITE_FOLDED, methods=["GET"], auth="admin")
    async def site_folded(self, request: IRequest) -> bytes:
        """The merged rows folded by key (``routerd.lending.fold``), one page of lines."""
        self.site.require()
        query = parse_query(request, SITE_FOLD_DEFAULT_LIMIT, SITE_FOLD_MAX_LIMIT)
        number = _count(request, "page", 0, 0, 1_000_000)
        size = _count(request, "page_size", DEFAULT_PAGE_SIZE, 1, MAX_PAGE_SIZE)
        wanted: Sequence[str] = [v for v in query_values(request, "node_id") if v]
        per_node = attrs.evolve(query, limit=min(query.limit, MAX_LIMIT))
        merged = await site_decisions(self.site, self.reports, per_node, wanted or None,
                                      total_limit=query.limit)
        document = page(fold(merged["records"]), number, size)
        document["node_errors"] = merged["node_errors"]
        return json_response(request, document)

    @routes.route(SITE_SUMMARY, methods=["GET"], auth="admin")
    async def site_summary(self, request: IRequest) -> bytes:
        self.site.require()
        return json_response(request, await site_summary(self.site, self.reports))


__all__ = ["SITE_DECISIONS", "SITE_FOLDED", "SITE_SUMMARY", "DecisionsAPI", "parse_after", "parse_query"]
