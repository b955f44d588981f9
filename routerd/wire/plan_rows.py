"""The rows of one lease plan, held compactly (thousands of rows a plan on a big site).

A plan writes one :class:`~routerd.wire.lending.PlanRow` per linked owner/helper pair (spec
"Decision log"; contract §8): 8,192 of them for 64 nodes × 32 owners × 4 helpers.  Building that
many attrs objects (or even that many tuples) costs more than planning them, so the planner hands
over its rows as columns, in chunks, sharing what the rows of one owner or one helper have in common:

* ``heads``: per row ``(trigger, lane, owner_node_id, owner_model_id, pending_count,
  backlog_count, keep_ms, owner_job_ms)``, one tuple per owner (and lane) a plan;
* ``tails``: per row ``(helper_node_id, helper_model_id, switch_ms, restore_ms, helper_idle_ms)``,
  one tuple per helper a plan;
* then per row ``outcome``, ``reason``, ``service_ms``, ``service_source`` and ``slots``.

:class:`PlanRows` is a read-only sequence of :class:`PlanRow` over such chunks: a row object is
built only when someone reads it (tests, the API), while the decision log writes the values as they
are (:meth:`PlanRows.flat`, one tuple per row and nothing else).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from operator import index as as_index
from typing import TYPE_CHECKING, Any, TypeVar, overload

from routerd.wire.lending import Lane, Outcome, PlanRow, Reason, ServiceSource, Trigger

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    #: Row positions: a list, or a numpy array of them (no numpy is imported here).
    Indexes = Sequence[int] | npt.NDArray[np.intp] | npt.NDArray[np.int64]

#: The owner's part of its rows in one plan.
Head = tuple[Trigger, Lane, str, str, int, int, float, float]
#: The helper's part of its rows in one plan.
Tail = tuple[str, str, float, float, int]
#: One chunk of rows as columns: heads, tails, outcomes, reasons, service_ms, service sources, slots.
Chunk = tuple[Sequence[Head], Sequence[Tail], Sequence[Outcome], Sequence["Reason | None"], Sequence[float],
              Sequence["ServiceSource | None"], Sequence[int]]
#: One row's values in :class:`PlanRow` field order.
FlatRow = tuple[Trigger, Lane, str, str, str, str, Outcome, Reason | None, int, int, float, float, float,
                float, float, ServiceSource | None, int, int]


def _flat(head: Head, tail: Tail, outcome: Outcome, reason: Reason | None, service: float,
          source: ServiceSource | None, slots: int) -> FlatRow:
    trigger, lane, owner_node, owner_model, pending, backlog, keep, owner_job = head
    helper_node, helper_model, switch, restore, idle = tail
    return (trigger, lane, owner_node, owner_model, helper_node, helper_model, outcome, reason, pending,
            backlog, keep, switch, restore, service, owner_job, source, idle, slots)


T = TypeVar("T")


class _Rows(Sequence[T]):
    """A read-only column or table read row by row: a slice is a list of its rows, an integer the
    row :meth:`_row` builds."""

    __slots__ = ()

    @overload
    def __getitem__(self, index: int) -> T: ...
    @overload
    def __getitem__(self, index: slice) -> list[T]: ...

    def __getitem__(self, index: int | slice) -> T | list[T]:
        if isinstance(index, slice):
            return list(self)[index]
        return self._row(index)

    def _row(self, index: int) -> T:
        raise NotImplementedError


class Gathered(_Rows[T]):
    """A column whose rows repeat a few values: ``values[i] for i in at``, looked up as it is read
    (the planner's heads, tails, outcomes, reasons and sources; ``at`` may be a numpy array)."""

    __slots__ = ("values", "at")

    def __init__(self, values: Sequence[T], at: Indexes) -> None:
        self.values = values
        self.at: Any = at

    def __len__(self) -> int:
        return len(self.at)

    def _row(self, index: int) -> T:
        return self.values[as_index(self.at[index])]

    def __iter__(self) -> Iterator[T]:
        return map(self.values.__getitem__, self.at)

    def codes(self) -> list[int]:
        """Each row's position in ``values``."""
        at = self.at
        codes: list[int] = at.tolist() if hasattr(at, "tolist") else list(at)
        return codes

    def used(self) -> list[T]:
        """The values some row holds, each once."""
        return [self.values[i] for i in sorted(set(self.codes()))]


def distinct(column: Sequence[T]) -> list[T]:
    """The values of a column, each once (by identity for unhashable or equal-but-distinct values:
    a plan's heads and tails are shared tuples)."""
    if isinstance(column, Gathered):
        return column.used()
    return list({id(value): value for value in column}.values())


class PlanRows(_Rows[PlanRow]):
    """A plan's rows in order, as :class:`PlanRow` objects made on reading.

    Equal to any sequence of the same rows in the same order (a list of :class:`PlanRow` too)."""

    __slots__ = ("chunks", "_length")

    def __init__(self, chunks: Iterable[Chunk] = ()) -> None:
        #: The rows as columns, chunk after chunk (read, never change).
        self.chunks: list[Chunk] = []
        self._length = 0
        for chunk in chunks:
            self.add(chunk)

    def add(self, chunk: Chunk) -> None:
        """Append a chunk of rows (its seven columns of equal length)."""
        length = len(chunk[0])
        if any(len(column) != length for column in chunk):
            raise ValueError("plan row columns of unequal length")
        if length:
            self.chunks.append(chunk)
            self._length += length

    @classmethod
    def of(cls, rows: Iterable[PlanRow]) -> PlanRows:
        """The rows of any iterable of :class:`PlanRow` (a :class:`PlanRows` is returned as is)."""
        if isinstance(rows, PlanRows):
            return rows
        heads: list[Head] = []
        tails: list[Tail] = []
        rest: list[tuple[Outcome, Reason | None, float, ServiceSource | None, int]] = []
        for row in rows:
            heads.append((row.trigger, row.lane, row.owner_node_id, row.owner_model_id, row.pending_count,
                          row.backlog_count, row.keep_ms, row.owner_job_ms))
            tails.append((row.helper_node_id, row.helper_model_id, row.switch_ms, row.restore_ms,
                          row.helper_idle_ms))
            rest.append((row.outcome, row.reason, row.service_ms, row.service_source, row.slots))
        outcomes, reasons, services, sources, slots = (list(c) for c in zip(*rest, strict=True)) if rest \
            else ([], [], [], [], [])
        return cls([(heads, tails, outcomes, reasons, services, sources, slots)])

    def flat(self) -> Iterator[FlatRow]:
        """Every row's values in :class:`PlanRow` field order, no row object made."""
        return chain.from_iterable(map(_flat, *chunk) for chunk in self.chunks)

    def __len__(self) -> int:
        return self._length

    def _row(self, index: int) -> PlanRow:
        at = index + self._length if index < 0 else index
        if not 0 <= at < self._length:
            raise IndexError("plan row index out of range")
        for chunk in self.chunks:
            if at < len(chunk[0]):
                return PlanRow(*_flat(*(column[at] for column in chunk)))  # type: ignore[arg-type]
            at -= len(chunk[0])
        raise AssertionError("unreachable")  # pragma: no cover

    def __iter__(self) -> Iterator[PlanRow]:
        return (PlanRow(*values) for values in self.flat())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PlanRows):
            return list(self.flat()) == list(other.flat())
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # compared by value, like a list

    def __repr__(self) -> str:
        return f"PlanRows({list(self)!r})"


__all__ = ["Chunk", "FlatRow", "Gathered", "Head", "PlanRows", "Tail", "distinct"]
