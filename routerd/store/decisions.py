"""The lending decision log table (``offload_decisions``, contract §8): SQL over a connection.

Rows go in as mappings of column name → value (``id`` is assigned by SQLite;
every other column that a row leaves out takes its empty value, ``''`` or 0)
and come out as JSON objects with the same snake_case names, empty and zero
values omitted apart from the identifying columns (``IDENTITY``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: Text columns, in table order (``trigger`` is quoted in SQL: it is a keyword).
TEXT_COLUMNS: tuple[str, ...] = (
    "node_id", "kind", "trigger", "lane", "owner_node_id", "owner_model_id", "helper_node_id",
    "helper_model_id", "outcome", "reason", "request_id", "service_source", "router_version",
    "priority", "key_name", "key_hash", "moved_from",
)
#: Integer columns.
INT_COLUMNS: tuple[str, ...] = (
    "recorded_at", "pending_count", "backlog_count", "slots", "lent_out", "borrowed_ahead",
)
#: Real (floating point) columns.
REAL_COLUMNS: tuple[str, ...] = (
    "keep_ms", "switch_ms", "restore_ms", "service_ms", "owner_job_ms", "helper_idle_ms", "wait_ms",
    "load_ms", "mean_load_ms",
)

#: Every column a row may set, in table order (all but ``id``).
COLUMNS: tuple[str, ...] = (
    "recorded_at", "node_id", "kind", "trigger", "lane", "owner_node_id", "owner_model_id",
    "helper_node_id", "helper_model_id", "outcome", "reason", "request_id", "pending_count",
    "backlog_count", "keep_ms", "switch_ms", "restore_ms", "service_ms", "owner_job_ms",
    "service_source", "helper_idle_ms", "slots", "lent_out", "borrowed_ahead", "wait_ms",
    "router_version", "priority", "key_name", "key_hash", "load_ms", "mean_load_ms", "moved_from",
)

#: Columns a JSON row always carries, even when empty.
IDENTITY: frozenset[str] = frozenset(
    {"id", "recorded_at", "node_id", "kind", "outcome", "lane", "router_version"})

#: Rows one query may return.
MAX_LIMIT = 5000
DEFAULT_LIMIT = 200

_TEXT = frozenset(TEXT_COLUMNS)
_INT = frozenset(INT_COLUMNS)
_KNOWN = frozenset(COLUMNS)
_SELECT_COLUMNS = ("id", *COLUMNS)


def _sql_name(column: str) -> str:
    return f'"{column}"' if column == "trigger" else column


_INSERT_SQL = (
    f"INSERT INTO offload_decisions ({', '.join(_sql_name(c) for c in COLUMNS)})"
    f" VALUES ({', '.join('?' for _ in COLUMNS)})"
)
_SELECT_SQL = f"SELECT {', '.join(_sql_name(c) for c in _SELECT_COLUMNS)} FROM offload_decisions"


def _value(column: str, value: object) -> object:
    if column in _TEXT:
        return "" if value is None else str(value)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"offload_decisions.{column} must be a number, got {value!r}")
    return int(value) if column in _INT else float(value)


def row_values(row: Mapping[str, Any], now_ms: int) -> tuple[object, ...]:
    """The insert parameters of one row; ``recorded_at`` defaults to ``now_ms``.

    Raises ``ValueError`` for a column the table does not have or a non-numeric number.
    """
    unknown = set(row) - _KNOWN
    if unknown:
        raise ValueError(f"offload_decisions has no column(s) {', '.join(sorted(unknown))}")
    values: list[object] = []
    for column in COLUMNS:
        value = row.get(column)
        if column == "recorded_at" and value is None:
            value = now_ms
        values.append(_value(column, value))
    return tuple(values)


def insert(conn: sqlite3.Connection, rows: Iterable[tuple[object, ...]]) -> None:
    """Insert prepared rows (``row_values``) in one statement batch (``rows`` read as they are
    written: an iterator makes no list of them)."""
    conn.executemany(_INSERT_SQL, rows)


def to_json(row: Sequence[Any]) -> dict[str, Any]:
    """One selected row as JSON: empty and zero values omitted, identity columns always kept."""
    out: dict[str, Any] = {}
    for column, value in zip(_SELECT_COLUMNS, row, strict=True):
        if column in IDENTITY or value:
            out[column] = value
    return out


def query(conn: sqlite3.Connection, *, lane: str | None = None, outcome: str | None = None,
          kind: str | None = None, limit: int = DEFAULT_LIMIT,
          since_ms: int | None = None) -> list[dict[str, Any]]:
    """Rows matching every given filter, newest first (``recorded_at DESC, id DESC``).

    ``since_ms`` keeps rows recorded at or after it; ``limit`` is capped at ``MAX_LIMIT``.
    """
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    clauses: list[str] = []
    args: list[object] = []
    for column, wanted in (("lane", lane), ("outcome", outcome), ("kind", kind)):
        if wanted is not None:
            clauses.append(f"{column} = ?")
            args.append(wanted)
    if since_ms is not None:
        clauses.append("recorded_at >= ?")
        args.append(int(since_ms))
    sql = _SELECT_SQL
    if clauses:
        sql += " WHERE " + " AND ".join(clauses)
    sql += " ORDER BY recorded_at DESC, id DESC LIMIT ?"
    args.append(min(int(limit), MAX_LIMIT))
    return [to_json(row) for row in conn.execute(sql, args)]


def prune(conn: sqlite3.Connection, before_ms: int) -> int:
    """Delete rows recorded before ``before_ms``; return how many went."""
    return int(conn.execute("DELETE FROM offload_decisions WHERE recorded_at < ?", (before_ms,)).rowcount)
