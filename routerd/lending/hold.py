"""Holding a request for a faster helper (spec "Holding a request for a faster helper";
reference §3.6): the pure decision.

The owner is generating (something of the same model, and nothing else, is in its backend) and the
head of its router queue could take the second backend slot.  :func:`judge_hold` says whether to keep
it waiting for the helper instead, and until when that answer can stand without another event (the
alarm): the first instant a lent request overruns, or the lease's expiry.

It holds iff every condition holds:

1. the setting ``offload_hold_for_faster_helper`` is on;
2. the lease for the model is live (``expires_at > now``);
3. the lease carries measured speeds for both sides (not a probe; owner job and helper service > 0);
4. every lent slot is busy (lent in flight ≥ slots), or the master's next answer is on its way
   (``refilling``: a queue event of the model is in flight, and that answer lends into the free
   slot).  A lent answer frees its slot until the master answers the owner's event; judged in that
   window, a hold whose helper is on schedule ended and the owner took a third job
   (``benchmarks/lending.py`` (f)).  The spec's "goes to the helper on the master's next answer";
5. no lent request has overrun (spec: "released as soon as the helper has taken more than its
   predicted finish plus one job to answer"): ``now > lent_at + switch + slots × service + J``
   for none of them.  Its predicted finish: a request lent into a lease of ``slots`` slots may
   wait behind the ``slots - 1`` lent before it, so it is due ``switch + slots × service`` after
   it was lent.  (Judged by the one-slot formula, the request lent behind another into
   a two-slot lease "overran" the instant it was due.)  Plus one job: the owner's job ``J``, the
   job the hold keeps off the owner.  Once the helper is later than that, the owner could have
   run the held request in the delay, so it stops waiting for the helper; a helper only a little
   late keeps the request.  The reference (§3.6) allows one helper service (``switch + 2 ×
   service``), which a loaded machine's ~100 ms stall of a 16x faster helper (40 ms a job)
   exceeds: the hold ended, the owner took a third 640 ms job, and a burst the helper would have
   finished at its optimum ended at 1.4-1.5 x it (``benchmarks/lending.py`` (f), (f2)).  A helper
   that really hangs loses nothing by the longer wait: the held request goes to the owner
   anyway the moment the owner would idle (the hold only keeps its second slot);
6. the helper finishes this request before the owner would:

   * owner finish = ``max(generating_since + J, now) + (in_flight − 1) × J + J``;
   * helper finish: ``busy = first lent_at + switch``; for each lent request in lent order
     ``busy = max(busy, lent_at) + S``; then ``max(busy, now) + S``.

All times are milliseconds on the owner's clock.  No Twisted, no state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

from routerd.wire.lending import Lease

#: Why a request is held (the ``held_for_helper`` row's reason).
HOLD_REASON = "helper_finishes_sooner"


@attrs.frozen
class HoldVerdict:
    """The answer for the head of the queue.

    ``alarm_ms``: when the caller must re-run admission so the hold ends without waiting for another
    event (only set when holding).  ``owner_finish_ms``/``helper_finish_ms`` are absolute; ``keep_ms``
    is the owner's finish counted from now (the decision row's ``keep_ms``).
    """

    hold: bool
    alarm_ms: int | None = None
    owner_finish_ms: float = 0.0
    helper_finish_ms: float = 0.0
    keep_ms: float = 0.0


NO_HOLD = HoldVerdict(False)


def owner_finish_ms(generating_since_ms: float, now_ms: float, in_flight: int, job_ms: float) -> float:
    """When the owner would finish one more request after the ``in_flight`` ones in its backend."""
    return max(generating_since_ms + job_ms, now_ms) + (in_flight - 1) * job_ms + job_ms


def helper_finish_ms(lent_at_ms: Sequence[float], now_ms: float, switch_ms: float,
                     service_ms: float) -> float:
    """When the helper would finish one more request after the ones lent to it (in lent order)."""
    if not lent_at_ms:
        return now_ms + switch_ms + service_ms
    busy = lent_at_ms[0] + switch_ms
    for lent_at in lent_at_ms:
        busy = max(busy, lent_at) + service_ms
    return max(busy, now_ms) + service_ms


def overrun_at_ms(lent_at_ms: float, switch_ms: float, service_ms: float, job_ms: float,
                  slots: int = 1) -> float:
    """The instant after which a request lent at ``lent_at_ms`` under a lease of ``slots`` slots has
    overrun: its predicted finish (it may wait behind ``slots - 1`` others, then its own service)
    plus one owner job ``job_ms``."""
    return lent_at_ms + switch_ms + max(slots, 1) * service_ms + job_ms


def judge_hold(
    *,
    enabled: bool,
    lease: Lease | None,
    lease_expires_ms: float,
    in_flight: int,
    generating_since_ms: float,
    now_ms: float,
    lent_at_ms: Sequence[float],
    refilling: bool = False,
) -> HoldVerdict:
    """Whether to keep the head of the queue waiting for the lease's helper (see the module doc).

    ``lent_at_ms`` lists when each request of the model now lent out was lent, in lent order.
    ``in_flight`` counts the owner's admitted requests (all native, of the same model: the caller's
    precondition, which :class:`~routerd.lending.queue.LaneQueue` checks).  ``refilling``: the
    master's answer to an event of the model is awaited (condition 4).
    """
    if not enabled or lease is None or in_flight < 1 or lease_expires_ms <= now_ms:
        return NO_HOLD
    if not lease.has_speeds():
        return NO_HOLD
    if len(lent_at_ms) < lease.slots() and not refilling:
        return NO_HOLD
    switch, service, job = lease.helper_switch_ms, lease.helper_service_ms, lease.owner_job_ms
    first_overrun = overrun_at_ms(min(lent_at_ms), switch, service, job, lease.slots()) if lent_at_ms \
        else math.inf
    if now_ms > first_overrun:
        return NO_HOLD
    owner = owner_finish_ms(generating_since_ms, now_ms, in_flight, job)
    helper = helper_finish_ms(lent_at_ms, now_ms, switch, service)
    if not helper < owner:
        return NO_HOLD
    # The first whole millisecond at which ``now > first_overrun`` holds, or the lease's expiry.
    alarm = min(math.floor(first_overrun) + 1 if lent_at_ms else math.inf, math.ceil(lease_expires_ms))
    return HoldVerdict(True, int(alarm), owner, helper, owner - now_ms)


__all__ = [
    "HOLD_REASON",
    "NO_HOLD",
    "HoldVerdict",
    "helper_finish_ms",
    "judge_hold",
    "overrun_at_ms",
    "owner_finish_ms",
]
