"""The request log's schema step and its query (contract §9 "Request log").

Schema step 6 gives every ``analytics_requests`` row the request ID the decision log and the access
log share, the model's local ID beside the public ID in ``model_id``, the other side of a lent
request (``lent_from``/``lent_to``: ``<node>/<model>``), the prompt tokens the backend's cache
served (``cached_tokens``) and a failure's reason, and indexes the log's filters; the rollups gain
``local_id`` in their key, so a table row names the public ID first and the local ID second.

:func:`query_log` reads one page of a node's rows, newest first, through those indexes only: the
time window and the filters are in SQL and a page is at most :data:`MAX_LIMIT` rows.

``analytics_captures`` holds the request bodies an operator asked for (``analytics.capture_keys`` /
``capture_models``; none by default): :class:`CaptureRow`, written with the batch's rows, pruned
after ``capture_retention``, read by request ID.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any, NamedTuple

import attrs

from routerd.store.analytics import ROLLUP_VALUE_COLUMNS, RequestRow, model_where

_VALUES = ",\n    ".join(f"{name} {kind} NOT NULL DEFAULT 0" for name, kind in ROLLUP_VALUE_COLUMNS)
_VALUE_NAMES = ", ".join(name for name, _kind in ROLLUP_VALUE_COLUMNS)

#: Migration step 6 (routerd.store.migrations).  Rows written before it keep ``model_id`` as they
#: were recorded (the local ID), which becomes their ``local_id`` too.
SCHEMA_V6_SQL = f"""
ALTER TABLE analytics_requests ADD COLUMN request_id TEXT NOT NULL DEFAULT '';
ALTER TABLE analytics_requests ADD COLUMN local_id TEXT NOT NULL DEFAULT '';
ALTER TABLE analytics_requests ADD COLUMN lent_from TEXT NOT NULL DEFAULT '';
ALTER TABLE analytics_requests ADD COLUMN lent_to TEXT NOT NULL DEFAULT '';
ALTER TABLE analytics_requests ADD COLUMN cached_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE analytics_requests ADD COLUMN reason TEXT NOT NULL DEFAULT '';
UPDATE analytics_requests SET local_id = model_id;
CREATE INDEX analytics_requests_request ON analytics_requests (request_id);
CREATE INDEX analytics_requests_model ON analytics_requests (model_id, at_ms);
CREATE INDEX analytics_requests_key ON analytics_requests (key_name, at_ms);
CREATE INDEX analytics_requests_failed ON analytics_requests (at_ms) WHERE status != 'ok';
CREATE TABLE analytics_captures (
    id INTEGER PRIMARY KEY,
    at_ms INTEGER NOT NULL,
    request_id TEXT NOT NULL,
    node_id TEXT NOT NULL,
    model_id TEXT NOT NULL,
    key_name TEXT NOT NULL,
    content_type TEXT NOT NULL,
    size INTEGER NOT NULL,
    body BLOB NOT NULL
);
CREATE INDEX analytics_captures_request ON analytics_captures (request_id);
CREATE INDEX analytics_captures_at ON analytics_captures (at_ms);
CREATE TABLE analytics_rollups_v5 (
    level TEXT NOT NULL,
    bucket_ms INTEGER NOT NULL,
    node_id TEXT NOT NULL,
    model_id TEXT NOT NULL,
    local_id TEXT NOT NULL,
    lane TEXT NOT NULL,
    {_VALUES},
    PRIMARY KEY (level, bucket_ms, node_id, model_id, local_id, lane)
) WITHOUT ROWID;
INSERT INTO analytics_rollups_v5 (level, bucket_ms, node_id, model_id, local_id, lane, {_VALUE_NAMES})
    SELECT level, bucket_ms, node_id, model_id, model_id, lane, {_VALUE_NAMES} FROM analytics_rollups;
DROP TABLE analytics_rollups;
ALTER TABLE analytics_rollups_v5 RENAME TO analytics_rollups;
"""

#: The most rows one page of the log holds, and the default.
MAX_LIMIT = 500
DEFAULT_LIMIT = 50
#: ``status`` filter words beside an exact status: every failure, or the successes.
STATUS_WORDS = ("failed", "ok")
#: ``kind`` filter values: a lent request (the helper's borrowed row, naming its owner), one a
#: guardian answered.
KINDS = ("lent", "guardian")


@attrs.frozen
class LogQuery:
    """One page of a node's request log (validated by the caller, routerd.site.requests).

    ``since_ms``/``until_ms`` bound ``at_ms`` (inclusive, exclusive); ``before`` continues a page:
    rows strictly older than ``(at_ms, id)``."""

    since_ms: int
    until_ms: int
    limit: int = DEFAULT_LIMIT
    request_id: str | None = None
    key_name: str | None = None
    model: str | None = None
    locals: tuple[str, ...] = ()
    lane: str | None = None
    status: str | None = None
    kind: str | None = None
    before: tuple[int, int] | None = None


class CaptureRow(NamedTuple):
    """One captured request body (at most ``analytics.capture_max_bytes`` of it; ``size`` is the
    whole body's)."""

    at_ms: int
    request_id: str
    node_id: str
    model_id: str
    key_name: str
    content_type: str
    size: int
    body: bytes


_CAPTURE_COLUMNS = ", ".join(CaptureRow._fields)


def write_captures(conn: sqlite3.Connection, captures: Sequence[CaptureRow]) -> None:
    """Insert a batch's captured bodies (in the batch's transaction)."""
    if captures:
        conn.executemany(f"INSERT INTO analytics_captures ({_CAPTURE_COLUMNS}) "
                         f"VALUES ({', '.join('?' * len(CaptureRow._fields))})", captures)


def prune_captures(conn: sqlite3.Connection, before_ms: int) -> int:
    """Delete the captured bodies older than ``before_ms``."""
    return int(conn.execute("DELETE FROM analytics_captures WHERE at_ms < ?", (before_ms,)).rowcount)


def captures_of(conn: sqlite3.Connection, request_id: str) -> list[CaptureRow]:
    """The bodies captured of ``request_id`` (one, or one a node that served it), oldest first."""
    return [CaptureRow(*r) for r in conn.execute(
        f"SELECT {_CAPTURE_COLUMNS} FROM analytics_captures WHERE request_id = ? ORDER BY at_ms, id LIMIT 8",
        (request_id,))]


def query_log(conn: sqlite3.Connection, q: LogQuery) -> list[tuple[int, RequestRow, bool]]:
    """``(id, row, captured)`` of the page, newest first (``captured``: its body was stored).  An
    owner's lent row that succeeded is left out: the helper's row is that request's one row (it
    names the owner); a failed one stays (the client saw the failure there)."""
    args: list[object] = [q.since_ms, q.until_ms]
    where = "at_ms >= ? AND at_ms < ? AND NOT (lent = 1 AND status = 'ok')"
    for column, value in (("request_id", q.request_id), ("key_name", q.key_name), ("lane", q.lane)):
        if value is not None:
            where += f" AND {column} = ?"
            args.append(value)
    if q.model is not None:
        where += " AND " + model_where(q.model, q.locals, args)
    if q.status == "failed":
        where += " AND status != 'ok'"
    elif q.status is not None:
        where += " AND status = ?"
        args.append(q.status)
    if q.kind == "lent":
        where += " AND borrowed = 1"
    elif q.kind == "guardian":
        where += " AND guardian = 1"
    if q.before is not None:
        where += " AND (at_ms < ? OR (at_ms = ? AND id < ?))"
        args.extend((q.before[0], q.before[0], q.before[1]))
    args.append(q.limit)
    sql = (f"SELECT id, {', '.join(RequestRow._fields)} FROM analytics_requests WHERE {where} "
           "ORDER BY at_ms DESC, id DESC LIMIT ?")
    page = [(int(r[0]), _row(r[1:])) for r in conn.execute(sql, args)]
    captured = _captured(conn, [row.request_id for _id, row in page if row.request_id])
    return [(row_id, row, row.request_id in captured) for row_id, row in page]


def _captured(conn: sqlite3.Connection, request_ids: Sequence[str]) -> set[str]:
    """Which of a page's request IDs have a captured body (one indexed look-up a page)."""
    if not request_ids or conn.execute("SELECT 1 FROM analytics_captures LIMIT 1").fetchone() is None:
        return set()
    found = conn.execute(f"SELECT DISTINCT request_id FROM analytics_captures WHERE request_id IN "
                         f"({', '.join('?' * len(request_ids))})", list(request_ids))
    return {str(r[0]) for r in found}


def _row(values: Sequence[Any]) -> RequestRow:
    row = RequestRow(*values)
    return row._replace(lent=bool(row.lent), borrowed=bool(row.borrowed), guardian=bool(row.guardian))


__all__ = ["DEFAULT_LIMIT", "KINDS", "MAX_LIMIT", "SCHEMA_V6_SQL", "STATUS_WORDS", "CaptureRow", "LogQuery",
           "captures_of", "prune_captures", "query_log", "write_captures"]
