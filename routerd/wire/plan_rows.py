"""The rows of one lease plan, held compactly (issue 24: thousands of rows a plan on a big site).

A plan writes one :class:`~routerd.wire.lending.PlanRow` per linked owner/helper pair (spec
"Decision log"; contract §8): 8,192 of them for 64 nodes × 32 owners × 4 helpers.  Building that
many attrs objects costs more than planning them, so the planner appends each row as one small
tuple that shares what the owner's rows and the helper's rows have in common:

* ``head`` = ``(trigger, lane, owner_node_id, owner_model_id, pending_count, backlog_count,
  keep_ms, owner_job_ms)``, one tuple per owner (and lane) a plan;
* ``tail`` = ``(helper_node_id, helper_model_id, switch_ms, restore_ms, helper_idle_ms)``, one
  tuple per helper a plan;
* then ``outcome, reason, service_ms, service_source, slots`` of the pair itself.

:class:`PlanRows` is a read-only sequence of :class:`PlanRow` over such tuples: a row object is
built only when someone reads it (tests, the API), while the decision log writes the tuples as
they are (:meth:`PlanRows.flat`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import overload

from routerd.wire.lending import Lane, Outcome, PlanRow, Reason, ServiceSource, Trigger

#: The owner's part of its rows in one plan.
Head = tuple[Trigger, Lane, str, str, int, int, float, float]
#: The helper's part of its rows in one plan.
Tail = tuple[str, str, float, float, int]
#: One row: the owner's head, the helper's tail, outcome, reason, service_ms, service_source, slots.
CompactRow = tuple[Head, Tail, Outcome, Reason | None, float, ServiceSource | None, int]
#: One row's values in :class:`PlanRow` field order.
FlatRow = tuple[Trigger, Lane, str, str, str, str, Outcome, Reason | None, int, int, float, float, float,
                float, float, ServiceSource | None, int, int]


def compact(row: PlanRow) -> CompactRow:
    """``row`` as a compact tuple (for rows built one by one, not by the planner)."""
    head: Head = (row.trigger, row.lane, row.owner_node_id, row.owner_model_id, row.pending_count,
                  row.backlog_count, row.keep_ms, row.owner_job_ms)
    tail: Tail = (row.helper_node_id, row.helper_model_id, row.switch_ms, row.restore_ms, row.helper_idle_ms)
    return (head, tail, row.outcome, row.reason, row.service_ms, row.service_source, row.slots)


def _flat(row: CompactRow) -> FlatRow:
    (trigger, lane, owner_node, owner_model, pending, backlog, keep, owner_job), tail, outcome, reason, \
        service, source, slots = row
    helper_node, helper_model, switch, restore, idle = tail
    return (trigger, lane, owner_node, owner_model, helper_node, helper_model, outcome, reason, pending,
            backlog, keep, switch, restore, service, owner_job, source, idle, slots)


class PlanRows(Sequence[PlanRow]):
    """A plan's rows in order, as :class:`PlanRow` objects made on reading.

    Equal to any sequence of the same rows in the same order (a list of :class:`PlanRow` too)."""

    __slots__ = ("compact",)

    def __init__(self, rows: Iterable[CompactRow] = ()) -> None:
        #: The rows as the planner appended them (read, never change).
        self.compact: list[CompactRow] = list(rows)

    @classmethod
    def of(cls, rows: Iterable[PlanRow]) -> PlanRows:
        """The rows of any iterable of :class:`PlanRow` (a :class:`PlanRows` is returned as is)."""
        if isinstance(rows, PlanRows):
            return rows
        return cls(compact(row) for row in rows)

    def flat(self) -> Iterator[FlatRow]:
        """Every row's values in :class:`PlanRow` field order, no row object made."""
        return map(_flat, self.compact)

    def __len__(self) -> int:
        return len(self.compact)

    @overload
    def __getitem__(self, index: int) -> PlanRow: ...
    @overload
    def __getitem__(self, index: slice) -> list[PlanRow]: ...

    def __getitem__(self, index: int | slice) -> PlanRow | list[PlanRow]:
        if isinstance(index, slice):
            return [PlanRow(*_flat(row)) for row in self.compact[index]]
        return PlanRow(*_flat(self.compact[index]))

    def __iter__(self) -> Iterator[PlanRow]:
        return (PlanRow(*values) for values in self.flat())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PlanRows):
            return list(self.flat()) == list(other.flat())
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-looking, like a list

    def __repr__(self) -> str:
        return f"PlanRows({list(self)!r})"


__all__ = ["CompactRow", "FlatRow", "Head", "PlanRows", "Tail", "compact"]
