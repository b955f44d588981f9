"""Analytics rows, their rollups and the figures read from them (contract §9).

Pure parts: :class:`RequestRow` / :class:`LoadRow` (one finished request or model load),
:func:`rollup` (a batch of rows → the per-minute, per-hour and per-day sums they add), the latency
histogram (:func:`bucket_of`, :func:`percentile`) and :func:`figures` (sums → what a table shows).
SQL parts (run on the store's thread): :func:`write_batch` inserts raw rows and adds a batch's
rollups in one transaction, :func:`prune` applies the retentions, :func:`query` reads one period's
tables and series from the rollups only (never the raw rows).
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import attrs

#: Rollup levels and their bucket widths (ms).
LEVELS: dict[str, int] = {"minute": 60_000, "hour": 3_600_000, "day": 86_400_000}
#: Periods a query may ask for: (length ms, rollup level read).
PERIODS: dict[str, tuple[int, str]] = {
    "1h": (3_600_000, "minute"),
    "24h": (86_400_000, "hour"),
    "7d": (7 * 86_400_000, "hour"),
    "30d": (30 * 86_400_000, "day"),
}
ANALYTICS_LANES: tuple[str, ...] = ("text", "image", "stt")
#: Latency histogram: bucket i holds [2^(i/2), 2^((i+1)/2)) ms; 0 and the last are open-ended.
HIST_BUCKETS = 40

#: Summed columns of a rollup row, in order (the histograms follow).
SUMS: tuple[str, ...] = ("requests", "errors", "prompt_tokens", "completion_tokens", "images",
                         "audio_seconds", "vectors", "loads", "load_failures", "lent", "borrowed",
                         "guardian", "gen_ms", "gen_tokens")
_D = tuple(f"d{i}" for i in range(HIST_BUCKETS))
_T = tuple(f"t{i}" for i in range(HIST_BUCKETS))
#: The rollup key from schema version 6 (versions 4 and 5 had no ``local_id``; see routerd.store.request_log).
_KEY = ("level", "bucket_ms", "node_id", "model_id", "local_id", "lane")

_REAL = {"audio_seconds", "gen_ms"}


def _schema() -> str:
    """Migration step 4's SQL, as released (step 6 adds to it: routerd.store.request_log)."""
    sums = ",\n    ".join(f"{name} {'REAL' if name in _REAL else 'INTEGER'} NOT NULL DEFAULT 0"
                          for name in SUMS)
    hists = ",\n    ".join(f"{name} INTEGER NOT NULL DEFAULT 0" for name in (*_D, *_T))
    return f"""
CREATE TABLE analytics_requests (
    id INTEGER PRIMARY KEY,
    at_ms INTEGER NOT NULL,
    node_id TEXT NOT NULL,
    model_id TEXT NOT NULL,
    lane TEXT NOT NULL,
    route TEXT NOT NULL,
    status TEXT NOT NULL,
    http_status INTEGER NOT NULL DEFAULT 0,
    duration_ms REAL NOT NULL,
    ttft_ms REAL,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    images INTEGER NOT NULL DEFAULT 0,
    audio_seconds REAL NOT NULL DEFAULT 0,
    vectors INTEGER NOT NULL DEFAULT 0,
    lent INTEGER NOT NULL DEFAULT 0,
    borrowed INTEGER NOT NULL DEFAULT 0,
    guardian INTEGER NOT NULL DEFAULT 0,
    key_name TEXT NOT NULL DEFAULT ''
);
CREATE INDEX analytics_requests_at ON analytics_requests (at_ms);

CREATE TABLE analytics_loads (
    id INTEGER PRIMARY KEY,
    at_ms INTEGER NOT NULL,
    node_id TEXT NOT NULL,
    model_id TEXT NOT NULL,
    config_filename TEXT NOT NULL,
    runtime TEXT NOT NULL,
    status TEXT NOT NULL,
    duration_ms REAL NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    log_tail TEXT NOT NULL DEFAULT ''
);
CREATE INDEX analytics_loads_at ON analytics_loads (at_ms);

CREATE TABLE analytics_rollups (
    level TEXT NOT NULL,
    bucket_ms INTEGER NOT NULL,
    node_id TEXT NOT NULL,
    model_id TEXT NOT NULL,
    lane TEXT NOT NULL,
    {sums},
    {hists},
    PRIMARY KEY (level, bucket_ms, node_id, model_id, lane)
) WITHOUT ROWID;
"""


#: Migration step 4's SQL (routerd.store.migrations).
SCHEMA_SQL = _schema()
#: The rollup table's summed and histogram columns, with their types (step 6 rebuilds the table).
ROLLUP_VALUE_COLUMNS: tuple[tuple[str, str], ...] = (
    *((name, "REAL" if name in _REAL else "INTEGER") for name in SUMS),
    *((name, "INTEGER") for name in (*_D, *_T)))


class RequestRow(NamedTuple):
    """One finished request, as analytics records it (contract §9).

    A named tuple of plain values (one is made for every request: cheaper to build than a class
    instance, and the garbage collector stops tracking it), in the order of its table's columns.
    ``model_id`` is the public ID the client asked for (the site's name of the model, where the
    node knows it; else the local ID) and ``local_id`` the model that served it on this node;
    ``lent_to`` (an owner's lent row) and ``lent_from`` (a helper's borrowed row) name the other
    side as ``<node>/<model>``."""

    at_ms: int
    node_id: str
    model_id: str
    lane: str
    route: str
    status: str
    duration_ms: float
    http_status: int = 200
    ttft_ms: float | None = None  # streamed answers only
    prompt_tokens: int = 0
    completion_tokens: int = 0
    images: int = 0
    audio_seconds: float = 0.0
    vectors: int = 0
    lent: bool = False
    borrowed: bool = False
    guardian: bool = False
    key_name: str = ""
    request_id: str = ""
    local_id: str = ""
    lent_from: str = ""
    lent_to: str = ""
    cached_tokens: int = 0
    reason: str = ""


REQUEST_COLUMNS = ", ".join(RequestRow._fields)


@attrs.frozen
class LoadRow:
    """One finished model load (``status`` ``ok`` or ``failed``)."""

    at_ms: int
    node_id: str
    model_id: str
    config_filename: str
    runtime: str
    status: str
    duration_ms: float
    reason: str = ""
    log_tail: tuple[str, ...] = ()

    def values(self) -> tuple[object, ...]:
        return (self.at_ms, self.node_id, self.model_id, self.config_filename, self.runtime, self.status,
                float(self.duration_ms), self.reason, "\n".join(self.log_tail))


_LOAD_COLUMNS = "at_ms, node_id, model_id, config_filename, runtime, status, duration_ms, reason, log_tail"


# --- the latency histogram --------------------------------------------------------------------------

def bucket_of(ms: float) -> int:
    """The histogram bucket of a latency in milliseconds."""
    if not ms > 1.0:
        return 0
    return min(HIST_BUCKETS - 1, int(2 * math.log2(ms)))


def bucket_value(index: int) -> float:
    """What a value in bucket ``index`` is reported as: the bucket's geometric middle."""
    return float(2 ** ((index + 0.5) / 2))


def percentile(hist: Sequence[int], q: float) -> float | None:
    """The ``q`` quantile (0…1) of a histogram, or None when it is empty."""
    total = sum(hist)
    if total <= 0:
        return None
    rank = max(1, math.ceil(q * total))
    seen = 0
    for index, count in enumerate(hist):
        seen += count
        if seen >= rank:
            return round(bucket_value(index), 1)
    return round(bucket_value(len(hist) - 1), 1)  # pragma: no cover - rank <= total


# --- rollups ------------------------------------------------------------------------------------------

@attrs.define
class Sums:
    """Summed figures of some rows: the rollup row's value part, and what the site merges."""

    values: dict[str, float] = attrs.Factory(lambda: dict.fromkeys(SUMS, 0))
    duration_hist: list[int] = attrs.Factory(lambda: [0] * HIST_BUCKETS)
    ttft_hist: list[int] = attrs.Factory(lambda: [0] * HIST_BUCKETS)

    def add_request(self, row: RequestRow) -> None:
        v = self.values
        if row.lent:  # served elsewhere: the helper's row carries its work
            v["lent"] += 1
            return
        v["requests"] += 1
        v["errors"] += row.status != "ok"
        v["prompt_tokens"] += row.prompt_tokens
        v["completion_tokens"] += row.completion_tokens
        v["images"] += row.images
        v["audio_seconds"] += row.audio_seconds
        v["vectors"] += row.vectors
        v["borrowed"] += row.borrowed
        v["guardian"] += row.guardian
        if row.completion_tokens > 0:
            gen = row.duration_ms - (row.ttft_ms or 0.0)
            if gen > 0:
                v["gen_ms"] += gen
                v["gen_tokens"] += row.completion_tokens
        self.duration_hist[bucket_of(row.duration_ms)] += 1
        if row.ttft_ms is not None:
            self.ttft_hist[bucket_of(row.ttft_ms)] += 1

    def add_load(self, row: LoadRow) -> None:
        self.values["loads"] += 1
        self.values["load_failures"] += row.status != "ok"

    def merge(self, other: Sums) -> None:
        values = self.values
        for name, value in other.values.items():
            values[name] = values.get(name, 0) + value
        self.duration_hist = [a + b for a, b in zip(self.duration_hist, other.duration_hist, strict=True)]
        self.ttft_hist = [a + b for a, b in zip(self.ttft_hist, other.ttft_hist, strict=True)]

    def columns(self) -> tuple[object, ...]:
        return (*(self.values[name] for name in SUMS), *self.duration_hist, *self.ttft_hist)

    @classmethod
    def from_columns(cls, row: Sequence[Any], *, ttft: bool = True) -> Sums:
        """Sums from a query row of :data:`SUMS` then the histograms (``ttft`` False: the duration
        histogram only, the TTFT one left empty)."""
        n = len(SUMS)
        values = {name: row[i] or 0 for i, name in enumerate(SUMS)}
        ttft_hist = [int(c or 0) for c in row[n + HIST_BUCKETS:n + 2 * HIST_BUCKETS]] if ttft \
            else [0] * HIST_BUCKETS
        return cls(values, [int(c or 0) for c in row[n:n + HIST_BUCKETS]], ttft_hist)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Sums:
        """A node's model row or series point (contract §9) back into sums; bad fields count 0."""
        values: dict[str, float] = {}
        for name in SUMS:
            value = doc.get(name, 0)
            values[name] = value if isinstance(value, int | float) and not isinstance(value, bool) else 0
        if not values["gen_tokens"] and values["gen_ms"]:
            values["gen_tokens"] = values["completion_tokens"]
        return cls(values, _hist(doc.get("duration_hist")), _hist(doc.get("ttft_hist")))


def _hist(value: object) -> list[int]:
    if isinstance(value, list) and len(value) == HIST_BUCKETS \
            and all(type(count) is int for count in value) and min(value) >= 0:
        return value  # the usual, well-formed answer
    out = [0] * HIST_BUCKETS
    if isinstance(value, list):
        for index, count in enumerate(value[:HIST_BUCKETS]):
            if isinstance(count, int) and not isinstance(count, bool) and count > 0:
                out[index] = count
    return out


RollupKey = tuple[str, int, str, str, str, str]  # level, bucket_ms, node_id, model_id, local_id, lane


def rollup(requests: Iterable[RequestRow], loads: Iterable[LoadRow]) -> dict[RollupKey, Sums]:
    """What a batch adds to every rollup level: each row is added to its minute, and each minute's
    sums to its hour and day (a busy batch has far fewer minutes than rows)."""
    minute_ms = LEVELS["minute"]
    minutes: dict[RollupKey, Sums] = {}

    def minute(at_ms: int, node_id: str, model_id: str, local_id: str, lane: str) -> Sums:
        key = ("minute", at_ms - at_ms % minute_ms, node_id, model_id, local_id, lane)
        found = minutes.get(key)
        if found is None:
            found = minutes[key] = Sums()
        return found

    for row in requests:
        minute(row.at_ms, row.node_id, row.model_id, row.local_id or row.model_id, row.lane).add_request(row)
    for load in loads:  # a load is keyed by its local ID (the site names it: routerd.site.analytics)
        minute(load.at_ms, load.node_id, load.model_id, load.model_id, load.runtime).add_load(load)
    out = dict(minutes)
    for (_level, bucket, node, model, local, lane), sums in minutes.items():
        for level in ("hour", "day"):
            width = LEVELS[level]
            coarse = (level, bucket - bucket % width, node, model, local, lane)
            found = out.get(coarse)
            if found is None:
                out[coarse] = Sums(dict(sums.values), list(sums.duration_hist), list(sums.ttft_hist))
            else:
                found.merge(sums)
    return out


def figures(s: Sums) -> dict[str, Any]:
    """What a table row shows of some sums (contract §9 "Figures")."""
    v = s.values
    gen_ms = float(v["gen_ms"])
    return {
        "requests": int(v["requests"]), "errors": int(v["errors"]),
        "prompt_tokens": int(v["prompt_tokens"]), "completion_tokens": int(v["completion_tokens"]),
        "images": int(v["images"]), "audio_seconds": round(float(v["audio_seconds"]), 3),
        "vectors": int(v["vectors"]), "loads": int(v["loads"]), "load_failures": int(v["load_failures"]),
        "lent": int(v["lent"]), "borrowed": int(v["borrowed"]), "guardian": int(v["guardian"]),
        "p50_ms": percentile(s.duration_hist, 0.5), "p95_ms": percentile(s.duration_hist, 0.95),
        "ttft_p50_ms": percentile(s.ttft_hist, 0.5), "ttft_p95_ms": percentile(s.ttft_hist, 0.95),
        "tokens_per_s": round(float(v["gen_tokens"]) * 1000.0 / gen_ms, 2) if gen_ms > 0 else None,
    }


#: The keys :func:`figures` answers, in order.
FIGURES: tuple[str, ...] = ("requests", "errors", "prompt_tokens", "completion_tokens", "images",
                            "audio_seconds", "vectors", "loads", "load_failures", "lent", "borrowed",
                            "guardian", "p50_ms", "p95_ms", "ttft_p50_ms", "ttft_p95_ms", "tokens_per_s")


def mergeable(s: Sums, *, ttft: bool = True) -> dict[str, Any]:
    """The parts of some sums a node adds to its answer so the master can merge them (``ttft``
    False: without the TTFT histogram, which a series point does not show)."""
    out = {"gen_ms": round(float(s.values["gen_ms"]), 3), "gen_tokens": int(s.values["gen_tokens"]),
           "duration_hist": list(s.duration_hist)}
    if ttft:
        out["ttft_hist"] = list(s.ttft_hist)
    return out


# --- SQL (on the store's thread) ------------------------------------------------------------------

_ROLLUP_COLUMNS = (*_KEY, *SUMS, *_D, *_T)
_UPSERT = (
    f"INSERT INTO analytics_rollups ({', '.join(_ROLLUP_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(_ROLLUP_COLUMNS))}) "
    f"ON CONFLICT ({', '.join(_KEY)}) DO UPDATE SET "
    + ", ".join(f"{c} = {c} + excluded.{c}" for c in (*SUMS, *_D, *_T))
)


def write_batch(conn: sqlite3.Connection, requests: Sequence[RequestRow], loads: Sequence[LoadRow]) -> None:
    """Insert a batch's raw rows and add it into the rollups (the caller's one transaction)."""
    if requests:
        conn.executemany(f"INSERT INTO analytics_requests ({REQUEST_COLUMNS}) "
                         f"VALUES ({', '.join('?' * len(RequestRow._fields))})", requests)
    if loads:
        conn.executemany(f"INSERT INTO analytics_loads ({_LOAD_COLUMNS}) VALUES ({', '.join('?' * 9)})",
                         [r.values() for r in loads])
    conn.executemany(_UPSERT, [(*key, *sums.columns()) for key, sums in rollup(requests, loads).items()])


def prune(conn: sqlite3.Connection, raw_before_ms: int, level_before_ms: Mapping[str, int]) -> int:
    """Delete raw rows before ``raw_before_ms`` and each level's rollups before its cutoff."""
    removed = conn.execute("DELETE FROM analytics_requests WHERE at_ms < ?", (raw_before_ms,)).rowcount
    removed += conn.execute("DELETE FROM analytics_loads WHERE at_ms < ?", (raw_before_ms,)).rowcount
    for level, before in level_before_ms.items():
        removed += conn.execute("DELETE FROM analytics_rollups WHERE level = ? AND bucket_ms < ?",
                                (level, before)).rowcount
    return int(removed)


@attrs.frozen
class Query:
    """One analytics query: a period and optional filters (validated by the caller)."""

    period: str = "24h"
    model: str | None = None
    lane: str | None = None
    node_id: str | None = None
    #: With ``model``: this node's local IDs the site names ``model``, so the rows recorded under
    #: their local name (loads, requests sent to the node directly) match it too.
    locals: tuple[str, ...] = ()

    def window(self, now_ms: int) -> tuple[int, int, str, int]:
        """``(since_ms, until_ms, level, bucket_ms)``: the period from the start of its first bucket."""
        length, level = PERIODS[self.period]
        width = LEVELS[level]
        start = now_ms - length
        return start - start % width, now_ms, level, width

    def filters(self) -> dict[str, str | None]:
        return {"node_id": self.node_id, "model": self.model, "lane": self.lane}


_SUM_SQL = ", ".join(f"SUM({c})" for c in (*SUMS, *_D, *_T))
#: A series point shows no TTFT: its query leaves that histogram out.
_SERIES_SQL = ", ".join(f"SUM({c})" for c in (*SUMS, *_D))


def model_where(model: str, locals_: Sequence[str], args: list[object]) -> str:
    """The condition "the row is about ``model``": recorded under that name, or under one of
    ``locals_`` as its own local name (its arguments appended to ``args``)."""
    args.append(model)
    if not locals_:
        return "model_id = ?"
    args.extend(locals_)
    return f"(model_id = ? OR (model_id = local_id AND local_id IN ({', '.join('?' * len(locals_))})))"


def about_model(row: RequestRow, model: str, locals_: Sequence[str]) -> bool:
    """:func:`model_where` of one row in memory."""
    return row.model_id == model or (row.model_id == row.local_id and row.local_id in locals_)


#: One model row of a query: node, model (public), local ID, lane, sums.
TableRow = tuple[str, str, str, str, Sums]


def query(conn: sqlite3.Connection, q: Query,
          now_ms: int) -> tuple[list[TableRow], list[tuple[int, str, Sums]]]:
    """Rollup sums of the period: per (node, model, local ID, lane), and per (bucket, lane) for the
    series."""
    since, _until, level, _width = q.window(now_ms)
    where = "level = ? AND bucket_ms >= ?"
    args: list[object] = [level, since]
    for column, value in (("node_id", q.node_id), ("lane", q.lane)):
        if value is not None:
            where += f" AND {column} = ?"
            args.append(value)
    if q.model is not None:
        where += " AND " + model_where(q.model, q.locals, args)
    tables = [(str(r[0]), str(r[1]), str(r[2]), str(r[3]), Sums.from_columns(r[4:])) for r in conn.execute(
        f"SELECT node_id, model_id, local_id, lane, {_SUM_SQL} FROM analytics_rollups WHERE {where} "
        "GROUP BY node_id, model_id, local_id, lane ORDER BY model_id, node_id, local_id, lane", args)]
    series = [(int(r[0]), str(r[1]), Sums.from_columns(r[2:], ttft=False)) for r in conn.execute(
        f"SELECT bucket_ms, lane, {_SERIES_SQL} FROM analytics_rollups WHERE {where} "
        "GROUP BY bucket_ms, lane ORDER BY bucket_ms, lane", args)]
    return tables, series


def counts(conn: sqlite3.Connection) -> dict[str, int]:
    """Rows in each analytics table (benchmarks, tests)."""
    return {table: int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
            for table in ("analytics_requests", "analytics_loads", "analytics_rollups")}


__all__ = [
    "ANALYTICS_LANES", "FIGURES", "HIST_BUCKETS", "LEVELS", "PERIODS", "SCHEMA_SQL", "SUMS", "LoadRow",
    "Query", "ROLLUP_VALUE_COLUMNS", "RequestRow", "Sums", "TableRow", "bucket_of", "bucket_value", "counts",
    "figures", "mergeable",
    "REQUEST_COLUMNS", "about_model", "model_where", "percentile", "prune", "query", "rollup", "write_batch",
]
