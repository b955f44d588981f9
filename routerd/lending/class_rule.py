"""The second-place class rule (contract "The second-place class rule"): to a place where it would
wait inside the backend, a request is admitted only if no own request of a higher class than its own
(after aging) arrived within the last aging period.  A request admitted behind running ones waits in
the backend, where a later higher-class request could not pass it; while that class is about, lower
classes go to the backend one at a time (the runtime idles for a round trip between them).

The waiting place behind a model's running jobs opens to a lower class anyway for the last fifth
(:data:`LEAD`) of the running job the node's fits predict to end first: the backend then has its next
job in hand as it finishes (as busy as with one class: no idle round trip between jobs), and a
higher-class arrival waits at most that fifth longer.  No fit, no opening.

Pure: the lane queue asks it, and when it says *until when*, the queue's caller pumps again then (no
arrival or completion may come to top the backend back up when the window lapses or the place opens).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from routerd.lending.priority import effective_rank
from routerd.lending.queue_entries import Entry

#: A job's predicted duration in ms from the node's cost fits, or None when they cannot price it.
PredictMs = Callable[[Entry], "float | None"]
#: The share of a running job's predicted time before its end from which the place behind it opens.
LEAD = 0.2


def place_opens_ms(admitted: Iterable[Entry], head: Entry, predict_ms: PredictMs | None,
                   last_done_ms: int = 0) -> int | None:
    """When the waiting place behind the running jobs opens to ``head`` whatever its class: the last
    :data:`LEAD` of the earliest predicted end among them, each timed from when it began running (its
    admission, or the model's last completion ``last_done_ms`` when it waited in the backend behind
    that job).  None (the class rule alone decides) when there is no prediction, or the backend holds
    anything but ``head``'s model's running jobs."""
    if predict_ms is None:
        return None
    ends: list[float] = []
    for entry in admitted:
        took = predict_ms(entry) if entry.model_id == head.model_id else None
        if took is None or entry.admitted_ms is None:
            return None
        ends.append(max(entry.admitted_ms, last_done_ms) + took * (1.0 - LEAD))
    return int(min(ends)) if 0 < len(ends) <= head.concurrency else None


def outranked_until(class_seen: Mapping[int, int], priority: int, arrived_ms: int, now_ms: int,
                    aging_ms: int, opens_ms: int | None = None) -> int | None:
    """Until when (ms) a request of class rank ``priority``, first arrived at ``arrived_ms``, may not
    take a waiting place in the backend, or None when it may now.  ``class_seen``: when a native
    request of each class rank last arrived.  The answer is the earliest of the higher classes'
    windows lapsing, the request aging up one class (then it is asked again) and ``opens_ms``
    (:func:`place_opens_ms`), from which the place is its own."""
    if aging_ms <= 0 or not class_seen or (opens_ms is not None and now_ms >= opens_ms):
        return None
    rank = effective_rank(priority, arrived_ms, now_ms, aging_ms)
    lapses = [seen + aging_ms for r, seen in class_seen.items() if r < rank and now_ms - seen < aging_ms]
    if not lapses:
        return None
    aged = arrived_ms + (max(now_ms - arrived_ms, 0) // aging_ms + 1) * aging_ms
    return min(min(lapses), aged, aged if opens_ms is None else opens_ms)
