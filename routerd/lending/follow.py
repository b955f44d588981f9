"""The follow cursor of the decision log: ``routerd decisions --follow`` and the WebUI's live tail
poll the decisions routes with it and get each row once, the rows of every node alike.

Pure.  A cursor names the newest ``recorded_at`` seen (``since_ms``) and the rows recorded at that
very instant that were seen (node id and row id: rows of one millisecond may come in two polls).  A
poll asks for the rows recorded at or after ``since_ms`` and :func:`advance` drops the ones the
cursor has seen; the answer's cursor names its own newest instant, so what a follower holds stays
a few rows whatever it has printed.  On the wire the cursor is opaque text (URL-safe base64 of a
small JSON array), handed back as it came.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import attrs

#: A row as the cursor knows it: (node id, row id).
Seen = tuple[str, int]
Row = TypeVar("Row", bound=Mapping[str, Any])


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _seen(row: Mapping[str, Any]) -> Seen:
    return (str(row.get("node_id") or ""), _int(row.get("id")))


@attrs.frozen
class Cursor:
    """Where a follower is: rows before ``since_ms``, and the ``seen`` rows at it, were answered."""

    since_ms: int = 0
    seen: frozenset[Seen] = frozenset()

    def encode(self) -> str:
        body = json.dumps([self.since_ms, sorted([node, ident] for node, ident in self.seen)],
                          separators=(",", ":"))
        return base64.urlsafe_b64encode(body.encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> Cursor:
        """The cursor ``encode`` wrote; ``ValueError`` for anything else."""
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            since, seen = json.loads(raw)
        except (binascii.Error, UnicodeDecodeError, ValueError, TypeError) as exc:
            raise ValueError("not a cursor this API wrote") from exc
        if _int(since) != since or since < 0 or not isinstance(seen, list) or not all(
                isinstance(s, list) and len(s) == 2 and isinstance(s[0], str) and _int(s[1]) == s[1]
                for s in seen):
            raise ValueError("not a cursor this API wrote")
        return cls(since, frozenset((node, ident) for node, ident in seen))


def advance(rows: Sequence[Row], after: Cursor | None) -> tuple[list[Row], Cursor]:
    """The rows of an answer (recorded at or after ``after.since_ms``, in their order) less those
    the cursor has seen, and the cursor that follows them; without ``after`` every row is new."""
    cursor = after or Cursor()
    fresh = [row for row in rows
             if _int(row.get("recorded_at")) > cursor.since_ms
             or (_int(row.get("recorded_at")) == cursor.since_ms and _seen(row) not in cursor.seen)]
    newest = max((_int(row.get("recorded_at")) for row in fresh), default=cursor.since_ms)
    seen = {_seen(row) for row in fresh if _int(row.get("recorded_at")) == newest}
    if newest == cursor.since_ms:
        seen |= cursor.seen
    return fresh, Cursor(newest, frozenset(seen))


__all__ = ["Cursor", "advance"]
