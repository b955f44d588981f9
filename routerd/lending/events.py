"""An owner's conversation with the master: queue events out, leases back.

:class:`EventReports` sends the queue events of a node's owned models to the master through the
node's transport, coalesced per model (at most one in flight and one queued behind it, the latest
trigger wins), and hands each answer to the owner (:meth:`Owner.receive_lease`).  While an answer
is awaited a request held for a faster helper stays held; once none is, the lane's admission is
re-run (:meth:`Owner.repump`).

:class:`HeldLease` is a lease as its holder keeps it: until an expiry on the holder's own clock
(the owner's lease book, and the master's).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import attrs
from twisted.internet import defer
from twisted.logger import Logger

from routerd.wire.lending import Lane, Lease, Trigger

log = Logger()

#: Reports one queue event to the master: the owner's lease, or None.
EventSender = Callable[[Lane, str, Trigger], Awaitable[Lease | None]]


@attrs.define
class HeldLease:
    lease: Lease
    expires_at: float


class _Sender(Protocol):
    async def event(self, lane: Lane, model_id: str, trigger: Trigger) -> Lease | None: ...


class Owner(Protocol):
    """What the events need of the owner (the lending service)."""

    @property
    def transport(self) -> _Sender: ...

    def worth_reporting(self, lane: Lane, model_id: str) -> bool: ...

    def receive_lease(self, lease: Lease | None, lane: Lane, model_id: str, trigger: str) -> None: ...

    def repump(self, lane: Lane) -> None: ...


class EventReports:
    """The coalesced queue events of every owned (lane, model) of one node (see the module doc)."""

    def __init__(self, owner: Owner) -> None:
        self.owner = owner
        self._events: dict[tuple[Lane, str], _Coalescer] = {}

    def fire(self, lane: Lane, model_id: str, trigger: Trigger) -> None:
        """Send (or queue behind the one in flight) an event the owner found worth reporting."""
        key = (lane, model_id)
        coalescer = self._events.get(key)
        if coalescer is None:
            coalescer = self._events[key] = _Coalescer(self.owner, lane, model_id)
        coalescer.fire(trigger)

    def awaited(self, lane: Lane, model_id: str) -> bool:
        """Whether a queue event of (lane, model) is on its way to the master (its answer lends)."""
        coalescer = self._events.get((lane, model_id))
        return coalescer is not None and coalescer.in_flight


class _Coalescer:
    """Per (lane, model): at most one decision in flight and one queued behind it (latest wins)."""

    def __init__(self, owner: Owner, lane: Lane, model_id: str) -> None:
        self.owner = owner
        self.lane = lane
        self.model_id = model_id
        self.in_flight = False
        self.queued: Trigger | None = None

    def fire(self, trigger: Trigger) -> None:
        if self.in_flight:
            self.queued = trigger
            return
        self._run(trigger)

    def _run(self, trigger: Trigger) -> None:
        sender = self.owner.transport.event
        self.in_flight = True

        def answered(lease: Lease | None) -> None:
            self.owner.receive_lease(lease, self.lane, self.model_id, trigger)

        def failed(failure: Any) -> None:
            log.warn("queue event for {model} not delivered: {reason}", model=self.model_id,
                     reason=failure.getErrorMessage())

        def next_one(_: object) -> None:
            self.in_flight = False
            follow, self.queued = self.queued, None
            if follow is not None and self.owner.worth_reporting(self.lane, self.model_id):
                self._run(follow)
            else:
                # No answer is awaited any more: a request held for it (hold condition 4) is
                # judged again now, whether or not the answer came.
                self.owner.repump(self.lane)

        d = defer.ensureDeferred(_call(sender, self.lane, self.model_id, trigger))
        d.addCallbacks(answered, failed).addBoth(next_one)


async def _call(sender: EventSender, lane: Lane, model_id: str, trigger: Trigger) -> Lease | None:
    return await sender(lane, model_id, trigger)


__all__ = ["EventReports", "EventSender", "HeldLease", "Owner"]
