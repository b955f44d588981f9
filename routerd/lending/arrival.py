"""What a request is queued with when it arrives in a lane queue, beyond its ids.

Whether it carries an image (:func:`entry_image`) matters only to lending (a helper without vision
never takes it), and only an owner's requests are lent: so the body is walked for images only for
an owner's request, and a waiting request whose model has just become an owner is walked then
(:func:`images_for_new_owners`).  Pure: no Twisted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from routerd.lending.queue import LaneQueue
from routerd.routing.call import Call
from routerd.routing.images import has_image
from routerd.wire.lending import Lane


def entry_image(call: Call, lane: Lane, owner: bool) -> bool:
    """The ``image`` flag of a native arrival (read by lending only, so False for a non-owner)."""
    return owner and lane == "text" and has_image(call.parsed)


def images_for_new_owners(queue: LaneQueue, calls: Mapping[str, Call]) -> None:
    """After the owners changed: give the waiting native entries of the lane's owner models the
    image flag their arrival skipped (``calls`` maps a waiting request's id to its call; a held
    request's parsed body may have been dropped, so the raw body is read then)."""
    if queue.lane != "text":
        return
    for entry in queue.pending():
        call = calls.get(entry.request_id)
        if entry.borrowed or entry.image or call is None or not queue.is_owner(entry.model_id):
            continue
        parsed = call.parsed
        if parsed is None:
            try:
                parsed = json.loads(call.body)
            except ValueError:
                continue  # no JSON body: nothing to find
        entry.image = has_image(parsed)


__all__ = ["entry_image", "images_for_new_owners"]
