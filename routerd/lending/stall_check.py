"""Performs the master's stall check (:mod:`routerd.lending.stall` decides).

The relay wraps every send to a helper in :meth:`StallCheck.send`: the request is tracked
while it is out, a self-armed timer fires when a helper's lent requests have not changed for
``offload_lent_stall_timeout``, the helper is asked (``GET /router/v1/node/offload/borrowed``;
the master as helper answers in-process), and the requests it loses are cancelled.  A cancelled
send raises :class:`~routerd.routing.forward.CameBack`, so the owner sees the request come back
(409 ``offload_returned``) and serves it at the head of its queue with its first arrival.
Each lost request is logged as a master ``dispatch/stall_reclaimed`` row.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import attrs
from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from routerd.clients.node_client import RemoteError
from routerd.lending.decisions import DecisionLog
from routerd.lending.offload import RelayRequest
from routerd.lending.stall import Ask, LentOut, StallTracker
from routerd.paths import BORROWED_PATH
from routerd.routing.forward import CameBack
from routerd.wire.lending import Lease

log = Logger()


T = TypeVar("T")


class HelperGone(Exception):
    """The helper could not be asked (unreachable, or an answer that is not a borrowed list)."""


#: Asks one helper node which borrowed request IDs it holds; ``None`` when its build cannot say
#: (it counts as busy).  Raises :class:`HelperGone` (or anything else) when it cannot be asked.
AskHelper = Callable[[str], Awaitable[list[str] | None]]


def borrowed_ids(doc: Any) -> list[str]:
    """The request IDs of a helper's ``{"borrowed": [{"request_id": ...}, ...]}`` answer."""
    items = doc.get("borrowed") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise HelperGone("the borrowed-work answer is not a list")
    return [str(item["request_id"]) for item in items if isinstance(item, dict) and "request_id" in item]


async def ask_over_http(get_json: Callable[[str, str], Awaitable[Any]], node_url: str) -> list[str] | None:
    """Ask a remote helper; a 404 (a build from before the check) answers ``None`` (busy)."""
    try:
        doc = await get_json(node_url, BORROWED_PATH)
    except RemoteError as exc:
        if exc.status == 404:
            return None
        raise
    return borrowed_ids(doc)


@attrs.define(kw_only=True, eq=False)
class StallCheck:
    clock: IReactorTime
    timeout: Callable[[], float]
    ask: AskHelper
    decisions: Callable[[], DecisionLog | None]
    tracker: StallTracker = attrs.field(init=False, factory=StallTracker)
    _sending: dict[int, Deferred[Any]] = attrs.field(init=False, factory=dict)
    _reclaimed: set[int] = attrs.field(init=False, factory=set)
    _timer: IDelayedCall | None = attrs.field(init=False, default=None)
    _stopped: bool = attrs.field(init=False, default=False)

    async def send(self, out: LentOut, sending: Coroutine[Any, Any, T]) -> T:
        """Run one relayed send while tracking ``out`` (from :meth:`lent`); a reclaim raises
        :class:`CameBack`."""
        d: Deferred[T] = defer.ensureDeferred(sending)
        self._sending[out.token] = d
        self.rearm()
        try:
            return await d
        except BaseException:
            if out.token in self._reclaimed:
                raise CameBack("reclaimed by the master's stall check") from None
            raise
        finally:
            self._sending.pop(out.token, None)
            self._reclaimed.discard(out.token)
            self.tracker.over(self.clock.seconds(), out)
            self.rearm()

    def lent(self, request_id: str, relay: RelayRequest, lease: Lease) -> LentOut:
        """Start tracking a request the relay is about to send to ``lease``'s helper."""
        return self.tracker.lent(self.clock.seconds(), request_id, relay.lane, relay.owner_node_id,
                                 relay.owner_model_id, lease.helper_node_id, lease.helper_model_id)

    # -- the timer ---------------------------------------------------------------------------

    def rearm(self) -> None:
        """(Re)arm the timer for the earliest helper that becomes due."""
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        if self._stopped:
            return
        due = self.tracker.next_due(self.timeout())
        if due is not None:
            self._timer = self.clock.callLater(max(0.0, due - self.clock.seconds()), self._fire)

    def start(self) -> None:
        self._stopped = False
        self.rearm()

    def stop(self) -> None:
        self._stopped = True
        self.rearm()

    def _fire(self) -> None:
        self._timer = None
        for ask in self.tracker.due(self.clock.seconds(), self.timeout()):
            defer.ensureDeferred(self._check(ask)).addErrback(
                lambda f: log.failure("stall check failed", failure=f))
        self.rearm()

    async def _check(self, ask: Ask) -> None:
        reason = ""
        listed: list[str] | None
        try:
            listed = await self.ask(ask.helper_node_id)
        except Exception as exc:  # noqa: BLE001 - a helper that cannot be asked does not run them
            log.warn("stall check: helper {helper} could not be asked: {reason}", helper=ask.helper_node_id,
                     reason=str(exc))
            listed, reason = [], "helper_unreachable"
        lost = self.tracker.answered(self.clock.seconds(), ask, listed)
        if lost:
            log.info("stall check: helper {helper} no longer runs {count} lent requests; their owners "
                     "serve them", helper=ask.helper_node_id, count=len(lost))
        else:
            log.info("stall check: helper {helper} keeps its {count} lent requests",
                     helper=ask.helper_node_id, count=len(ask.requests))
        now = self.clock.seconds()
        for out in lost:
            self._row(out, reason, len(lost), now)
            d = self._sending.get(out.token)
            if d is not None:
                self._reclaimed.add(out.token)
                d.cancel()
        self.rearm()

    def _row(self, out: LentOut, reason: str, lent_out: int, now: float) -> None:
        decisions = self.decisions()
        if decisions is None:
            return
        fields: dict[str, Any] = {
            "lane": out.lane, "owner_node_id": out.owner_node_id, "owner_model_id": out.owner_model_id,
            "helper_node_id": out.helper_node_id, "helper_model_id": out.helper_model_id,
            "request_id": out.request_id, "lent_out": lent_out, "wait_ms": int((now - out.lent_at) * 1000)}
        if reason:
            fields["reason"] = reason
        decisions.record("dispatch", "stall_reclaimed", **fields)
