"""The request log (contract §9 "Request log"): one page of the requests every node recorded,
filtered, newest first, read from each node's analytics store through its indexes.

``GET /router/v1/site/requests`` asks each selected node's ``GET /router/v1/node/requests`` for one
page (the public-ID filter with that node's local IDs it covers, and the page cursor as that node
must read it), merges the pages in ``(at_ms, node_id, id)`` order, newest first, names each row by its
public ID and shows a lent request once (:func:`routerd.site.analytics.one_row_each`).  The cursor of
the next page is ``<at_ms>:<node_id>:<id>`` of the last row shown.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import urlencode

import attrs

from routerd.errors import HTTPError
from routerd.paths import NODE_REQUEST_BODY, NODE_REQUESTS
from routerd.site.analytics import merged_lists, one_row_each
from routerd.site.names import SiteNames
from routerd.site.service import SiteService
from routerd.store.analytics import ANALYTICS_LANES
from routerd.store.request_log import DEFAULT_LIMIT, KINDS, MAX_LIMIT, LogQuery

_MS = re.compile(r"[0-9]{1,15}")
_STATUS = re.compile(r"[a-z0-9_]{1,40}")
_NODE_CURSOR = re.compile(r"([0-9]{1,15}):([0-9]{1,18})")
_SITE_CURSOR = re.compile(r"([0-9]{1,15}):(.{1,128}):([0-9]{1,18})")
#: A node-level ``before`` id above every row id (and within a node cursor's 18 digits): the whole
#: millisecond is older.
_ALL_OF_IT = 10 ** 18 - 1


def _bad(message: str) -> HTTPError:
    return HTTPError(400, message, "invalid_request_error", "invalid_parameter")


def _ms(args: Mapping[str, str | None], name: str, default: int) -> int:
    text = args.get(name)
    if not text:
        return default
    if not _MS.fullmatch(text):
        raise _bad(f"{name} must be a time in milliseconds since the epoch, got {text[:40]!r}")
    return int(text)


def _text(args: Mapping[str, str | None], name: str, most: int) -> str | None:
    text = args.get(name)
    if not text:
        return None
    if len(text) > most or not text.isprintable():
        raise _bad(f"{name} must be at most {most} printable characters")
    return text


def parse_log(args: Mapping[str, str | None], now_ms: int) -> LogQuery:
    """The filters of a request-log page (the node's and the site's parameters); 400 naming the
    first bad one.  ``before`` is left to the caller (the node's and the site's cursors differ)."""
    since = _ms(args, "since_ms", 0)
    until = _ms(args, "until_ms", now_ms + 1)
    if until <= since:
        raise _bad("until_ms must be later than since_ms")
    limit_text = args.get("limit") or str(DEFAULT_LIMIT)
    if not _MS.fullmatch(limit_text) or not 1 <= int(limit_text) <= MAX_LIMIT:
        raise _bad(f"limit must be an integer from 1 to {MAX_LIMIT}, got {limit_text[:40]!r}")
    lane = args.get("lane") or None
    if lane is not None and lane not in ANALYTICS_LANES:
        raise _bad(f"lane must be one of {', '.join(ANALYTICS_LANES)}, got {lane[:40]!r}")
    status = args.get("status") or None
    if status is not None and not _STATUS.fullmatch(status):
        raise _bad("status must be failed, ok or a status code such as backend_error")
    kind = args.get("kind") or None
    if kind is not None and kind not in KINDS:
        raise _bad(f"kind must be one of {', '.join(KINDS)}, got {kind[:40]!r}")
    return LogQuery(since_ms=since, until_ms=until, limit=int(limit_text),
                    request_id=_text(args, "request_id", 64), key_name=_text(args, "key_name", 200),
                    model=_text(args, "model", 256), lane=lane, status=status, kind=kind)


def node_cursor(text: str | None) -> tuple[int, int] | None:
    """A node's ``before`` (``<at_ms>:<id>``); 400 for another shape."""
    if not text:
        return None
    found = _NODE_CURSOR.fullmatch(text)
    if found is None:
        raise _bad("before must be <at_ms>:<id> (a page's next cursor)")
    return int(found[1]), int(found[2])


def site_cursor(text: str | None) -> tuple[int, str, int] | None:
    """The site's ``before`` (``<at_ms>:<node_id>:<id>``, a page's ``next``); 400 for another shape."""
    if not text:
        return None
    found = _SITE_CURSOR.fullmatch(text)
    if found is None:
        raise _bad("before must be a page's next cursor, <at_ms>:<node_id>:<id>")
    return int(found[1]), found[2], int(found[3])


def before_on(node_id: str, cursor: tuple[int, str, int] | None) -> tuple[int, int] | None:
    """What ``node_id`` reads of the site's cursor: its rows older than it in (at, node, id) order."""
    if cursor is None:
        return None
    at, node, row_id = cursor
    if node_id < node:
        return at, _ALL_OF_IT
    return (at, row_id) if node_id == node else (at, 0)


def node_params(q: LogQuery) -> str:
    """The node API query string of ``q``."""
    params: list[tuple[str, str]] = [("since_ms", str(q.since_ms)), ("until_ms", str(q.until_ms)),
                                     ("limit", str(q.limit))]
    for name in ("request_id", "key_name", "model", "lane", "status", "kind"):
        value = getattr(q, name)
        if value is not None:
            params.append((name, value))
    params.extend(("local", local) for local in q.locals)
    if q.before is not None:
        params.append(("before", f"{q.before[0]}:{q.before[1]}"))
    return urlencode(params)


async def site_requests(site: SiteService, own: Callable[[LogQuery], Awaitable[list[dict[str, Any]]]],
                        q: LogQuery, node_id: str | None,
                        cursor: tuple[int, str, int] | None) -> dict[str, Any]:
    """One page of the site's request log (see the module docstring)."""
    names = SiteNames(site.registry.records())
    if q.model is not None:
        q = attrs.evolve(q, model=names.canonical(q.model))

    def on(node: str) -> LogQuery:
        return attrs.evolve(q, locals=names.locals_of(q.model, node), before=before_on(node, cursor))

    wanted_self = node_id is None or node_id == site.node_id
    rows = await own(on(site.node_id)) if wanted_self else []
    found = await merged_lists(site, rows, node_id, lambda node: NODE_REQUESTS + "?" + node_params(on(node)),
                               "requests", "requests", None)
    merged = sorted(found["requests"], key=_order, reverse=True)
    shown = one_row_each(merged[:q.limit], names)
    last = merged[q.limit - 1] if len(merged) >= q.limit else None
    found["requests"] = shown
    found["next"] = None if last is None else f"{last.get('at_ms')}:{last.get('node_id')}:{last.get('id')}"
    return found


def request_id_of(args: Mapping[str, str | None]) -> str:
    """The ``request_id`` a body look-up names; 400 when it is missing or not an ID."""
    found = _text(args, "request_id", 64)
    if found is None:
        raise _bad("request_id is required")
    return found


async def site_bodies(site: SiteService, own: Callable[[str], Awaitable[list[dict[str, Any]]]],
                      request_id: str, node_id: str | None) -> dict[str, Any]:
    """The bodies every selected node captured of ``request_id`` (``analytics.capture_*``)."""
    rows = await own(request_id) if node_id is None or node_id == site.node_id else []
    path = NODE_REQUEST_BODY + "?" + urlencode({"request_id": request_id})
    return await merged_lists(site, rows, node_id, path, "captures", "captures", None)


def _order(row: Mapping[str, Any]) -> tuple[int, str, int]:
    at, row_id = row.get("at_ms"), row.get("id")
    return (at if isinstance(at, int) else 0, str(row.get("node_id", "")),
            row_id if isinstance(row_id, int) else 0)


__all__ = ["before_on", "node_cursor", "node_params", "parse_log", "request_id_of", "site_bodies",
           "site_cursor", "site_requests"]
