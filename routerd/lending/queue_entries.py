"""What a lane queue holds and what it answers (:mod:`routerd.lending.queue`).

:class:`Entry` is one queued request (native or borrowed; pending, admitted or lent).  Every call
on the queue answers :class:`Effects`: the entries to start now, and the borrowed ones to hand
back with 409 (:class:`BorrowedReturn`).  A hold check (:data:`HoldCheck`) is asked with a
:class:`HoldQuery` whether the head waits for a faster helper; :func:`fits_helper` is the
per-request gate of lending.  Pure: no Twisted, no clock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import attrs

EntryState = Literal["pending", "admitted", "lent"]
#: Why a borrowed request goes back ('': the helper drains, a return the decision log gives no reason).
ReturnReason = Literal["helper_busy_on_arrival", "own_work_arrived", ""]


class QueueError(ValueError):
    """A call that does not fit the queue's state (unknown id, model not enrolled, duplicate id)."""


@attrs.define(weakref_slot=False)
class Entry:
    """One queued request (mutable; owned by the queue — read it, do not change it)."""

    request_id: str
    model_id: str
    arrived_ms: int
    work: tuple[float, ...] = ()
    context: int = 0
    streaming: bool = False
    borrowed: bool = False
    state: EntryState = "pending"
    returned: bool = False  # came back from a helper: never lent again, never held
    holding: bool = False  # the hold check is keeping it back right now
    admitted_ms: int | None = None
    lent_ms: int | None = None
    helper_node_id: str | None = None
    helper_model_id: str | None = None
    borrowed_ahead: int = 0  # borrowed entries admitted when this native entry arrived
    image: bool = False  # carries an image: lent only to a helper that reads images
    priority: int = 1  # class rank (0 interactive, 1 standard, 2 batch): routerd.lending.priority
    key_name: str = ""  # the name of the key that admitted it (fair share; never the key itself)
    weight: float = 1.0  # the key's limits.weight (fair share)
    concurrency: int = 1  # requests its model's backend serves at once (native entries)
    overtaken_ms: int | None = None  # when the swap-avoiding order first served a later one first


@attrs.frozen
class BorrowedReturn:
    """A borrowed request to answer with 409 ``offload_returned``."""

    request_id: str
    reason: ReturnReason


@attrs.frozen
class SwapPass:
    """One pass of the swap-avoiding order (:mod:`routerd.lending.swap_batch`): ``served``, of the
    model ``model_id`` the runtime holds, was admitted ahead of ``passed`` (of ``passed_model_id``,
    waiting for ``waited_ms``), which would have switched the runtime; ``avoided``: how many fewer
    switches the waiting requests' order makes for it (0, 1 or 2)."""

    served: str
    passed: str
    model_id: str
    passed_model_id: str
    waited_ms: int
    avoided: int


@attrs.frozen
class Effects:
    """What the caller must do now: start ``admit`` (in order), hand back ``returned``, refuse
    ``refused`` (own requests the queue will never run: the node drains); and pump again at
    ``recheck_ms`` (its clock) when admission's answer will change then with no event.  ``passed``:
    the requests admitted ahead of one that would have switched the runtime (the decision log's)."""

    admit: tuple[str, ...] = ()
    returned: tuple[BorrowedReturn, ...] = ()
    refused: tuple[str, ...] = ()
    recheck_ms: int | None = None
    passed: tuple[SwapPass, ...] = ()

    def __add__(self, other: Effects) -> Effects:
        checks = [t for t in (self.recheck_ms, other.recheck_ms) if t is not None]
        return Effects(self.admit + other.admit, self.returned + other.returned, self.refused + other.refused,
                       min(checks) if checks else None, self.passed + other.passed)


#: Nothing to do (frozen, so one instance serves every answer that asks for nothing).
NO_EFFECTS = Effects()


@attrs.frozen
class HoldQuery:
    """What a hold check sees: the waiting head and the owner's pipeline.

    ``generating_since_ms`` = the earliest admission among the admitted entries, moved forward to
    the last completion of the model's own work.
    """

    entry: Entry
    in_flight: int
    generating_since_ms: int
    now_ms: int


HoldCheck = Callable[[HoldQuery], bool]


def fits_helper(entry: Entry, max_context: int | None, vision: bool) -> bool:
    """The per-request gates of lending (reference §6/§7): an entry with an estimated size must fit
    the helper's window ``max_context`` (None: no gate), and one carrying an image needs ``vision``."""
    if max_context is not None and entry.context > 0 and entry.context > max_context:
        return False
    return vision or not entry.image


__all__ = [
    "NO_EFFECTS",
    "BorrowedReturn",
    "Effects",
    "Entry",
    "EntryState",
    "HoldCheck",
    "HoldQuery",
    "QueueError",
    "ReturnReason",
    "SwapPass",
    "fits_helper",
]
