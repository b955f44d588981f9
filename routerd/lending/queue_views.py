"""What a lane queue shows of itself: its entries, native work per model and the held requests' listing.

:class:`QueueViews` is the queue's read-only side (:mod:`routerd.lending.queue` changes the
entries); :func:`lane_stats` is the ``queue`` of a lane in the node's runtime status (what the
master plans with); :func:`held_listing` is the Nodes page's list of requests waiting or lent out.
All read the queue's entry lists and change nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from routerd.lending.priority import CLASSES
from routerd.lending.queue_entries import Entry
from routerd.wire.lending import HeldRequest, Lane, QueueStat


class QueueViews:
    """What a lane queue (:class:`~routerd.lending.queue.LaneQueue`) shows of its entries: read only."""

    lane: Lane
    _pending: list[Entry]  # waiting, in the line's order
    _admitted: dict[str, Entry]  # by request id, in admission order
    _lent: list[Entry]
    _by_id: dict[str, Entry]

    def entry(self, request_id: str) -> Entry | None:
        return self._by_id.get(request_id)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._by_id

    def __len__(self) -> int:
        return len(self._by_id)

    def pending(self) -> list[Entry]:
        """Waiting entries in admission order."""
        return list(self._pending)

    def admitted(self) -> list[Entry]:
        return list(self._admitted.values())

    def lent(self, model_id: str | None = None) -> list[Entry]:
        """Lent entries in lending order."""
        return [e for e in self._lent if model_id is None or e.model_id == model_id]

    def lent_count(self, model_id: str) -> int:
        return sum(1 for e in self._lent if e.model_id == model_id)

    def waiting_native(self, model_id: str) -> int:
        """Native entries of ``model_id`` waiting (``stats``' ``pending_count`` of one model, without
        summing every model's work: read on every arrival)."""
        if not self._pending:
            return 0
        return sum(1 for e in self._pending if e.model_id == model_id and not e.borrowed)

    def has_work(self, model_id: str) -> bool:
        """Native work waiting or lent out: whether queue events of this model are worth sending."""
        return any(e.model_id == model_id and not e.borrowed for e in self._pending) or any(
            e.model_id == model_id for e in self._lent
        )

    def stats(self, model_ids: Iterable[str] | None = None) -> list[QueueStat]:
        """Native work per model (borrowed and lent entries excluded), sorted by model id.

        Without ``model_ids`` every model with native work waiting or admitted is listed.
        """
        return lane_stats(self.lane, self._pending, self._admitted.values(), model_ids)

    def held_listing(self, now_ms: int) -> list[HeldRequest]:
        """The Nodes page listing: waiting native entries (``queued``/``held``) and lent ones."""
        return held_listing(self.lane, self._pending, self._lent, now_ms)


def lane_stats(lane: Lane, waiting: Sequence[Entry], admitted_entries: Iterable[Entry],
               model_ids: Iterable[str] | None = None) -> list[QueueStat]:
    """Native work per model (borrowed and lent entries excluded), sorted by model id.

    Without ``model_ids`` every model with native work waiting or admitted is listed.
    """
    wanted = None if model_ids is None else set(model_ids)
    width = 2 if lane == "text" else 1
    acc: dict[str, list[Entry]] = {}
    admitted: dict[str, list[Entry]] = {}
    for e in waiting:
        if not e.borrowed:
            acc.setdefault(e.model_id, []).append(e)
    for e in admitted_entries:
        if not e.borrowed:
            admitted.setdefault(e.model_id, []).append(e)
    models = set(acc) | set(admitted) if wanted is None else wanted
    out: list[QueueStat] = []
    for model_id in sorted(models):
        pending = acc.get(model_id, [])
        backlog = pending + admitted.get(model_id, [])
        out.append(
            QueueStat(
                model_id=model_id,
                pending_count=len(pending),
                pending_work=_sum_work(pending, width),
                pending_context=sum(e.context for e in pending),
                backlog_count=len(backlog),
                backlog_work=_sum_work(backlog, width),
            )
        )
    return out


def held_listing(lane: Lane, waiting: Sequence[Entry], lent: Sequence[Entry],
                 now_ms: int) -> list[HeldRequest]:
    """The Nodes page listing: waiting native entries (``queued``/``held``) and lent ones."""
    out = [
        HeldRequest(
            request_id=e.request_id,
            lane=lane,
            model_id=e.model_id,
            state="held" if e.holding else "queued",
            waiting_ms=max(now_ms - e.arrived_ms, 0),
            priority=CLASSES[e.priority],
            key_name=e.key_name or None,
        )
        for e in waiting
        if not e.borrowed
    ]
    out.extend(
        HeldRequest(
            request_id=e.request_id,
            lane=lane,
            model_id=e.model_id,
            state="lent",
            waiting_ms=max(now_ms - e.arrived_ms, 0),
            helper_node_id=e.helper_node_id,
            helper_model_id=e.helper_model_id,
            priority=CLASSES[e.priority],
            key_name=e.key_name or None,
        )
        for e in lent
    )
    return out


def _sum_work(entries: Sequence[Entry], width: int) -> tuple[float, ...]:
    total = [0.0] * width
    for e in entries:
        for i, w in enumerate(e.work[:width]):
            total[i] += w
    return tuple(total)


__all__ = ["QueueViews", "held_listing", "lane_stats"]
