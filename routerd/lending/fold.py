"""Folding of decision-log rows for the WebUI Lending tab (spec "Decision log": repeated rows are
folded into one line with a count and a time span; one row shows every variable of the decision).

Pure: rows in, lines out.  Two rows repeat each other when they agree on :data:`FOLD_KEY` (where,
what kind, which lane, why, who with whom, and what came of it); the numbers that change from one
decision to the next (held counts, times, slots) are not part of the key.  Every row with the same
key becomes one line: its count, the first and last ``recorded_at``, and the newest row whole (the
"detail" the page shows).  Lines are ordered newest first by their last row; pagination cuts that
list.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

#: The fields two rows must share to fold into one line.
FOLD_KEY: tuple[str, ...] = (
    "node_id", "kind", "lane", "trigger", "outcome", "reason",
    "owner_node_id", "owner_model_id", "helper_node_id", "helper_model_id",
)

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500


def _stamp(row: Mapping[str, Any]) -> int:
    value = row.get("recorded_at")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _ident(row: Mapping[str, Any]) -> int:
    value = row.get("id")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def fold_key(row: Mapping[str, Any]) -> tuple[str, ...]:
    """The key of ``row``: its :data:`FOLD_KEY` fields as text (absent and null are both "")."""
    return tuple("" if row.get(name) is None else str(row.get(name)) for name in FOLD_KEY)


@attrs.define
class _Line:
    key: tuple[str, ...]
    count: int
    first_ms: int
    last_ms: int
    latest: Mapping[str, Any]


def _newer(row: Mapping[str, Any], than: Mapping[str, Any]) -> bool:
    return (_stamp(row), _ident(row)) > (_stamp(than), _ident(than))


def fold(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every row folded by key: ``[{<key fields>, count, first_ms, last_ms, latest}]``, newest
    line first (ties by key, so the order does not depend on the input order)."""
    lines: dict[tuple[str, ...], _Line] = {}
    for row in rows:
        key = fold_key(row)
        stamp = _stamp(row)
        line = lines.get(key)
        if line is None:
            lines[key] = _Line(key, 1, stamp, stamp, row)
            continue
        line.count += 1
        line.first_ms = min(line.first_ms, stamp)
        line.last_ms = max(line.last_ms, stamp)
        if _newer(row, line.latest):
            line.latest = row
    ordered = sorted(lines.values(), key=lambda ln: ln.key)
    ordered.sort(key=lambda ln: (ln.last_ms, _ident(ln.latest)), reverse=True)
    out: list[dict[str, Any]] = []
    for line in ordered:
        entry: dict[str, Any] = {name: line.latest.get(name) for name in FOLD_KEY}
        entry.update(count=line.count, first_ms=line.first_ms, last_ms=line.last_ms,
                     span_ms=line.last_ms - line.first_ms, latest=dict(line.latest))
        out.append(entry)
    return out


def page(lines: list[dict[str, Any]], number: int, size: int) -> dict[str, Any]:
    """Page ``number`` (0-based) of ``size`` lines, with the totals the page needs to paginate and
    the window the counts cover: ``oldest_ms`` and ``newest_ms``, the first and last ``recorded_at``
    of every line (0 without lines).  A page past the end is empty (the page count tells the UI
    where the end is)."""
    size = max(1, min(size, MAX_PAGE_SIZE))
    pages = max(1, -(-len(lines) // size))
    start = max(0, number) * size
    return {"lines": lines[start:start + size], "page": max(0, number), "page_size": size,
            "pages": pages, "total_lines": len(lines),
            "total_rows": sum(int(line["count"]) for line in lines),
            "oldest_ms": min((int(line["first_ms"]) for line in lines), default=0),
            "newest_ms": max((int(line["last_ms"]) for line in lines), default=0)}


__all__ = ["DEFAULT_PAGE_SIZE", "FOLD_KEY", "MAX_PAGE_SIZE", "fold", "fold_key", "page"]
