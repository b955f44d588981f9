"""The decision log's follow cursor (``routerd.lending.follow``): one rule for ``routerd decisions
--follow`` and the WebUI's live tail, each row answered once, the rows of every node alike."""

from __future__ import annotations

from typing import Any

import pytest

from routerd.lending.follow import Cursor, advance


def row(node: str, ident: int, at: int) -> dict[str, Any]:
    return {"node_id": node, "id": ident, "recorded_at": at, "outcome": "lent"}


def test_without_a_cursor_every_row_is_new_and_the_cursor_names_the_newest_instant() -> None:
    rows = [row("b", 7, 30), row("a", 4, 30), row("a", 3, 20)]
    fresh, cursor = advance(rows, None)
    assert fresh == rows
    assert cursor == Cursor(30, frozenset({("a", 4), ("b", 7)}))


def test_rows_of_the_cursors_instant_come_once_whichever_poll_brings_them() -> None:
    """Two nodes write in the same millisecond; the second node's row arrives a poll later."""
    _, cursor = advance([row("a", 4, 30)], None)
    fresh, cursor = advance([row("b", 7, 30), row("a", 4, 30)], cursor)
    assert fresh == [row("b", 7, 30)]
    assert cursor == Cursor(30, frozenset({("a", 4), ("b", 7)}))
    fresh, cursor = advance([row("a", 5, 31), row("b", 7, 30), row("a", 4, 30)], cursor)
    assert fresh == [row("a", 5, 31)]
    assert cursor == Cursor(31, frozenset({("a", 5)}))  # what it holds stays small
    assert advance([row("a", 5, 31)], cursor) == ([], cursor)


def test_a_row_older_than_the_cursor_is_not_new() -> None:
    fresh, cursor = advance([row("a", 9, 10)], Cursor(30, frozenset()))
    assert fresh == [] and cursor == Cursor(30, frozenset())


def test_a_cursor_survives_its_text_and_anything_else_is_refused() -> None:
    cursor = Cursor(1764590391000, frozenset({("slave-a", 12), ("master", 3)}))
    text = cursor.encode()
    assert text.isascii() and "=" not in text and "/" not in text and "+" not in text
    assert Cursor.decode(text) == cursor
    assert Cursor.decode(Cursor().encode()) == Cursor()
    for bad in ("", "nope", "WzEsMl0", "WyJ4IixbXV0", "Wy0xLFtdXQ", "WzEsW1sxLDJdXV0", "%%%"):
        with pytest.raises(ValueError, match="cursor"):
            Cursor.decode(bad)
