"""Measured requests and model loads, the inputs of cost fitting (lending reference §5): the sample
types and the SQL that writes, reads and prunes them (``request_samples``, ``load_samples``)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

#: ``RequestSample.section`` values (analytics sections; text requests are ``llm``).  ``tts`` and
#: ``music`` are recorded for completeness (the routing layer emits them) but never priced; ``video``
#: (sd-server's ``vid_gen`` jobs, ``steps × width × height × frames``) is measured apart from
#: ``image`` so a video job's minutes do not skew the image lane's fit, and is never priced (never lent).
SECTIONS: tuple[str, ...] = ("llm", "image", "stt", "embeddings", "tts", "music", "video")
#: ``LoadSample.runtime`` values.
RUNTIMES: tuple[str, ...] = ("text", "image", "stt")
#: The status of a successful request or load; anything else is an error code.
OK = "ok"


def _work(values: Iterable[float]) -> tuple[float, ...]:
    return tuple(map(float, values))


@attrs.frozen
class RequestSample:
    """One finished request.

    ``work`` depends on the section: text ``(prompt_tokens, output_tokens)``;
    image ``(steps * width * height * count,)``; stt ``(audio_seconds,)``; embeddings and
    tts as the routing layer measures them.
    """

    model_id: str
    section: str
    work: tuple[float, ...] = attrs.field(converter=_work)
    duration_ms: float
    status: str
    finished_at_ms: int
    http_status: int = 200
    request_bytes: int = 0
    node_id: str = ""


@attrs.frozen
class LoadSample:
    """One finished model (config) load, successful or not."""

    config_filename: str
    model_id: str
    runtime: str
    duration_ms: float
    status: str
    finished_at_ms: int
    reason: str = ""


_REQUEST_COLUMNS = (
    "model_id, section, work, duration_ms, status, finished_at, http_status, request_bytes, node_id"
)
_LOAD_COLUMNS = "config_filename, model_id, runtime, duration_ms, status, finished_at, reason"


#: What ``json.dumps`` encodes with when given no options (its ``_default_encoder``): the same text,
#: without its option checks (ops.py: 26 opcodes a request fewer).
_json = json.JSONEncoder().encode


def request_row(sample: RequestSample) -> tuple[object, ...]:
    """The ``request_samples`` values of ``sample``, in the order ``insert_requests`` writes them."""
    return (sample.model_id, sample.section, _json(list(sample.work)), float(sample.duration_ms),
            sample.status, int(sample.finished_at_ms), int(sample.http_status), int(sample.request_bytes),
            sample.node_id)


def _request_sample(row: tuple[Any, ...]) -> RequestSample:
    model_id, section, work, duration_ms, status, finished_at, http_status, request_bytes, node_id = row
    decoded = json.loads(str(work)) if work else []
    return RequestSample(str(model_id), str(section), tuple(float(v) for v in decoded), float(duration_ms),
                         str(status), int(finished_at), int(http_status), int(request_bytes), str(node_id))


def _load_row(sample: LoadSample) -> tuple[object, ...]:
    return (sample.config_filename, sample.model_id, sample.runtime, float(sample.duration_ms), sample.status,
            int(sample.finished_at_ms), sample.reason)


def _load_sample(row: tuple[Any, ...]) -> LoadSample:
    config_filename, model_id, runtime, duration_ms, status, finished_at, reason = row
    return LoadSample(str(config_filename), str(model_id), str(runtime), float(duration_ms), str(status),
                      int(finished_at), str(reason))


def insert_requests(conn: sqlite3.Connection, rows: Sequence[tuple[object, ...]]) -> None:
    """Write a batch of ``request_row`` values."""
    conn.executemany(f"INSERT INTO request_samples ({_REQUEST_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?)", rows)


def insert_load(conn: sqlite3.Connection, sample: LoadSample) -> None:
    """Write one finished load."""
    conn.execute(f"INSERT INTO load_samples ({_LOAD_COLUMNS}) VALUES (?,?,?,?,?,?,?)", _load_row(sample))


def prune(conn: sqlite3.Connection, before_ms: int) -> int:
    """Delete request and load samples finished before ``before_ms``; return the rows removed."""
    removed = conn.execute("DELETE FROM request_samples WHERE finished_at < ?", (before_ms,)).rowcount
    removed += conn.execute("DELETE FROM load_samples WHERE finished_at < ?", (before_ms,)).rowcount
    return int(removed)


def _where(base: str, args: list[object], **equal: object) -> str:
    """``base`` and one ``AND column = ?`` for each given (not None) value, its value appended to
    ``args``."""
    where = base
    for column, value in equal.items():
        if value is not None:
            where += f" AND {column} = ?"
            args.append(value)
    return where


def query_requests(
    conn: sqlite3.Connection, model_id: str | None, section: str, since_ms: int, status: str | None,
    newest: int | None,
) -> list[RequestSample]:
    """Requests of ``model_id`` (None: every model) in ``section`` finished at or after
    ``since_ms`` with ``status`` (None: any), oldest first; with ``newest``, only the newest
    that many of each model (chosen inside SQLite: nothing else is read into Python)."""
    args: list[object] = [section, since_ms]
    where = _where("section = ? AND finished_at >= ?", args, model_id=model_id, status=status)
    if newest is None:
        sql = f"SELECT {_REQUEST_COLUMNS} FROM request_samples WHERE {where} ORDER BY finished_at, id"
    else:
        sql = (f"SELECT {_REQUEST_COLUMNS} FROM (SELECT {_REQUEST_COLUMNS}, id, ROW_NUMBER() OVER "
               f"(PARTITION BY model_id ORDER BY finished_at DESC, id DESC) AS newness "
               f"FROM request_samples WHERE {where}) WHERE newness <= ? ORDER BY finished_at, id")
        args.append(newest)
    return [_request_sample(row) for row in conn.execute(sql, args)]


def query_loads(
    conn: sqlite3.Connection, since_ms: int, config_filename: str | None, status: str | None
) -> list[LoadSample]:
    """Loads finished at or after ``since_ms`` (of one config; with ``status``, None: any),
    oldest first."""
    args: list[object] = [since_ms]
    where = _where("finished_at >= ?", args, config_filename=config_filename, status=status)
    sql = f"SELECT {_LOAD_COLUMNS} FROM load_samples WHERE {where} ORDER BY finished_at, id"
    return [_load_sample(row) for row in conn.execute(sql, args)]


def load_summary(conn: sqlite3.Connection, since_ms: int) -> dict[str, tuple[float, int]]:
    """Config filename → (mean duration ms, count) of successful loads since ``since_ms``."""
    rows = conn.execute(
        "SELECT config_filename, AVG(duration_ms), COUNT(*) FROM load_samples"
        " WHERE finished_at >= ? AND status = ? AND config_filename != ''"
        " GROUP BY config_filename ORDER BY config_filename",
        (since_ms, OK),
    )
    return {str(name): (float(mean), int(count)) for name, mean, count in rows}
