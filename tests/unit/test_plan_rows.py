"""PlanRows (issue 24 item 3): a plan's rows held as column chunks read as a sequence of PlanRow."""

from __future__ import annotations

import pytest

from routerd.wire.lending import PlanRow
from routerd.wire.plan_rows import Gathered, PlanRows, distinct

GRANTED = PlanRow("tick", "image", "a", "sd", "b", "sd-b", "granted", None, 8, 10, 9000.0, 2500.0, 0.0, 900.0,
                  1000.0, "helper", 12000, 2)
SKIPPED = PlanRow("tick", "image", "a", "sd", "c", "sd-c", "skipped", "outranked", 8, 10, 9000.0, 0.0, 0.0,
                  950.0, 1000.0, "helper", 400, 0)
GONE = PlanRow("probe_due", "text", "x", "llm", "y", "llm-y", "skipped", "owner_unavailable")


def test_rows_read_back_as_the_plan_rows_they_were_made_from_in_order() -> None:
    rows = PlanRows.of([GRANTED, SKIPPED, GONE])
    assert len(rows) == 3
    assert list(rows) == [GRANTED, SKIPPED, GONE]
    assert (rows[0], rows[1], rows[2], rows[-1], rows[-3]) == (GRANTED, SKIPPED, GONE, GONE, GRANTED)
    assert rows[1:] == [SKIPPED, GONE]
    with pytest.raises(IndexError):
        rows[3]
    with pytest.raises(IndexError):
        rows[-4]


def test_rows_span_chunks_and_compare_equal_to_a_list_of_the_same_rows() -> None:
    head = ("tick", "image", "a", "sd", 8, 10, 9000.0, 1000.0)
    first = PlanRows.of([GRANTED])
    rows = PlanRows([
        ([head], [("b", "sd-b", 2500.0, 0.0, 12000)], ["granted"], [None], [900.0], ["helper"], [2]),
        ([head], [("c", "sd-c", 0.0, 0.0, 400)], ["skipped"], ["outranked"], [950.0], ["helper"], [0]),
    ])
    assert len(rows) == 2 and rows[1] == SKIPPED and rows[-2] == GRANTED
    assert rows == [GRANTED, SKIPPED] and rows == PlanRows.of([GRANTED, SKIPPED])
    assert rows != [GRANTED] and rows != [SKIPPED, GRANTED] and first != rows
    assert PlanRows.of(rows) is rows


def test_flat_gives_each_rows_values_in_field_order_without_row_objects() -> None:
    rows = PlanRows.of([GRANTED, GONE])
    assert list(rows.flat()) == [
        ("tick", "image", "a", "sd", "b", "sd-b", "granted", None, 8, 10, 9000.0, 2500.0, 0.0, 900.0, 1000.0,
         "helper", 12000, 2),
        ("probe_due", "text", "x", "llm", "y", "llm-y", "skipped", "owner_unavailable", 0, 0, 0.0, 0.0, 0.0,
         0.0, 0.0, None, 0, 0),
    ]


def test_a_chunk_with_columns_of_unequal_length_is_refused() -> None:
    head = ("tick", "image", "a", "sd", 8, 10, 9000.0, 1000.0)
    with pytest.raises(ValueError):
        PlanRows([([head, head], [("b", "sd-b", 0.0, 0.0, 0)], ["skipped"], [None], [0.0], [None], [0])])
    assert len(PlanRows()) == 0 and list(PlanRows()) == []


def test_a_gathered_column_reads_its_shared_values_by_position() -> None:
    """Gathered (issue 24): the planner's heads, tails, outcomes, reasons and sources are a few shared
    values and one position per row, looked up as the rows are read (a list or a numpy array)."""
    import numpy as np

    names = ("skipped", "granted", "probe")
    for at in ([0, 2, 0, 1], np.array([0, 2, 0, 1], dtype=np.intp)):
        column = Gathered(names, at)
        assert len(column) == 4 and list(column) == ["skipped", "probe", "skipped", "granted"]
        assert column[1] == "probe" and column[-1] == "granted" and column[1:3] == ["probe", "skipped"]
        assert column.codes() == [0, 2, 0, 1] and column.used() == ["skipped", "granted", "probe"]
    shared = ("tick", "image", "a", "sd", 8, 10, 9000.0, 1000.0)
    assert distinct([shared, shared, GRANTED]) == [shared, GRANTED]
    assert distinct(Gathered(names, [2, 2])) == ["probe"]
    head = ("tick", "image", "a", "sd", 8, 10, 9000.0, 1000.0)
    rows = PlanRows([(
        Gathered([head], [0, 0]), [("b", "sd-b", 2500.0, 0.0, 12000), ("c", "sd-c", 0.0, 0.0, 400)],
        Gathered(names, np.array([1, 0])), Gathered((None, "outranked"), [0, 1]), [900.0, 950.0],
        Gathered((None, "helper"), [1, 1]), [2, 0],
    )])
    assert rows == [GRANTED, SKIPPED]
