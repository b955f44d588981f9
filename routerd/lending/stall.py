"""The master's stall check of lent requests (spec "Borrowed work yields to the helper's own
requests", last paragraph; ``offload_lent_stall_timeout``).

Every lent request passes the master's relay (owner → master → helper), so the master knows
what each helper holds.  :class:`StallTracker` is the pure bookkeeping and decision: it is told
when a request is lent to a helper and when it is over, and keeps, per helper, the instant the
set of requests lent to it last changed.  Given the time it names the helpers to ask
(:meth:`due`: requests out and no change for the timeout) and, given a helper's answer, which
requests it loses (:meth:`answered`).  The coordinator performs both: it polls
``GET /router/v1/node/offload/borrowed`` and cancels the relayed requests it is told to reclaim.

The answer rule: a helper that still lists any of the requests asked about keeps all of them
(its work may just be large) and the wait starts again; a helper that lists none of them loses
every one of them at once.  A helper whose build has no such endpoint counts as busy
(:data:`BUSY`).  Requests lent while the question is out are not part of it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import attrs

from routerd.wire.lending import Lane

#: The answer of a helper that cannot say (its build predates the check): it keeps its work.
BUSY = None


@attrs.frozen
class LentOut:
    """One request the relay has passed to a helper and not yet seen finish."""

    token: int  # unique per relay (request IDs are client-chosen and may repeat)
    request_id: str
    lane: Lane
    owner_node_id: str
    owner_model_id: str
    helper_node_id: str
    helper_model_id: str
    lent_at: float


@attrs.frozen
class Ask:
    """Ask ``helper_node_id`` whether it still runs ``requests`` (all lent to it, unchanged since)."""

    helper_node_id: str
    requests: tuple[LentOut, ...]

    def request_ids(self) -> frozenset[str]:
        return frozenset(r.request_id for r in self.requests)


@attrs.define
class _Helper:
    changed_at: float
    out: dict[int, LentOut] = attrs.Factory(dict)
    asking: bool = False


class StallTracker:
    def __init__(self) -> None:
        self._helpers: dict[str, _Helper] = {}
        self._tokens = itertools.count(1)

    # -- changes ---------------------------------------------------------------------------

    def lent(self, now: float, request_id: str, lane: Lane, owner_node_id: str, owner_model_id: str,
             helper_node_id: str, helper_model_id: str) -> LentOut:
        """A request went to a helper: a change for that helper."""
        out = LentOut(next(self._tokens), request_id, lane, owner_node_id, owner_model_id,
                      helper_node_id, helper_model_id, now)
        helper = self._helpers.setdefault(helper_node_id, _Helper(now))
        helper.out[out.token] = out
        helper.changed_at = now
        return out

    def over(self, now: float, out: LentOut) -> None:
        """A lent request is over (answered, returned, failed or reclaimed): a change."""
        helper = self._helpers.get(out.helper_node_id)
        if helper is None or helper.out.pop(out.token, None) is None:
            return
        helper.changed_at = now
        if not helper.out and not helper.asking:
            del self._helpers[out.helper_node_id]

    # -- decisions -------------------------------------------------------------------------

    def outstanding(self, helper_node_id: str) -> list[LentOut]:
        helper = self._helpers.get(helper_node_id)
        return list(helper.out.values()) if helper is not None else []

    def next_due(self, timeout: float) -> float | None:
        """The earliest instant a helper becomes due (None: nothing lent, or every due helper is
        already being asked)."""
        times = [h.changed_at + timeout for h in self._helpers.values() if h.out and not h.asking]
        return min(times) if times else None

    def due(self, now: float, timeout: float) -> list[Ask]:
        """The helpers whose lent requests have not changed for ``timeout``; each is marked as
        being asked until :meth:`answered`."""
        asks = []
        for node_id in sorted(self._helpers):
            helper = self._helpers[node_id]
            if helper.out and not helper.asking and now - helper.changed_at >= timeout:
                helper.asking = True
                asks.append(Ask(node_id, tuple(helper.out.values())))
        return asks

    def answered(self, now: float, ask: Ask, listed: Iterable[str] | None) -> list[LentOut]:
        """The helper's answer: the request IDs it lists as borrowed work, or :data:`BUSY`.

        Returns the requests it loses (still outstanding ones of the question), or ``[]`` when it
        keeps them; keeping restarts the wait.
        """
        helper = self._helpers.get(ask.helper_node_id)
        if helper is None:
            return []
        helper.asking = False
        still = [r for r in ask.requests if r.token in helper.out]
        keeps = listed is None or bool(ask.request_ids() & frozenset(listed))
        if keeps or not still:
            helper.changed_at = now
            if not helper.out:
                del self._helpers[ask.helper_node_id]
            return []
        return still
