"""Analytics and load-error routes (contract §6 node API, §7 site API, §9 documents).

Node API (cluster token): ``GET /router/v1/node/analytics?period&model&lane``,
``POST /router/v1/node/analytics/flush``, ``GET|DELETE /router/v1/node/load-errors``.
``GET /router/v1/node/requests`` (one page of the request log), ``GET /router/v1/node/requests/body``.
Site API (admin; a master or a standalone node, 404 on a slave):
``GET /router/v1/site/requests`` (the request log: routerd.site.requests) and
``GET /router/v1/site/requests/body?request_id&node_id`` (a captured body),
``GET /router/v1/site/analytics?period&node_id&model&lane``, ``POST /router/v1/site/analytics/flush``,
``GET|DELETE /router/v1/site/load-errors?node_id&model&limit``.
The documents are built by ``routerd.inference.analytics`` (a node's) and ``routerd.site.analytics``
(the site's merge); this module parses and answers.
"""

from __future__ import annotations

import re
from typing import Any

import attrs
from twisted.web.iweb import IRequest

from routerd.api.jsonio import json_response
from routerd.api.reply import query_arg, query_values
from routerd.api.routes import Routes
from routerd.errors import HTTPError
from routerd.inference.analytics import LOAD_ERRORS_KEPT, RECENT_KEPT, AnalyticsRecorder, recent_json
from routerd.paths import (
    NODE_ANALYTICS,
    NODE_ANALYTICS_FLUSH,
    NODE_LOAD_ERRORS,
    NODE_RECENT,
    NODE_REQUEST_BODY,
    NODE_REQUESTS,
)
from routerd.site.analytics import (
    parse_query,
    site_analytics,
    site_clear_load_errors,
    site_flush,
    site_load_errors,
    site_recent,
)
from routerd.site.requests import (
    node_cursor,
    parse_log,
    request_id_of,
    site_bodies,
    site_cursor,
    site_requests,
)
from routerd.site.service import SiteService

SITE_ANALYTICS = "/router/v1/site/analytics"
SITE_ANALYTICS_FLUSH = "/router/v1/site/analytics/flush"
SITE_LOAD_ERRORS = "/router/v1/site/load-errors"
SITE_RECENT = "/router/v1/site/analytics/recent"
SITE_REQUESTS = "/router/v1/site/requests"
SITE_REQUEST_BODY = "/router/v1/site/requests/body"
#: The request log's filters (routerd.site.requests.parse_log).
_LOG_ARGS = ("since_ms", "until_ms", "limit", "request_id", "key_name", "model", "lane", "status", "kind")
_DIGITS = re.compile(r"[0-9]{1,6}")


def _args(request: IRequest, *names: str) -> dict[str, str | None]:
    return {name: query_arg(request, name) or None for name in names}


def _limit(request: IRequest, most: int = LOAD_ERRORS_KEPT) -> int:
    text = query_arg(request, "limit")
    if not text:
        return most
    if not _DIGITS.fullmatch(text) or not 1 <= int(text) <= most:
        raise HTTPError(400, f"limit must be an integer from 1 to {most}, got {text!r}",
                        "invalid_request_error", "invalid_parameter")
    return int(text)


def _locals(request: IRequest) -> tuple[str, ...]:
    """A site's ``local`` parameters: this node's local IDs the model filter's public ID covers."""
    return tuple(v for v in query_values(request, "local")[:64] if v)


def _recent_args(request: IRequest) -> tuple[str | None, str | None, int]:
    args = _args(request, "model", "lane")
    lane = parse_query({"lane": args["lane"]}).lane  # the same 400 for an unknown lane
    return args["model"], lane, _limit(request, RECENT_KEPT)


@attrs.define(slots=False, kw_only=True)
class AnalyticsAPI:
    """The node's and the site's analytics and load-error routes."""

    site: SiteService
    analytics: AnalyticsRecorder

    routes = Routes()

    # --- node API ----------------------------------------------------------------------------------

    @routes.route(NODE_ANALYTICS, methods=["GET"], auth="cluster")
    async def node_analytics(self, request: IRequest) -> bytes:
        query = parse_query(_args(request, "period", "model", "lane"))
        query = attrs.evolve(query, locals=_locals(request))
        return json_response(request, await self.analytics.document(query))

    @routes.route(NODE_ANALYTICS_FLUSH, methods=["POST"], auth="cluster")
    async def node_flush(self, request: IRequest) -> bytes:
        written = await self.analytics.flush()
        return json_response(request, {"ok": True, "node_id": self.site.node_id, "written": written})

    @routes.route(NODE_LOAD_ERRORS, methods=["GET"], auth="cluster")
    def node_load_errors(self, request: IRequest) -> bytes:
        errors = self.analytics.load_errors.listing(query_arg(request, "model") or None, _limit(request))
        return json_response(request, {"errors": errors})

    @routes.route(NODE_LOAD_ERRORS, methods=["DELETE"], auth="cluster")
    def node_clear_load_errors(self, request: IRequest) -> bytes:
        return json_response(request, {"ok": True, "removed": self.analytics.load_errors.clear()})

    @routes.route(NODE_RECENT, methods=["GET"], auth="cluster")
    def node_recent(self, request: IRequest) -> bytes:
        model, lane, limit = _recent_args(request)
        rows = recent_json(self.analytics.recent, model, lane, limit, _locals(request))
        return json_response(request, {"requests": rows})

    @routes.route(NODE_REQUESTS, methods=["GET"], auth="cluster")
    async def node_requests(self, request: IRequest) -> bytes:
        query = parse_log(_args(request, *_LOG_ARGS), self.analytics.now_ms())
        query = attrs.evolve(query, locals=_locals(request), before=node_cursor(query_arg(request, "before")))
        rows = await self.analytics.log_page(query)
        return json_response(request, {"enabled": self.analytics.enabled, "requests": rows})

    @routes.route(NODE_REQUEST_BODY, methods=["GET"], auth="cluster")
    async def node_request_body(self, request: IRequest) -> bytes:
        request_id = request_id_of(_args(request, "request_id"))
        return json_response(request, {"captures": await self.analytics.captured(request_id)})

    # --- site API ----------------------------------------------------------------------------------

    @routes.route(SITE_REQUEST_BODY, methods=["GET"], auth="admin")
    async def site_request_body(self, request: IRequest) -> bytes:
        self.site.require()
        request_id = request_id_of(_args(request, "request_id"))
        node_id = query_arg(request, "node_id") or None
        bodies = await site_bodies(self.site, self.analytics.captured, request_id, node_id)
        return json_response(request, bodies)

    @routes.route(SITE_REQUESTS, methods=["GET"], auth="admin")
    async def site_requests(self, request: IRequest) -> bytes:
        self.site.require()
        query = parse_log(_args(request, *_LOG_ARGS), self.analytics.now_ms())
        cursor = site_cursor(query_arg(request, "before"))
        node_id = query_arg(request, "node_id") or None
        page = await site_requests(self.site, self.analytics.log_page, query, node_id, cursor)
        return json_response(request, page)

    @routes.route(SITE_ANALYTICS, methods=["GET"], auth="admin")
    async def site_analytics(self, request: IRequest) -> bytes:
        self.site.require()
        query = parse_query(_args(request, "period", "model", "lane", "node_id"))
        analytics = self.analytics
        document = await site_analytics(self.site, analytics.document, query, analytics.now_ms())
        return json_response(request, document)

    @routes.route(SITE_ANALYTICS_FLUSH, methods=["POST"], auth="admin")
    async def site_flush(self, request: IRequest) -> bytes:
        self.site.require()
        return json_response(request, await site_flush(self.site, self.analytics.flush))

    @routes.route(SITE_RECENT, methods=["GET"], auth="admin")
    async def site_recent(self, request: IRequest) -> bytes:
        self.site.require()
        model, lane, limit = _recent_args(request)
        recent = self.analytics.recent

        def own(public: str | None, locals_: tuple[str, ...]) -> list[dict[str, Any]]:
            return recent_json(recent, public, lane, limit, locals_)

        node_id = query_arg(request, "node_id") or None
        return json_response(request, await site_recent(self.site, own, node_id, model, lane, limit))

    @routes.route(SITE_LOAD_ERRORS, methods=["GET"], auth="admin")
    async def site_load_errors(self, request: IRequest) -> bytes:
        self.site.require()
        args = _args(request, "node_id", "model")
        limit = _limit(request)
        own = self.analytics.load_errors.listing(None, LOAD_ERRORS_KEPT)  # the site filters by name
        return json_response(request, await site_load_errors(self.site, own, args["node_id"], args["model"],
                                                             limit))

    @routes.route(SITE_LOAD_ERRORS, methods=["DELETE"], auth="admin")
    async def site_clear_load_errors(self, request: IRequest) -> bytes:
        self.site.require()
        clear = self.analytics.load_errors.clear
        return json_response(request, await site_clear_load_errors(
            self.site, clear, query_arg(request, "node_id") or None))


__all__ = ["SITE_ANALYTICS", "SITE_ANALYTICS_FLUSH", "SITE_LOAD_ERRORS", "SITE_RECENT", "SITE_REQUEST_BODY",
           "SITE_REQUESTS", "AnalyticsAPI"]
