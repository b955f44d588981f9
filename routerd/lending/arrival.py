"""What an own request is queued with when it arrives in a lane queue, and when it is refused.

An arrival is queued (:func:`queue_own`) with the work terms the queue and the planner price it
by (:class:`WorkHints`), its class, key and weight, and its model's concurrency; one that would wait
behind ``limits.max_queued_per_model`` others of its model is refused (:func:`refuse_when_full`).
Whether it carries an image (:func:`entry_image`) matters only to lending (a helper without vision
never takes it), and only an owner's requests are lent: so the body is walked for images only for
an owner's request, and a waiting request whose model has just become an owner is walked then
(:func:`images_for_new_owners`).  Pure: no Twisted.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping

from routerd.catalog.eligibility import concurrency
from routerd.catalog.model import ModelConfig
from routerd.config.lending import LendingSettings
from routerd.errors import queue_full
from routerd.lending.class_rule import PredictMs
from routerd.lending.pricing import predict, work_terms
from routerd.lending.priority import RANK
from routerd.lending.queue import Effects, LaneQueue
from routerd.routing.call import Call
from routerd.routing.images import has_image
from routerd.wire.lending import LANE_SECTION, Costs, Lane, TokenProfile


class WorkHints:
    """The work terms (and, for text, the context) the queue and the planner price a request by:
    :func:`~routerd.lending.pricing.work_terms`, with its model's token profile from the node's
    latest cost fit (indexed once per fit, not searched per arrival)."""

    def __init__(self) -> None:
        self._profiles: dict[str, TokenProfile] = {}
        self._costs = Costs()

    def update(self, costs: Costs) -> None:
        """A new fit: a model's first profile counts, as :meth:`Costs.token_profile` answers."""
        self._profiles = {profile.model_id: profile for profile in reversed(costs.tokens)}
        self._costs = costs

    def predictor(self, lane: Lane) -> PredictMs:
        """A queued job's predicted time (ms) in ``lane`` from the latest fit, or None (the queue's
        second-place rule opens the place behind a running job near its predicted end)."""
        section = LANE_SECTION[lane]
        return lambda entry: predict(self._costs.model(entry.model_id, section), entry.work)

    def profile(self, model_id: str) -> TokenProfile | None:
        """The token profile of ``model_id`` (its lane key) in the latest fit, or None."""
        return self._profiles.get(model_id)

    def terms(self, call: Call, lane: Lane, model_id: str,
              settings: LendingSettings) -> tuple[tuple[float, ...], int]:
        """The work of ``call`` for ``model_id`` (its :func:`~routerd.wire.lending.lane_key`), with
        the ``scheduling_context_reserve`` of ``settings``."""
        profile = None if lane == "image" else self._profiles.get(model_id)
        return work_terms(call, lane, profile, settings.scheduling_context_reserve)


def queue_own(queue: LaneQueue, call: Call, model: ModelConfig, model_id: str, now_ms: int,
              work: tuple[tuple[float, ...], int], weights: Mapping[str, float], *,
              reclaim: Collection[str] = (), also_ahead: int = 0, image: bool = False) -> Effects:
    """Queue an own request (``work``: :meth:`WorkHints.terms`' terms and context; ``weights``: the
    named keys', an unknown name weighing 1), handing back ``reclaim`` and counting ``also_ahead``
    (:meth:`LaneQueue.arrive`)."""
    terms, context = work
    return queue.arrive(call.request_id, model_id, now_ms, work=terms, context=context,
                        streaming=call.stream, reclaim=reclaim, image=image, also_ahead=also_ahead,
                        priority=RANK[call.priority], key_name=call.key_name,
                        weight=weights.get(call.key_name, 1.0),
                        concurrency=concurrency(model))


def refuse_when_full(queue: LaneQueue, model: ModelConfig, model_id: str, public_id: str, limit: int,
                     queued_in_backend: Mapping[str, int]) -> None:
    """Refuse (429 ``queue_full``) an own request that would wait behind ``limit``
    (``limits.max_queued_per_model``; 0: none) others of its model, held here or admitted to the
    backend but still waiting for its slot (``queued_in_backend``, by local ID; borrowed work is
    bounded by leases)."""
    if not limit:
        return
    waiting = queue.waiting_native(model_id) + queued_in_backend.get(model.local_id, 0)
    if waiting >= limit:
        raise queue_full(public_id, waiting, limit)


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


__all__ = ["WorkHints", "entry_image", "images_for_new_owners", "queue_own", "refuse_when_full"]
