"""The router queue of one lane on one node (spec "What is lent", reference §3.1, §7).

A pure object: the caller feeds it arrivals, completions, returns and cancellations with a clock
value, and performs the :class:`~routerd.lending.queue_entries.Effects` it answers (start the
admitted requests, hand borrowed requests back with 409).  No Twisted, no timers.  Its entries and
answers are :mod:`routerd.lending.queue_entries`'s (re-exported here); what it shows of itself
(stats, the held listing) is :mod:`routerd.lending.queue_views`'s; its waiting entries and the
orders they are admitted and lent in are :mod:`routerd.lending.waiting_line`'s (over
:mod:`routerd.lending.priority`), the swap-avoiding order :mod:`routerd.lending.swap_batch`'s;
what is here is admission, lending and endings.

Entries are *native* (this node's own clients) or *borrowed* (lent to this node by another owner).
Every native request of the lane is queued here, whatever its model (one class order for the
node's whole router queue); only enrolled models (an owner or a helper in some link of the lane)
take borrowed work, and only owners' entries are lent.

* At most ``depth`` entries of the lane are admitted to the backend at once; the rest wait here.
  The depth counts the lane, not each model: the lane's runtime serves one model at a time, and a
  helper's own request must wait behind the borrowed jobs already admitted.  A native request of a
  model that serves ``concurrency`` > 1 requests at once (``parallel``, vLLM's
  ``max_number_sequences``: linked nowhere, since lending takes only one-at-a-time models) is
  admitted while fewer than ``depth + concurrency - 1`` are: its backend runs as many as before the
  router queue took it, with ``depth - 1`` waiting behind them.
* Only waiting native entries of an *owner* model that are not streaming and have not come back from
  a helper can be withdrawn for lending.  A lent entry stays here in state ``lent``
  until it finishes or comes back; a returned entry goes back to the head of the queue keeping its
  first arrival time and is never lent again.
* A native arrival hands back every waiting borrowed entry, and every admitted one the caller says has
  not claimed the runtime yet; so does the node's own work that is not queued in this lane but takes
  its runtime (``own_work_elsewhere``: the other lane of a shared process, an explicit load).
  A borrowed arrival is handed back at once while the lane holds any native work
  (or the caller says the node is busy with its own work).
* To a place where it would wait inside the backend (behind work of another model, or beyond its
  model's concurrency), the head is admitted only if no higher class than its own had a native
  arrival within the last aging period (:mod:`routerd.lending.class_rule`).  A place where it
  would start at once is always taken.
* An optional hold check may keep the head waiting for a faster helper, only for the second slot:
  when something of the same model, and nothing else, is already admitted.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from routerd.lending.class_rule import PredictMs, outranked_until, place_opens_ms
from routerd.lending.priority import CLASSES, DEFAULT_AGING_MS
from routerd.lending.queue_entries import (
    NO_EFFECTS,
    BorrowedReturn,
    Effects,
    Entry,
    HoldCheck,
    HoldQuery,
    QueueError,
    fits_helper,
)
from routerd.lending.queue_views import QueueViews
from routerd.lending.waiting_line import WaitingLine
from routerd.wire.lending import Lane

_LOWEST = len(CLASSES) - 1  # the lowest class's rank


class LaneQueue(QueueViews):
    """The router queue of one lane on one node (its views: :class:`QueueViews`)."""

    def __init__(self, lane: Lane, depth: int, enrolled: Collection[str] = (), owners: Collection[str] = (),
                 hold: HoldCheck | None = None, aging_ms: int = DEFAULT_AGING_MS) -> None:
        self.lane: Lane = lane
        self._line = WaitingLine(aging_ms)
        self.order = self._line.order
        self.set_aging(aging_ms)  # clamped as a reload's is
        self._depth = max(int(depth), 1)
        self._enrolled: frozenset[str] = frozenset()
        self._owners: frozenset[str] = frozenset()
        self.set_enrolled(enrolled, owners)
        self.hold = hold
        self.predict_ms: PredictMs | None = None  # a job's predicted time (the node's fits): its service's
        self.swap = self._line.swap  # the swap-avoiding order (scheduling.swap_batch; off until configured)
        self._pending = self._line.entries  # the waiting entries (changed through the line only)
        # the admitted entries by request id, in admission order (one found in O(1) when it ends)
        self._admitted: dict[str, Entry] = {}
        self._admitted_of: dict[str, int] = {}  # admitted entries per model (kept with _admitted)
        self._borrowed_live = 0  # borrowed entries queued or admitted (0: nothing to hand back)
        self._lent: list[Entry] = []
        self._by_id: dict[str, Entry] = {}
        self._last_own_completion: dict[str, int] = {}
        # when a native request of each class rank last arrived (the second slot's class rule)
        self._class_seen: dict[int, int] = {}
        # the highest concurrency of any native arrival: a bound on the lane's cap (pump's fast exit)
        self._widest = 1

    # -- configuration ------------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        return self._depth

    def set_depth(self, depth: int, now_ms: int) -> Effects:
        """Apply a new ``scheduling_backend_depth`` at once (a lower depth recalls nothing)."""
        self._depth = max(int(depth), 1)
        return self.pump(now_ms)

    def set_aging(self, aging_ms: int) -> None:
        """Apply a new ``queue.aging`` (from the next pick on)."""
        self.order.aging_ms = max(int(aging_ms), 0)

    def set_enrolled(self, enrolled: Collection[str], owners: Collection[str] = ()) -> None:
        """Replace the enrolled models (owners ∪ helpers) and the owners among them.

        Entries already queued stay until they finish; only new arrivals are checked.
        """
        self._owners = frozenset(owners)
        self._enrolled = frozenset(enrolled) | self._owners

    def is_enrolled(self, model_id: str) -> bool:
        return model_id in self._enrolled

    def is_owner(self, model_id: str) -> bool:
        return model_id in self._owners

    # -- arrivals -----------------------------------------------------------------------------------

    def _new_entry(
        self,
        request_id: str,
        model_id: str,
        now_ms: int,
        work: Sequence[float],
        context: int,
        streaming: bool,
        borrowed: bool,
        priority: int = 1,
        key_name: str = "",
        weight: float = 1.0,
    ) -> Entry:
        if request_id in self._by_id:
            raise QueueError(f"request {request_id} is already queued")
        if borrowed and model_id not in self._enrolled:
            raise QueueError(f"model {model_id} is not enrolled in the {self.lane} lane")
        entry = Entry(
            request_id=request_id,
            model_id=model_id,
            arrived_ms=now_ms,
            work=tuple(map(float, work)),
            context=max(int(context), 0),
            streaming=streaming,
            borrowed=borrowed,
            priority=min(max(int(priority), 0), _LOWEST),
            key_name=key_name,
            weight=float(weight) if weight > 0 else 1.0,
        )
        self._by_id[request_id] = entry
        if borrowed:
            self._borrowed_live += 1
        return entry

    def arrive(
        self,
        request_id: str,
        model_id: str,
        now_ms: int,
        *,
        work: Sequence[float] = (),
        context: int = 0,
        streaming: bool = False,
        reclaim: Collection[str] = (),
        image: bool = False,
        also_ahead: int = 0,
        priority: int = 1,
        key_name: str = "",
        weight: float = 1.0,
        concurrency: int = 1,
    ) -> Effects:
        """A native request (for any model of the lane, linked or not): queue it, hand back every
        waiting borrowed entry, and admit what fits.

        ``reclaim`` names admitted borrowed entries that have not claimed the runtime yet (they
        still wait for a free runtime or for the helper model to load): those are handed back too,
        and their place is free for this node's own work.  One that holds the runtime finishes.
        ``also_ahead`` counts borrowed jobs of another lane sharing this lane's runtime (KoboldCpp's
        one process) that the request also waits behind.  ``priority`` (class rank), ``key_name``
        and ``weight`` place it in the serving order (:mod:`routerd.lending.priority`).
        ``concurrency`` is how many requests its model's backend serves at once (the lane admits
        up to ``depth + concurrency - 1`` of them).
        """
        entry = self._new_entry(request_id, model_id, now_ms, work, context, streaming, False,
                                priority, key_name, weight)
        entry.image = image
        entry.concurrency = max(int(concurrency), 1)
        if entry.concurrency > self._widest:
            self._widest = entry.concurrency
        self._class_seen[entry.priority] = now_ms
        if self.idle():
            # nothing borrowed to hand back, and the new entry is all admission can pick
            entry.borrowed_ahead = max(int(also_ahead), 0)
            return self._arrive_alone(entry, now_ms)
        returned = self._hand_back(reclaim)
        entry.borrowed_ahead = self.borrowed_in_backend() + max(int(also_ahead), 0)
        self._line.add(entry)
        return Effects(returned=returned) + self.pump(now_ms)

    def _arrive_alone(self, entry: Entry, now_ms: int) -> Effects:
        """Queue ``entry`` into an empty line and answer what :meth:`pump` would: admission's pick
        is ``entry`` (nothing else waits), so when it fits and no hold check can keep it, it is
        admitted without passing through the line; otherwise it is lined up and pumped."""
        if not self._fits(entry, now_ms):
            self._line.add(entry)  # pump would stop at it at once: it waits, not holding
            return self._recheck(entry, now_ms)
        if self._may_hold(entry):
            self._line.add(entry)  # the hold check reads the line: the general path asks it
            return self.pump(now_ms)
        self.order.charge(entry)  # as the line's admit charges it (added and taken out, its mix is as it was)
        self._take_in(entry, now_ms)
        return Effects(admit=(entry.request_id,))

    def idle(self) -> bool:
        """No entry waits and none is borrowed: an own arrival hands nothing back, and is admitted
        at once unless the backend is full (the lending service's direct path)."""
        return not self._pending and not self._borrowed_live

    def own_work_elsewhere(self, now_ms: int, reclaim: Collection[str] = ()) -> Effects:
        """This node's own work that is not queued in this lane claims the runtime this lane runs
        on (a request on another lane of a shared process, an explicit load): hand back every
        waiting borrowed entry and the admitted ones in ``reclaim`` (not holding the runtime yet)."""
        returned = self._hand_back(reclaim)
        return Effects(returned=returned) + self.pump(now_ms)

    def borrowed_in_backend(self) -> int:
        """Borrowed entries admitted to the backend (what the node's own work now waits behind)."""
        if not self._borrowed_live:
            return 0
        return sum(1 for e in self._admitted.values() if e.borrowed)

    def _hand_back(self, reclaim: Collection[str]) -> tuple[BorrowedReturn, ...]:
        """Drop every waiting borrowed entry and the admitted ones named in ``reclaim``; answer the
        returns (reason ``own_work_arrived``) in that order: reclaimed first, then waiting."""
        if not self._borrowed_live:
            return ()
        taken = [e for e in self._admitted.values() if e.borrowed and e.request_id in reclaim]
        handed_back = taken + [e for e in self._pending if e.borrowed]
        for e in handed_back:
            self._forget(e)
        return tuple(BorrowedReturn(e.request_id, "own_work_arrived") for e in handed_back)

    def arrive_borrowed(
        self,
        request_id: str,
        model_id: str,
        now_ms: int,
        *,
        node_busy: bool = False,
        work: Sequence[float] = (),
        context: int = 0,
        priority: int = 1,
    ) -> Effects:
        """A borrowed request: handed straight back while this node has own work (``node_busy`` or
        native work in this lane), else queued behind everything like any entry."""
        if node_busy or not self.accepting_borrowed():
            if request_id in self._by_id:
                raise QueueError(f"request {request_id} is already queued")
            return Effects(returned=(BorrowedReturn(request_id, "helper_busy_on_arrival"),))
        if model_id not in self._enrolled:
            return Effects(returned=(BorrowedReturn(request_id, "helper_busy_on_arrival"),))
        entry = self._new_entry(request_id, model_id, now_ms, work, context, False, True, priority)
        self._line.add(entry)
        return self.pump(now_ms)

    def accepting_borrowed(self) -> bool:
        """No native work waiting or admitted in this lane (the node-wide idle test is the caller's)."""
        return all(e.borrowed for e in self._pending) and all(e.borrowed for e in self._admitted.values())

    # -- admission ----------------------------------------------------------------------------------

    def pump(self, now_ms: int) -> Effects:
        """Admit waiting entries while the backend has room (re-run after a lease or setting change,
        or when a hold may have lapsed)."""
        admitted: list[str] = []
        for e in self._pending:
            e.holding = False
        while self._pending and len(self._admitted) < self._depth + self._widest - 1:
            index = self._line.next_index(now_ms, self._admitted)
            head = self._pending[index]
            if not self._fits(head, now_ms):
                return self._admitting(admitted) + self._recheck(head, now_ms)
            if self._holds(head, now_ms):
                head.holding = True
                break
            self._line.admit(index)
            self._take_in(head, now_ms)
            admitted.append(head.request_id)
        return self._admitting(admitted)

    def _admitting(self, admitted: list[str]) -> Effects:
        """Start ``admitted``; the swap-avoiding order's passes among them go to the decision log."""
        return Effects(admit=tuple(admitted), passed=self.swap.take_passes()) if admitted else NO_EFFECTS

    def _fits(self, head: Entry, now_ms: int) -> bool:
        """Whether the backend has a place ``head`` may take now (a hold aside): within its cap,
        and, where it would wait in the backend, not outranked by a higher class about.

        The cap: how many of the lane's entries may be in the backend for ``head`` to join them,
        the depth, plus its model's parallel places beyond the first for a native entry.  It starts
        at once when everything in the backend is of its model and a place of the model's
        concurrency is free (with concurrency 1: nothing is in)."""
        admitted = len(self._admitted)
        if admitted >= (self._depth if head.borrowed else self._depth + head.concurrency - 1):
            return False
        if admitted < head.concurrency and self._admitted_of.get(head.model_id, 0) == admitted:
            return True  # it starts at once
        # it would wait in the backend: keep that place for the higher class about
        return self._outranked_until(head, now_ms) is None

    def _take_in(self, head: Entry, now_ms: int) -> None:
        """``head``, out of the line, is admitted to the backend now."""
        if self.swap.limit:
            self.swap.admitted(head, self.swap.current(self._admitted))
        head.state = "admitted"
        head.admitted_ms = now_ms
        self._admitted[head.request_id] = head
        self._admitted_of[head.model_id] = self._admitted_of.get(head.model_id, 0) + 1

    def _outranked_until(self, head: Entry, now_ms: int) -> int | None:  # the second-place class rule
        opens = place_opens_ms(self._admitted.values(), head, self.predict_ms,
                               self._last_own_completion.get(head.model_id, 0))
        aging = self.order.aging_ms
        return outranked_until(self._class_seen, head.priority, head.arrived_ms, now_ms, aging, opens)

    def _recheck(self, head: Entry, now_ms: int) -> Effects:
        """No effect now; when only the class rule keeps ``head`` out, the time to pump again (the
        caller's timer: no arrival or completion may come to top the backend back up)."""
        if len(self._admitted) >= (self._depth if head.borrowed else self._depth + head.concurrency - 1):
            return NO_EFFECTS  # the backend is full: its next completion pumps
        until = self._outranked_until(head, now_ms)
        return NO_EFFECTS if until is None else Effects(recheck_ms=until)

    def _may_hold(self, head: Entry) -> bool:
        """Whether the hold check is asked about ``head`` (:meth:`_holds`): an owner's native
        request that could be lent, for the second slot (only its own model's work is admitted)."""
        if head.model_id not in self._owners:
            return False  # only an owner's request can be lent, so only it waits for a helper
        if self.hold is None or head.borrowed or head.streaming or head.returned:
            return False
        admitted = self._admitted.values()
        return bool(admitted) and not any(e.borrowed or e.model_id != head.model_id for e in admitted)

    def _holds(self, head: Entry, now_ms: int) -> bool:
        hold = self.hold
        if hold is None or not self._may_hold(head):
            return False
        since = min(e.admitted_ms if e.admitted_ms is not None else now_ms for e in self._admitted.values())
        since = max(since, self._last_own_completion.get(head.model_id, since))
        return hold(HoldQuery(head, len(self._admitted), since, now_ms))

    # -- lending ------------------------------------------------------------------------------------

    def withdraw_for_lending(
        self,
        model_id: str,
        n: int,
        now_ms: int,
        helper_node_id: str,
        helper_model_id: str,
        max_context: int | None = None,
        vision: bool = True,
    ) -> list[str]:
        """Mark up to ``n`` waiting entries of owner model ``model_id`` as lent: first the entry held
        for a faster helper (the hold kept it waiting *for* the helper, so it is the one lent, whatever
        its class), then in :meth:`lending_order` (lowest class first; in one class oldest first, as
        before classes).

        Never takes admitted, borrowed, streaming or returned entries, nor one whose required
        context exceeds ``max_context``, nor (without ``vision``) one carrying an image: the owner
        runs those itself, and later entries may still be lent.  A helper-only model never lends.
        """
        if n <= 0 or model_id not in self._owners:
            return []
        taken: list[Entry] = []
        order = self.lending_order(now_ms)
        if any(e.holding for e in order):  # the held one first, the rest in their order
            order = [e for e in order if e.holding] + [e for e in order if not e.holding]
        for e in order:
            if len(taken) >= n:
                break
            if e.model_id != model_id or e.borrowed or e.streaming or e.returned:
                continue
            if not fits_helper(e, max_context, vision):
                continue
            taken.append(e)
        self._line.remove_all(taken)
        for e in taken:
            e.state = "lent"
            e.holding = False
            e.lent_ms = now_ms
            e.helper_node_id = helper_node_id
            e.helper_model_id = helper_model_id
            self._lent.append(e)
        return [e.request_id for e in taken]

    def lending_order(self, now_ms: int) -> list[Entry]:
        """Waiting entries in the order lending takes them (:meth:`WaitingLine.lending_order`)."""
        return self._line.lending_order(now_ms)

    def serving_order(self, now_ms: int) -> list[Entry]:
        """Waiting entries in the order they would be admitted if nothing else arrived."""
        return self._line.serving_order(now_ms)

    def position(self, request_id: str, now_ms: int) -> int:
        """A waiting entry's place in the serving order (1 = admitted next; 0 for an entry that
        is not waiting): :meth:`WaitingLine.position`."""
        entry = self._by_id.get(request_id)
        if entry is None or entry.state != "pending":
            return 0
        return self._line.position(entry, now_ms)

    def returned(self, request_id: str, now_ms: int) -> Effects:
        """A lent request came back (409, failure or cut-off): back to the head, first arrival kept.

        It is this node's own work waiting again, so, as for a native arrival, every waiting borrowed
        entry is handed back (a node lending its own work may borrow meanwhile).
        """
        entry = self._get(request_id)
        if entry.state != "lent":
            raise QueueError(f"request {request_id} is not lent")
        self._lent.remove(entry)
        entry.state = "pending"
        entry.returned = True
        entry.lent_ms = None
        entry.helper_node_id = entry.helper_model_id = None
        back = self._hand_back(())
        entry.borrowed_ahead = self.borrowed_in_backend()
        self._line.add(entry, head=True)
        return Effects(returned=back) + self.pump(now_ms)

    # -- endings ------------------------------------------------------------------------------------

    def finished(self, request_id: str, now_ms: int) -> Effects:
        """An admitted request finished in the backend, or a lent one was answered by its helper.

        A lent request's end frees no backend slot, so it does not re-run admission: a request held
        for the helper stays held until the master's next answer lends it (or clears the lease).
        """
        entry = self._get(request_id)
        state = entry.state
        if state == "pending":
            raise QueueError(f"request {request_id} has not started")
        if state == "admitted" and not entry.borrowed:
            self._last_own_completion[entry.model_id] = now_ms
        self._forget(entry)
        if state == "lent" or not self._pending:
            return NO_EFFECTS  # no backend place freed, or nothing waits for one
        return self.pump(now_ms)

    def cancel(self, request_id: str, now_ms: int) -> Effects:
        """The client went away: drop the entry in whatever state it is (unknown ids are ignored)."""
        entry = self._by_id.get(request_id)
        if entry is None:
            return NO_EFFECTS
        self._forget(entry)
        return self.pump(now_ms)

    def drain(self) -> Effects:
        """The node drains: every waiting entry leaves at once, a borrowed one handed back (its
        owner runs it), an own one refused (nothing new starts here); admitted and lent ones go on."""
        waiting = list(self._pending)
        for entry in waiting:
            self._forget(entry)
        return Effects(returned=tuple(BorrowedReturn(e.request_id, "") for e in waiting if e.borrowed),
                       refused=tuple(e.request_id for e in waiting if not e.borrowed))

    def _forget(self, entry: Entry) -> None:
        del self._by_id[entry.request_id]
        if entry.borrowed:
            self._borrowed_live -= 1
        if not self._by_id:
            self.order.reset()
        state = entry.state
        if state == "admitted":
            del self._admitted[entry.request_id]
            self._admitted_of[entry.model_id] -= 1
            return
        if state == "pending":
            self._line.remove(entry)
            return
        # found by identity (Entry's generated == compares every field)
        lent = self._lent
        for i, e in enumerate(lent):
            if e is entry:
                del lent[i]
                break

    def _get(self, request_id: str) -> Entry:
        try:
            return self._by_id[request_id]
        except KeyError:
            raise QueueError(f"unknown request {request_id}") from None


__all__ = ["NO_EFFECTS", "BorrowedReturn", "Effects", "Entry", "HoldCheck", "HoldQuery", "LaneQueue",
           "QueueError", "fits_helper"]
