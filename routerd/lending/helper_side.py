"""A node as helper: the borrowed work it holds, and its own work taking the runtime back.

Borrowed requests are queued in the node's lane queues like any other; this records whose they
are (``GET /router/v1/node/offload/borrowed``, the master's stall check).  The node's own work
comes first (spec "A helper's own work"): own work about to claim a runtime (a request for a model
linked nowhere, a request on another lane of a shared process, an explicit load) hands back every
borrowed request there that has not claimed the runtime yet, and an own request that still waits
behind borrowed jobs has its wait written once it claims the runtime.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from twisted.internet.interfaces import IReactorTime

from routerd.catalog.model import ModelConfig, RuntimeKind
from routerd.lending.offload import Borrowed
from routerd.lending.queue import Effects, LaneQueue
from routerd.lending.service_rows import ServiceRows
from routerd.routing.call import Call
from routerd.wire.lending import LANES, Lane

#: The lending lanes sharing the runtime a ``(runtime kind, model)`` takes (``Runtimes.lanes_sharing``).
SharedLanes = Callable[[RuntimeKind | None, ModelConfig], Iterable[Lane]]


def own_lane(kind: RuntimeKind | None, _model: ModelConfig) -> tuple[Lane, ...]:
    """The :data:`SharedLanes` of a node whose runtimes each serve one lane (no KoboldCpp)."""
    return tuple(lane for lane in LANES if kind in (None, lane))


class _Service(Protocol):
    """What the helper side reads of its node's lending service (live: tests replace the hooks)."""

    @property
    def clock(self) -> IReactorTime | None: ...

    @property
    def queues(self) -> Mapping[Lane, LaneQueue]: ...

    @property
    def rows(self) -> ServiceRows: ...

    @property
    def shared_lanes(self) -> SharedLanes:
        """The lanes whose work runs in the runtime a request or a load takes."""

    @property
    def waiting_for_runtime(self) -> Callable[[str], bool]:
        """Whether an admitted request still waits for its runtime (a free one, or a load)."""

    def apply(self, lane: Lane, effects: Effects) -> None:
        """Perform a lane queue's effects."""


class HelperSide:
    """The helper's part of one node's lending service (see the module doc)."""

    def __init__(self, service: _Service) -> None:
        self.service = service
        self.queues = service.queues
        self.borrowed: dict[str, tuple[Lane, Borrowed, int]] = {}  # request id → owner, start ms
        # own requests not queued here that wait behind borrowed work: id → (lane, ahead, since ms)
        self._own_waiting: dict[str, tuple[Lane, int, int]] = {}

    def borrowed_requests(self) -> list[dict[str, Any]]:
        """Borrowed work on this node, queued or running."""
        out = []
        for rid, (lane, info, started) in self.borrowed.items():
            entry = self.queues[lane].entry(rid)
            state = "running" if entry is not None and entry.state == "admitted" else "queued"
            out.append({"request_id": rid, "lane": lane, "owner_node_id": info.owner_node_id,
                        "owner_model_id": info.owner_model_id, "started_ms": started, "state": state})
        return out

    def reclaimable(self, queue: LaneQueue) -> list[str]:
        """Admitted borrowed requests of ``queue`` that have not claimed the runtime yet."""
        if not queue.borrowed_in_backend():
            return []
        return [e.request_id for e in queue.admitted()
                if e.borrowed and self.service.waiting_for_runtime(e.request_id)]

    def own_work_arrived(self, lanes: Iterable[Lane]) -> tuple[Lane | None, int]:
        """Own work not queued in ``lanes`` is about to claim their runtime: every borrowed request
        there that has not claimed the runtime goes back (409 ``offload_returned``, row
        ``borrowed_returned``/``own_work_arrived``).  Answers the first lane with borrowed jobs
        still in the backend and how many there are in all (what the own work now waits behind)."""
        first: Lane | None = None
        ahead = 0
        for lane in lanes:
            queue = self.queues[lane]
            effects = queue.own_work_elsewhere(self._now_ms(), self.reclaimable(queue))
            self.service.apply(lane, effects)
            here = queue.borrowed_in_backend()
            if here and first is None:
                first = lane
            ahead += here
        return first, ahead

    def own_acquiring(self, call: Call, model: ModelConfig) -> None:
        """An own request not queued in the router (its model is linked nowhere in its lane) is
        about to acquire its runtime: borrowed work there that has not started goes back, and if
        borrowed jobs are still ahead of it, its wait is logged once it claims the runtime
        (:meth:`own_claimed`)."""
        # Borrowed, or queued here (in its route's lane, as every own request of a lane is, looked
        # at first; or in another lane a caller queued it in): the lane queue did this at its arrival.
        rid, lane = call.request_id, call.route.lane
        if call.borrowed or (lane is not None and rid in self.queues[lane]):
            return
        if any(rid in queue for queue in self.queues.values()):
            return
        lane, ahead = self.own_work_arrived(self.service.shared_lanes(call.route.runtime, model))
        if lane is not None:
            self._own_waiting[rid] = (lane, ahead, self._now_ms())

    def own_claimed(self, call: Call, claimed: bool) -> None:
        """The request of :meth:`own_acquiring` holds the runtime (``claimed``) or gave up waiting."""
        waited = self._own_waiting.pop(call.request_id, None)
        if waited is not None and claimed:
            lane, ahead, since = waited
            self.service.rows.waited(lane, call.request_id, ahead, self._now_ms() - since)

    def _now_ms(self) -> int:
        clock = self.service.clock
        return int((clock.seconds() if clock is not None else 0.0) * 1000)


__all__ = ["HelperSide", "SharedLanes"]
