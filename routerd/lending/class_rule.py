"""The second-place class rule (contract "The second-place class rule"): to a place where it would
wait inside the backend, a request is admitted only if no own request of a higher class than its own
(after aging) arrived within the last aging period.  A request admitted behind running ones waits in
the backend, where a later higher-class request could not pass it; while that class is about, lower
classes go to the backend one at a time (the runtime idles for a round trip between them).

Pure: the lane queue asks it, and when it says *until when*, the queue's caller pumps again then (no
arrival or completion may come to top the backend back up when the window lapses).
"""

from __future__ import annotations

from collections.abc import Mapping

from routerd.lending.priority import effective_rank


def outranked_until(class_seen: Mapping[int, int], priority: int, arrived_ms: int, now_ms: int,
                    aging_ms: int) -> int | None:
    """Until when (ms) a request of class rank ``priority``, first arrived at ``arrived_ms``, may not
    take a waiting place in the backend, or None when it may now.  ``class_seen``: when a native
    request of each class rank last arrived.  The answer is the earliest of the higher classes'
    windows lapsing and the request aging up one class (then it is asked again)."""
    if aging_ms <= 0 or not class_seen:
        return None
    rank = effective_rank(priority, arrived_ms, now_ms, aging_ms)
    lapses = [seen + aging_ms for r, seen in class_seen.items() if r < rank and now_ms - seen < aging_ms]
    if not lapses:
        return None
    aged = arrived_ms + (max(now_ms - arrived_ms, 0) // aging_ms + 1) * aging_ms
    return min(min(lapses), aged)
