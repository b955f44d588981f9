"""One node's backlog lending, wired to Twisted (architecture "Lending's loop").

``LendingService`` holds the node's link sets (pushed by the master, or stored on the master), the effective
lending settings, one ``LaneQueue`` per lane, the owner's leases and the node's fitted costs. The pure
decisions live in ``lending.queue``, ``lending.planner`` and ``lending.pricing``; this module performs their
effects on the owner's request path: it parks a request until the queue admits or lends it, runs or lends
it, and lends on the master's answers. Its other parts: the queue events sent to the master
(``lending.events``), the node as helper, holding borrowed work and handing it back when its own work
arrives (``lending.helper_side``), and the decision rows (``lending.service_rows``).

Custody never moves: a lent request keeps its client connection here, and whatever comes back (409
``offload_returned``, a failed relay) is re-queued at the head and served by this node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, cast

import attrs
from twisted.internet import defer
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from routerd.catalog.model import ModelConfig
from routerd.config.lending import LendingSettings
from routerd.errors import draining
from routerd.lanes import LANES, Lane
from routerd.lending.arrival import WorkHints, entry_image, images_for_new_owners, queue_own, refuse_when_full
from routerd.lending.decisions import DecisionLog
from routerd.lending.events import EventReports, HeldLease
from routerd.lending.helper_side import HelperSide, SharedLanes, own_lane
from routerd.lending.lend_trace import lent, queue_span
from routerd.lending.links import LinkSet
from routerd.lending.offload import Borrowed, Returned, offload_returned
from routerd.lending.queue import Effects, LaneQueue
from routerd.lending.service_rows import ServiceRows
from routerd.lending.transport import LendingTransport, NoMaster
from routerd.lending.waiting import RunLocal, WaitingRequest, no_local
from routerd.lending.watch import HoldGate, LaneAlarms, LentCall
from routerd.routing.call import Call
from routerd.routing.guardians import GuardianSet, sync_fingerprint
from routerd.wire.lending import Costs, LaneStatus, Lease, Trigger, lane_key, to_json

log = Logger()


@attrs.frozen
class Ticket:
    kind: Literal["admit", "lend", "returned", "refused"]
    lease: Lease | None = None
    reason: str = ""


class LendingService:
    def __init__(self, *, node_id: str, settings: LendingSettings, clock: IReactorTime | None = None,
                 role: str = "standalone", transport: LendingTransport | None = None,
                 decisions: DecisionLog | None = None, own_busy: Callable[[], bool] = lambda: False,
                 active_config: Callable[[Lane], str] = lambda _lane: "",
                 on_settings: Iterable[Callable[[LendingSettings], None]] = (),
                 waiting_for_runtime: Callable[[str], bool] = lambda _rid: False,
                 take_back: Callable[[str], bool] = lambda _rid: False, shared_lanes: SharedLanes = own_lane,
                 max_queued: int = 0, queued_in_backend: Mapping[str, int] | None = None,
                 key_weights: Mapping[str, float] | None = None,
                 aging: float = 30.0, run_local: RunLocal | None = None) -> None:
        self.node_id = node_id
        #: What an admitted request runs: this node serving it locally (one shared callable).
        self.run_local: RunLocal = run_local if run_local is not None else no_local
        self.role = role
        self.clock = clock
        self.transport: LendingTransport = transport if transport is not None else NoMaster()
        self.decisions = decisions
        self.own_busy = own_busy
        self.active_config = active_config
        self.on_settings = tuple(on_settings)
        # Borrowed work admitted to the backend but not yet holding the runtime (waiting for a free
        # runtime or a load) can still be taken back: ``waiting_for_runtime`` says whether it is,
        # ``take_back`` stops its wait (the run then fails with 409 ``offload_returned``).
        self.waiting_for_runtime = waiting_for_runtime
        self.take_back = take_back
        # The lanes whose work runs in the runtime a request or a load of this node takes (its own
        # lane; every lane with KoboldCpp's one process): its own work takes borrowed work back there.
        self.shared_lanes = shared_lanes
        self.max_queued = max_queued  # ``limits.max_queued_per_model`` (0: unbounded), set by a reload
        # own requests of a model (by local ID) admitted to its backend that still wait for the slot
        # (a load), a live count: they count against the same limit as the ones held here
        self.queued_in_backend: Mapping[str, int] = queued_in_backend if queued_in_backend is not None else {}
        self.key_weights: Mapping[str, float] = key_weights or {}  # limits.weight (fair share) by key name
        self.config_settings = self.settings = settings
        self.links: dict[Lane, LinkSet] = {lane: LinkSet.build(lane, ()) for lane in LANES}
        self.guardians = GuardianSet()  # guardian models (stored on the master, pushed with the links)
        # Hold for a faster helper and the lent cut-off: lending.hold / lending.cutoff, wired in watch.
        self.holds = HoldGate(node_id=node_id, clock=clock,
                              enabled=lambda: self.settings.offload_hold_for_faster_helper,
                              lease=self._lease_until, queue=lambda lane: self.queues[lane],
                              repump=self.repump, decisions=decisions, refilling=self._answer_awaited)
        self.rechecks = LaneAlarms(clock, self.repump)  # when the second-place class rule lapses
        self.lent_calls = LentCall(clock)
        self.queues: dict[Lane, LaneQueue] = {
            lane: LaneQueue(lane, settings.scheduling_backend_depth, hold=self.holds.check(lane),
                            aging_ms=int(aging * 1000))
            for lane in LANES}
        self._lanes = tuple(self.queues.values())
        self.work = WorkHints()  # what a request is priced by, with the costs' token profiles
        for lane in LANES:
            self.queues[lane].predict_ms = self.work.predictor(lane)
        self.leases: dict[tuple[Lane, str], HeldLease] = {}
        self.costs = Costs()
        self._waiters: dict[str, WaitingRequest[Ticket]] = {}
        self.events = EventReports(self)  # queue events to the master, coalesced per model
        self.rows = ServiceRows(node_id, self.queues, self)
        self.helper = HelperSide(self)  # this node as helper: its borrowed work, its own work first
        self._in_backend: dict[str, str] = {}  # admitted run under way → "", or why it was taken back
        self.draining = False  # the node drains: nothing waits in a router queue any more (drain)

    # -- configuration (site APIs and the master's pushes) ------------------------------------

    def install_links(self, image: LinkSet, text: LinkSet) -> None:
        """Replace both lanes' links; effective for the next request."""
        self.links = {"image": image, "text": text}
        for lane in LANES:
            link_set = self.links[lane]
            self.queues[lane].set_enrolled(link_set.enrolled(self.node_id),
                                           link_set.owned_models(self.node_id))
            images_for_new_owners(self.queues[lane], {rid: w.call for rid, w in self._waiters.items()})

    def set_limits(self, max_queued: int, aging: float, key_weights: Mapping[str, float]) -> None:
        """A reload's ``limits.max_queued_per_model``, ``queue.aging`` (s) and keys' weights, from now."""
        self.max_queued, self.key_weights = max_queued, key_weights
        for queue in self._lanes:
            queue.set_aging(int(aging * 1000))

    def install_guardians(self, guardians: GuardianSet) -> None:
        self.guardians = guardians  # effective for the next request

    def sync_fingerprint(self) -> str:
        """The fingerprint this node reports (runtime status, lending summary): the settings' own,
        folded with the guardians when any is set, so "in sync" covers both."""
        return sync_fingerprint(self.settings.fingerprint(), self.guardians)

    def apply_settings(self, settings: LendingSettings) -> None:
        """Run with these effective settings from now on (no restart).  Admission is re-run only when
        they changed: the master pushes the same settings at every registration, and a re-run judged a
        held request at whatever instant the push came (between a lent answer and the next lease)."""
        changed, self.settings = settings != self.settings, settings
        for lane in LANES if changed else ():
            self.apply(lane, self.queues[lane].set_depth(settings.scheduling_backend_depth, self._now_ms()))
        for hook in self.on_settings:
            hook(settings)

    async def push(self) -> None:
        """Push links and settings to every slave (the master's transport; a no-op elsewhere)."""
        await self.transport.push()

    async def refresh(self) -> None:
        """Links or settings changed: push them and plan at once (a no-op off a master)."""
        await self.transport.refresh()

    def drain(self) -> None:
        """The node drains: what waits in a router queue is answered at once (borrowed work goes back
        with 409, own work gets 503 ``draining`` with Retry-After); admitted and lent requests go on."""
        self.draining = True
        for lane in LANES:
            self.apply(lane, self.queues[lane].drain())

    def update_costs(self, costs: Costs) -> None:
        """This node's freshly fitted cost coefficients (published in its runtime status)."""
        self.costs = costs
        self.work.update(costs)

    # -- queries -------------------------------------------------------------------------------

    def enrolled(self, lane: Lane | None, model_id: str) -> bool:
        return lane is not None and self.queues[lane].is_enrolled(model_id)

    def node_busy(self) -> bool:
        """This node has own work: a request in a backend or a load of its own (``own_busy``), or an
        own request waiting in any lane's router queue.  Borrowed work is refused until it has none
        (spec "A helper's own work": "until its own queue is empty")."""
        return self.own_busy() or not all(q.accepting_borrowed() for q in self.queues.values())

    def lane_statuses(self) -> dict[Lane, LaneStatus]:
        """Each lane's queue and whether it takes borrowed work (the runtime status's ``lanes``)."""
        busy = self.node_busy()
        return {lane: LaneStatus(accepting_borrowed=not busy,
                                 active_config=self.active_config(lane) or "",
                                 queue=tuple(self.queues[lane].stats()))
                for lane in LANES}

    def held_requests(self) -> list[dict[str, Any]]:
        return [to_json(h) for lane in LANES for h in self.queues[lane].held_listing(self._now_ms())]

    def live_lease_lanes(self) -> list[Lane]:
        """The lane of each live lease this owner holds (for the metrics)."""
        return [lane for (lane, model_id) in self.leases if self.live_lease(lane, model_id) is not None]

    def live_lease(self, lane: Lane, model_id: str) -> Lease | None:
        held = self.leases.get((lane, model_id))
        return None if held is None or held.expires_at <= self._now() else held.lease

    # -- the request path ----------------------------------------------------------------------

    def serve(self, call: Call, model: ModelConfig, lane: Lane, borrowed: Borrowed | None, *,
              public_id: str) -> Deferred[bytes]:
        """Queue an enrolled model's request in the router and serve, lend or hand it back; the
        Deferred fires with the answer (cancel it when the client goes: its place is freed).

        While it waits the request is a :class:`~routerd.lending.waiting.WaitingRequest` woken by
        the queue's tickets, not a suspended coroutine (held requests stay small); admitted, it
        runs as ``self.run_local(call, model, public_id)``."""
        if self.draining:  # arrived as the drain began: it would never run here
            return defer.fail(draining() if borrowed is None else offload_returned("the helper is draining"))
        model_id = lane_key(lane, model)
        queue = self.queues[lane]
        owner = borrowed is None and queue.is_owner(model_id)
        if borrowed is None and not owner:
            for other in self._lanes:
                if not other.idle():
                    break
            else:  # every lane is idle
                return self._arrive_direct(call, model, queue, lane, model_id, public_id)
        held: WaitingRequest[Ticket] = WaitingRequest(self, call, model, lane, model_id, public_id,
                                                      self.run_local, owner)
        try:
            if borrowed is None:
                refuse_when_full(queue, model, model_id, public_id, self.max_queued, self.queued_in_backend)
            self._arrive(held, borrowed)
        except Exception:  # noqa: BLE001 - refused on arrival (429 queue_full...): the Deferred says so
            return defer.fail()
        if owner:
            self.report(lane, model_id, "enqueued")
        held.wait()
        return held.result

    def _arrive_direct(self, call: Call, model: ModelConfig, queue: LaneQueue, lane: Lane, model_id: str,
                       public_id: str) -> Deferred[bytes]:
        """:meth:`serve` of an own request of a model owning no link while no lane holds waiting or
        borrowed work: it hands nothing back (here or in a lane sharing its runtime) and is never held
        for a helper, so admitted on arrival it runs at once, with no :class:`WaitingRequest` parked
        and woken (one clock read).  Otherwise it waits as in :meth:`serve`."""
        now = self._now_ms()
        try:
            refuse_when_full(queue, model, model_id, public_id, self.max_queued, self.queued_in_backend)
            effects = queue_own(queue, call, model, model_id, now,
                                self.work.terms(call, lane, model_id, self.settings), self.key_weights)
        except Exception:  # noqa: BLE001 - refused on arrival (429 queue_full...): the Deferred says so
            return defer.fail()
        if effects.admit:  # itself: nothing else waited
            call.queue_position = 0
            return Deferred.fromCoroutine(self._run(call, model, lane, model_id, public_id, self.run_local,
                                                    False))
        held: WaitingRequest[Ticket] = WaitingRequest(self, call, model, lane, model_id, public_id,
                                                      self.run_local, False)
        self._waiters[call.request_id] = held
        call.queue_position = queue.position(call.request_id, now) + len(queue.admitted())
        held.wait()
        return held.result

    def run_ticket(self, held: WaitingRequest[Any], ticket: Ticket) -> Deferred[bytes | None]:
        """What a held request does once woken (``WaitingRequest``'s steward)."""
        queue_span(held.call, ticket.kind, ticket.reason)
        if ticket.kind in ("returned", "refused"):
            if ticket.kind == "returned":
                self.rows.helper("borrowed_returned", held.lane, held.call.request_id, ticket.reason)
            self._forget(held.call.request_id)
            return defer.fail(offload_returned() if ticket.kind == "returned" else draining())
        if ticket.kind == "admit":
            return cast("Deferred[bytes | None]", Deferred.fromCoroutine(self._run(
                held.call, held.model, held.lane, held.model_id, held.public_id, held.run_local, held.owner)))
        return Deferred.fromCoroutine(self._run_lent(held, ticket))

    def cancel_waiting(self, held: WaitingRequest[Any]) -> None:
        """A held request's client went away: its place in the queue is freed."""
        rid = held.call.request_id
        self.apply(held.lane, self.queues[held.lane].cancel(rid, self._now_ms()))
        self._forget(rid)

    def _forget(self, rid: str) -> None:
        self._waiters.pop(rid, None)
        self.helper.borrowed.pop(rid, None)

    async def _run(self, call: Call, model: ModelConfig, lane: Lane, model_id: str, public_id: str,
                   run_local: RunLocal, owner: bool) -> bytes:
        """Run an admitted request (a cancel reaches the run); :meth:`_admitted_ended` does the queue's side
        of its end however it ends (awaited: a callback on the run's Deferred costs ~95 opcodes, this ~30)."""
        rid = call.request_id
        self._in_backend[rid] = ""
        try:
            answer = await run_local(call, model, public_id)
        except Exception as exc:  # a run that fails at once ends like one that fails later
            self._admitted_ended(rid, lane, model_id, owner, cancelled=isinstance(exc, CancelledError))
            raise
        self._admitted_ended(rid, lane, model_id, owner, cancelled=False)
        return answer

    def _admitted_ended(self, rid: str, lane: Lane, model_id: str, owner: bool, *, cancelled: bool) -> None:
        """The queue's side of an admitted request's end (``cancelled``: by ``CancelledError``)."""
        queue = self.queues[lane]
        try:
            reason = self._in_backend.pop(rid, "")
            if reason:  # taken back before it claimed the runtime
                self.rows.helper("borrowed_returned", lane, rid, reason)
            elif rid in queue:  # (not when handed back after all, once it held the runtime)
                effects = queue.finished(rid, self._now_ms())
                if effects.admit or effects.returned:
                    self.apply(lane, effects)
                if owner:
                    self.report(lane, model_id, "completed")
            if cancelled:
                self.apply(lane, queue.cancel(rid, self._now_ms()))
        finally:
            self._forget(rid)

    async def _run_lent(self, held: WaitingRequest[Any], ticket: Ticket) -> bytes | None:
        """Lend ``held`` on the ticket's lease; None when it came back (it waits in the queue again)."""
        call, lane, model_id = held.call, held.lane, held.model_id
        rid = call.request_id
        queue = self.queues[lane]
        again = False
        try:
            assert ticket.lease is not None
            call.lent_to = f"{ticket.lease.helper_node_id}/{ticket.lease.helper_model_id}"
            try:
                result = await lent(self.lent_calls.lend, self.transport, call, ticket.lease, model_id)
            except Returned as exc:
                call.lent_to = ""  # back here: it is served (or lent again) like any other
                log.info("lent request {request_id} came back: {reason}", request_id=rid, reason=str(exc))
                self.rows.dispatch("returned", lane, model_id, ticket.lease, request_id=rid)
                again = True
                held.park_again()
                self._waiters[rid] = held
                effects = queue.returned(rid, self._now_ms())
                self.apply(lane, effects + queue.drain() if self.draining else effects)
                self.report(lane, model_id, "borrowed_completed")
                return None
            except CancelledError:
                raise
            except Exception:
                # The answer broke off after it started (it cannot be re-run): the
                # request is over, and its lease slot must not stay taken.
                self.apply(lane, queue.finished(rid, self._now_ms()))
                self.report(lane, model_id, "borrowed_completed")
                raise
            self.apply(lane, queue.finished(rid, self._now_ms()))
            self.report(lane, model_id, "borrowed_completed")
            return result
        except CancelledError:
            self.apply(lane, queue.cancel(rid, self._now_ms()))
            raise
        finally:
            if not again:
                self._forget(rid)

    def _arrive(self, held: WaitingRequest[Ticket], borrowed: Borrowed | None) -> None:
        """Park the request and queue it (a ticket the arrival brings is kept by ``held`` until it waits)."""
        call, model, model_id, lane = held.call, held.model, held.model_id, held.lane
        queue = self.queues[lane]
        rid, now = call.request_id, self._now_ms()
        self._waiters[rid] = held
        if borrowed is not None:
            work, context = self.work.terms(call, lane, model_id, self.settings)
            self.helper.borrowed[rid] = (lane, borrowed, now)
            effects = queue.arrive_borrowed(rid, model_id, now, node_busy=self.node_busy(),
                                            work=work, context=context)
        else:
            # another lane sharing this runtime (KoboldCpp) gives its borrowed work back too
            others = [other for other in self.shared_lanes(call.route.runtime, model) if other != lane]
            _, also_ahead = self.own_work_arrived(others)
            effects = queue_own(queue, call, model, model_id, now,
                                self.work.terms(call, lane, model_id, self.settings),
                                self.key_weights, reclaim=self.helper.reclaimable(queue),
                                also_ahead=also_ahead, image=entry_image(call, lane, held.owner))
        self.apply(lane, effects)
        if borrowed is None:
            # its place in the class order, counting what the backend already runs (the answer's
            # X-Routerd-Queue-Position); 0 when it was admitted at once
            place = queue.position(rid, now)
            call.queue_position = place + len(queue.admitted()) if place else 0

    # -- this node as helper (lending.helper_side) ---------------------------------------------

    def borrowed_requests(self) -> list[dict[str, Any]]:
        """Borrowed work on this node (``GET /router/v1/node/offload/borrowed``)."""
        return self.helper.borrowed_requests()

    def own_work_arrived(self, lanes: Iterable[Lane]) -> tuple[Lane | None, int]:
        """Own work not queued in ``lanes`` is about to claim their runtime (a request for a model
        linked nowhere, a request on another lane of a shared process, an explicit load):
        :meth:`HelperSide.own_work_arrived`."""
        return self.helper.own_work_arrived(lanes)

    def work_hint(self, call: Call, model: ModelConfig, lane: Lane) -> tuple[tuple[float, ...], int]:
        """The work terms (and, for text, the context) the queue and the planner price a request
        by: :func:`~routerd.lending.pricing.work_terms`, with this model's token profile."""
        return self.work.terms(call, lane, lane_key(lane, model), self.settings)

    def _wake(self, rid: str, ticket: Ticket) -> None:
        held = self._waiters.pop(rid, None)
        if held is not None:
            held.wake(ticket)

    def apply(self, lane: Lane, effects: Effects) -> None:
        """Perform a lane queue's effects: hand back, then wake what it admits."""
        # Hand back first: a borrowed request taken back from its wait for the runtime leaves the
        # runtime's queue before this node's own request joins it.
        for back in effects.returned:
            if back.request_id in self._in_backend:
                self._in_backend[back.request_id] = back.reason
                if not self.take_back(back.request_id) and back.request_id in self._in_backend:
                    # it claimed the runtime after all: it finishes, and it is no longer queued
                    self._in_backend[back.request_id] = ""
                continue
            self._wake(back.request_id, Ticket("returned", reason=back.reason))
        for rid in effects.refused:
            self._wake(rid, Ticket("refused"))
        for passed in effects.passed:  # the swap-avoiding order served the loaded model first
            self.rows.passed_over(lane, passed)
        if effects.recheck_ms is not None:  # the class rule lapses then: top the backend back up
            self.rechecks.arm(lane, effects.recheck_ms, self._now_ms())
        for rid in effects.admit:
            entry = self.queues[lane].entry(rid)
            if entry is not None and not entry.borrowed and entry.borrowed_ahead > 0:
                self.rows.waited(lane, rid, entry.borrowed_ahead, self._now_ms() - entry.arrived_ms)
            self._wake(rid, Ticket("admit"))

    # -- events and leases (owner) ---------------------------------------------------------------

    def report(self, lane: Lane, model_id: str, trigger: Trigger) -> None:
        """Tell the master about a queue event of an owned model (coalesced per model).

        Sent only while it matters (reference §3.3): the model owns a link in the lane *and* still
        has native work waiting in the router or requests lent out.  An event once nothing remains
        (the last own job ``completed``, the last lent one ``borrowed_completed``) has nothing to
        lend, so no plan is asked for; a follow-up queued behind an event in flight is checked
        again when its turn comes.
        """
        if self.worth_reporting(lane, model_id):
            self.events.fire(lane, model_id, trigger)

    def worth_reporting(self, lane: Lane, model_id: str) -> bool:
        """Whether a queue event of ``model_id`` would be sent now (see :meth:`report`)."""
        queue = self.queues[lane]
        return queue.is_owner(model_id) and queue.has_work(model_id)

    def receive_lease(self, lease: Lease | None, lane: Lane, model_id: str, trigger: str) -> None:
        """The master's answer (or a pushed grant): lend up to its slots, or clear the lease."""
        queue = self.queues[lane]
        if lease is None:
            if self.leases.pop((lane, model_id), None) is not None:
                self.rows.dispatch("lease_cleared", lane, model_id, None, trigger=trigger)
                self.apply(lane, queue.pump(self._now_ms()))
            return
        if lease.owner_node_id != self.node_id or not queue.is_owner(lease.owner_model_id):
            self.leases.pop((lane, lease.owner_model_id), None)
            self.rows.dispatch("lease_refused", lane, lease.owner_model_id, lease, reason="not_an_owner",
                               trigger=trigger)
            self.apply(lane, queue.pump(self._now_ms()))
            return
        # Timed on the owner's own clock, so clock skew cannot end it early.
        self.leases[(lane, model_id)] = HeldLease(lease, self._now() + lease.ttl_ms / 1000.0)
        self.rows.dispatch("lease_updated", lane, model_id, lease, trigger=trigger)
        self._lend(lane, model_id)

    def _lend(self, lane: Lane, model_id: str) -> None:
        lease = self.live_lease(lane, model_id)
        if lease is None:
            return
        queue = self.queues[lane]
        room = lease.slots() - queue.lent_count(model_id)
        # Per-request gates (reference §6/§7): a request too big for the helper's window, or one
        # with an image for a helper without vision, stays with the owner.
        for rid in queue.withdraw_for_lending(model_id, room, self._now_ms(), lease.helper_node_id,
                                              lease.helper_model_id,
                                              max_context=lease.helper_context or None,
                                              vision=lease.helper_multimodal):
            entry = queue.entry(rid)
            wait = self._now_ms() - entry.arrived_ms if entry is not None else 0
            self.rows.dispatch("lent", lane, model_id, lease, request_id=rid, wait_ms=wait)
            self._wake(rid, Ticket("lend", lease))
        self.repump(lane)  # the new head is judged against the new lease (hold or admit)

    def _lease_until(self, lane: Lane, model_id: str) -> tuple[Lease, float] | None:
        """The stored lease of (lane, model) and its expiry in ms on this node's clock."""
        held = self.leases.get((lane, model_id))
        return None if held is None else (held.lease, held.expires_at * 1000.0)

    def _answer_awaited(self, lane: Lane, model_id: str) -> bool:
        """Whether a queue event of (lane, model) is on its way to the master (its answer lends)."""
        return self.events.awaited(lane, model_id)

    def repump(self, lane: Lane) -> None:
        """Re-run admission of ``lane`` and perform what it admits (a hold may have lapsed)."""
        self.apply(lane, self.queues[lane].pump(self._now_ms()))

    def _now(self) -> float:
        return self.clock.seconds() if self.clock is not None else 0.0

    def _now_ms(self) -> int:
        return int(self.clock.seconds() * 1000) if self.clock is not None else 0
