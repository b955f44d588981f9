"""The owner's clock-driven lending rules, wired to Twisted: the hold alarm and the lent cut-off.

:class:`HoldGate` is the :data:`~routerd.lending.queue.HoldCheck` a lane queue consults for its
second slot.  It asks the pure :func:`~routerd.lending.hold.judge_hold`, writes the
``held_for_helper`` row the first time a request is held, and arms one alarm per lane at the instant
the hold would lapse (a lent request overrunning, or the lease expiring), which re-runs admission so
the release does not wait for another queue event.

:class:`LentCall` sends one lent request through the transport and cancels it when the helper has
not started answering by the give-up time of :class:`~routerd.lending.cutoff.CutOffRule` (it then
raises :class:`CutOff`, a :class:`~routerd.lending.offload.Returned`, so the request follows the
return path), or when the owner's client goes away.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from routerd.lending.cutoff import CutOffRule
from routerd.lending.hold import HOLD_REASON, judge_hold
from routerd.lending.offload import Returned
from routerd.lending.queue import HoldCheck, HoldQuery, LaneQueue, fits_helper
from routerd.routing.call import Call
from routerd.wire.lending import Lane, Lease

log = Logger()


class _Recorder(Protocol):
    def record(self, kind: str, outcome: str, **fields: Any) -> None: ...


class HoldGate:
    """Hold checks for every lane queue of one node (see the module doc).

    ``enabled`` reads the setting, ``lease`` the live lease of (lane, model) with its expiry in ms on
    this node's clock, ``queue`` a lane's queue, ``repump`` re-runs admission of a lane and
    performs what it admits, and ``refilling`` says whether the master's answer to an event of
    (lane, model) is awaited (it lends into a lent slot just freed).
    """

    def __init__(self, *, node_id: str, clock: IReactorTime | None, enabled: Callable[[], bool],
                 lease: Callable[[Lane, str], tuple[Lease, float] | None],
                 queue: Callable[[Lane], LaneQueue], repump: Callable[[Lane], None],
                 decisions: _Recorder | None,
                 refilling: Callable[[Lane, str], bool] = lambda _lane, _model: False) -> None:
        self.node_id = node_id
        self.clock = clock
        self.enabled = enabled
        self.lease = lease
        self.queue = queue
        self.repump = repump
        self.decisions = decisions
        self.refilling = refilling
        self._logged: dict[Lane, set[str]] = {}
        self._alarms = LaneAlarms(clock, repump)

    def check(self, lane: Lane) -> HoldCheck:
        """The hold check to build ``lane``'s queue with."""
        return lambda query: self._check(lane, query)

    def _check(self, lane: Lane, query: HoldQuery) -> bool:
        entry = query.entry
        found = self.lease(lane, entry.model_id)
        lease, expires_ms = found if found is not None else (None, 0.0)
        if lease is not None and not fits_helper(entry, lease.helper_context or None,
                                                 lease.helper_multimodal):
            lease = None  # the helper could never take this one (too big, or an image): never held
        lent = self.queue(lane).lent(entry.model_id)
        verdict = judge_hold(enabled=self.enabled(), lease=lease, lease_expires_ms=expires_ms,
                             in_flight=query.in_flight, generating_since_ms=query.generating_since_ms,
                             now_ms=query.now_ms, lent_at_ms=[e.lent_ms or 0 for e in lent],
                             refilling=self.refilling(lane, entry.model_id))
        if not verdict.hold or lease is None or verdict.alarm_ms is None:
            self._disarm(lane)
            return False
        self._arm(lane, verdict.alarm_ms, query.now_ms)
        logged = self._logged.setdefault(lane, set())
        logged.intersection_update(e.request_id for e in self.queue(lane).pending())
        if entry.request_id not in logged:
            logged.add(entry.request_id)
            if self.decisions is not None:
                self.decisions.record(
                    "dispatch", "held_for_helper", lane=lane, reason=HOLD_REASON,
                    owner_node_id=self.node_id, owner_model_id=entry.model_id,
                    helper_node_id=lease.helper_node_id, helper_model_id=lease.helper_model_id,
                    request_id=entry.request_id, keep_ms=verdict.keep_ms,
                    switch_ms=lease.helper_switch_ms, service_ms=lease.helper_service_ms,
                    owner_job_ms=lease.owner_job_ms, slots=lease.slots(), lent_out=len(lent),
                    wait_ms=max(query.now_ms - entry.arrived_ms, 0))
        return True

    def _arm(self, lane: Lane, at_ms: int, now_ms: int) -> None:
        self._alarms.arm(lane, at_ms, now_ms)

    def _disarm(self, lane: Lane) -> None:
        self._alarms.disarm(lane)


class LaneAlarms:
    """One alarm per lane that re-runs that lane's admission (``repump``) at an instant in ms on
    ``clock`` (none without a clock); arming it again for another instant moves it."""

    def __init__(self, clock: IReactorTime | None, repump: Callable[[Lane], None]) -> None:
        self.clock = clock
        self.repump = repump
        self._alarms: dict[Lane, tuple[int, IDelayedCall]] = {}

    def arm(self, lane: Lane, at_ms: int, now_ms: int) -> None:
        if self.clock is None:
            return
        current = self._alarms.get(lane)
        if current is not None and current[1].active():
            if current[0] == at_ms:
                return
            current[1].cancel()
        delay = max(at_ms - now_ms, 1) / 1000.0
        self._alarms[lane] = (at_ms, self.clock.callLater(delay, self._ring, lane))

    def disarm(self, lane: Lane) -> None:
        current = self._alarms.pop(lane, None)
        if current is not None and current[1].active():
            current[1].cancel()

    def _ring(self, lane: Lane) -> None:
        self._alarms.pop(lane, None)
        self.repump(lane)


class CutOff(Returned):
    """A lent request the helper had not started answering by its give-up time."""


class _Sender(Protocol):
    async def lend(self, call: Call, lease: Lease, model_id: str, *,
                   answering: Callable[[], None] | None = None) -> bytes: ...


class LentCall:
    """Send lent requests with the cut-off timer (see the module doc)."""

    def __init__(self, clock: IReactorTime | None, rule: CutOffRule | None = None) -> None:
        self.clock = clock
        self.rule = rule if rule is not None else CutOffRule()

    def give_up_s(self, lease: Lease) -> float | None:
        ms = self.rule.give_up_ms(lease)
        return None if ms is None or self.clock is None else ms / 1000.0

    def lend(self, transport: _Sender, call: Call, lease: Lease, model_id: str) -> Deferred[bytes]:
        """The helper's answer (streamed into ``call.reply``); :class:`CutOff` when cut off.

        Cancelling the returned Deferred (the client went away) cancels the outgoing request and
        fails with ``CancelledError``, whatever the transport makes of the cancellation.
        """
        state = _Flight()
        give_up = self.give_up_s(lease)
        inner = Deferred.fromCoroutine(transport.lend(call, lease, model_id, answering=state.answering))

        def client_gone(outer: Deferred[bytes]) -> None:
            state.gone = True
            inner.cancel()

        outer: Deferred[bytes] = Deferred(client_gone)

        def settle(result: bytes | Failure) -> None:
            state.stop_timer()
            if outer.called:  # the client went away: the request is over
                if isinstance(result, Failure):
                    result.trap(Exception)
                return
            if isinstance(result, Failure) and state.cut and not call.reply.started:
                outer.errback(Failure(CutOff(f"no answer from the helper within {give_up:.1f}s")))
                return
            if isinstance(result, Failure) and state.gone:
                outer.errback(Failure(CancelledError()))
                return
            if isinstance(result, Failure):
                outer.errback(result)
            else:
                outer.callback(result)

        if give_up is not None and self.clock is not None and not inner.called:
            def cut() -> None:
                if state.answered or inner.called:
                    return
                state.cut = True
                log.info("lent request {request_id} cut off: {helper} has not started answering "
                         "after {give_up_s:.1f}s", request_id=call.request_id,
                         helper=f"{lease.helper_node_id}/{lease.helper_model_id}", give_up_s=give_up)
                inner.cancel()

            state.timer = self.clock.callLater(give_up, cut)
        inner.addBoth(settle)
        return outer


class _Flight:
    """One lent request's cut-off state."""

    def __init__(self) -> None:
        self.answered = False
        self.cut = False
        self.gone = False
        self.timer: IDelayedCall | None = None

    def answering(self) -> None:
        """The helper started answering: from now on the body may take as long as it needs."""
        self.answered = True
        self.stop_timer()

    def stop_timer(self) -> None:
        if self.timer is not None and self.timer.active():
            self.timer.cancel()
        self.timer = None


__all__ = ["CutOff", "HoldGate", "LentCall"]
