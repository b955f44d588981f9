"""Folding of decision rows for the WebUI Lending tab (routerd.lending.fold)."""

from __future__ import annotations

from typing import Any

from routerd.lending.fold import FOLD_KEY, fold, page


def row(ident: int, at: int, **fields: Any) -> dict[str, Any]:
    base = {"id": ident, "recorded_at": at, "node_id": "owner", "kind": "dispatch", "lane": "text",
            "outcome": "lent", "owner_node_id": "owner", "owner_model_id": "alpha",
            "helper_node_id": "helper", "helper_model_id": "beta", "slots": 2}
    return {**base, **fields}


def test_rows_with_the_same_key_fold_into_one_line_with_count_first_and_last_time() -> None:
    rows = [row(3, 3000, lent_out=3), row(1, 1000, lent_out=1), row(2, 2000, lent_out=2)]
    [line] = fold(rows)
    assert (line["count"], line["first_ms"], line["last_ms"], line["span_ms"]) == (3, 1000, 3000, 2000)
    # the line shows every variable of the newest row
    assert line["latest"] == rows[0]
    assert {name: line[name] for name in ("kind", "outcome", "owner_model_id")} == \
        {"kind": "dispatch", "outcome": "lent", "owner_model_id": "alpha"}


def test_the_numbers_of_a_decision_are_not_part_of_the_key_but_who_what_and_why_are() -> None:
    rows = [row(1, 1000, pending_count=4, keep_ms=10.0), row(2, 1100, pending_count=9, keep_ms=99.5)]
    assert len(fold(rows)) == 1
    for name in FOLD_KEY:
        other = row(3, 1200, **{name: "something else"})
        assert len(fold([*rows, other])) == 2, name


def test_lines_are_newest_first_by_their_last_row_and_ties_do_not_depend_on_input_order() -> None:
    rows = [row(1, 1000, outcome="returned"), row(2, 5000), row(3, 3000, outcome="returned"),
            row(4, 4000, kind="plan", outcome="granted"), row(5, 4000, kind="plan", outcome="probe")]
    lines = fold(rows)
    assert [(ln["kind"], ln["outcome"], ln["count"]) for ln in lines] == [
        ("dispatch", "lent", 1), ("plan", "probe", 1), ("plan", "granted", 1), ("dispatch", "returned", 2)]
    assert fold(list(reversed(rows))) == lines


def test_absent_and_null_fields_are_the_same_key() -> None:
    rows = [row(1, 1000, reason=None), row(2, 2000)]
    assert [ln["count"] for ln in fold(rows)] == [2]


def test_pages_cut_the_lines_and_carry_the_totals() -> None:
    rows = [row(i, 1000 + i, owner_model_id=f"m{i % 7}") for i in range(70)]
    lines = fold(rows)
    assert len(lines) == 7
    first = page(lines, 0, 3)
    assert [ln["owner_model_id"] for ln in first["lines"]] == [ln["owner_model_id"] for ln in lines[:3]]
    assert (first["pages"], first["total_lines"], first["total_rows"]) == (3, 7, 70)
    assert len(page(lines, 2, 3)["lines"]) == 1
    assert page(lines, 9, 3)["lines"] == []
    assert page([], 0, 50) == {"lines": [], "page": 0, "page_size": 50, "pages": 1, "total_lines": 0,
                               "total_rows": 0, "oldest_ms": 0, "newest_ms": 0}


def test_a_page_names_the_window_its_counts_cover_whatever_page_it_is() -> None:
    """The Lending page labels its counts with the time window of every folded row (issue 32 item 6):
    the oldest and newest ``recorded_at`` of all lines, not of the page shown."""
    rows = [row(i, 1000 + 10 * i, owner_model_id=f"m{i % 7}") for i in range(70)]
    lines = fold(rows)
    for number in (0, 2, 9):
        shown = page(lines, number, 3)
        assert (shown["oldest_ms"], shown["newest_ms"]) == (1000, 1690)
