"""The load of each replica of one public ID, in predicted seconds from the nodes' cost fits
(``routing.replica_choice``: ``least_loaded`` and ``affinity``).

A replica's *load* is its queued plus running work, in predicted seconds: what the master holds
reserved on it now (every request it routed there and has not seen end, each priced when it was
routed: exact and current), plus the work its node had besides the master's when it last reported:
the runtime status's lane queue for that model (``backlog_count`` and ``backlog_work``, priced with
:func:`~routerd.lending.pricing.predict_queue`) less what the master held reserved there when that
status was taken (never below 0).  The report counts the master's requests too, and is as old as
the master's latest status poll: adding it whole would count the master's work twice and keep a
replica as loaded as it was at the poll.

A request's *cost* on a replica is :func:`~routerd.lending.pricing.predict` of its work terms
(:func:`~routerd.lending.pricing.work_terms`, with the replica's token profile) under the replica's
own fit.  A replica without a fit that prices this work is priced with the first replica (by
``node:local``) whose fit does, as a lending helper without a fit is priced with its owner's; when
no replica's fit prices it, every request (queued, running or this one) counts
:data:`UNPRICED_S`, so the loads compare request counts until the first fit exists.  Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from routerd.lending.pricing import predict, predict_queue, work_terms
from routerd.registry.replica_choice import Candidate
from routerd.registry.replicas import replica_order
from routerd.routing.call import Call
from routerd.wire.lending import LANE_SECTION, Costs, Lane, ModelCost, lane_key
from routerd.wire.records import ModelRecord
from routerd.wire.status import RuntimeStatus

__all__ = ["UNPRICED_S", "replica_candidates"]

#: Seconds one request counts while no replica of its model has a fit that prices it.
UNPRICED_S = 1.0

_NO_COSTS = Costs()


def _costs(statuses: Mapping[str, RuntimeStatus], record: ModelRecord) -> Costs:
    status = statuses.get(record.node_id)
    return status.costs if status is not None else _NO_COSTS


def _fit(costs: Costs, lane: Lane, model_id: str) -> ModelCost | None:
    return costs.model(model_id, LANE_SECTION[lane])


def replica_candidates(call: Call, lane: Lane, records: Sequence[ModelRecord],
                       statuses: Mapping[str, RuntimeStatus], reserved: Callable[[ModelRecord], float],
                       reserved_then: Callable[[ModelRecord], float],
                       context_reserve: int) -> tuple[Candidate, ...]:
    """Each of ``records`` (the usable replicas) as a :class:`Candidate` for ``call``, in their order
    (see the module): ``reserved(record)`` is the predicted seconds the master holds reserved there now,
    ``reserved_then(record)`` what it held when ``statuses`` (the nodes' latest runtime statuses)
    were taken."""
    own: list[tuple[ModelCost | None, float | None]] = []  # each replica's fit and this request's cost
    for record in records:
        model_id = lane_key(lane, record)
        costs = _costs(statuses, record)
        fit = _fit(costs, lane, model_id)
        terms, _context = work_terms(call, lane, costs.token_profile(model_id), context_reserve)
        ms = predict(fit, terms)
        own.append((fit, None if ms is None else ms / 1000.0))
    fallback = next((priced for _record, priced in sorted(zip(records, own, strict=True),
                                                          key=lambda pair: replica_order(pair[0]))
                     if priced[1] is not None), None)
    candidates: list[Candidate] = []
    for record, (fit, cost) in zip(records, own, strict=True):
        if cost is None and fallback is not None:
            fit, cost = fallback
        per_job = cost if cost is not None else UNPRICED_S
        queue_fit = fit if fallback is not None else None  # nothing priced: the queue is counted
        besides = _reported(statuses, record, lane, queue_fit, per_job) - reserved_then(record)
        candidates.append(Candidate(replica_order(record), reserved(record) + max(0.0, besides), per_job))
    return tuple(candidates)


def _reported(statuses: Mapping[str, RuntimeStatus], record: ModelRecord, lane: Lane,
              fit: ModelCost | None, per_job: float) -> float:
    """The predicted seconds of the queued and running work ``record``'s node last reported for
    it: priced by ``fit``, else each job at ``per_job``."""
    status = statuses.get(record.node_id)
    if status is None:
        return 0.0
    stat = status.lane(lane).stat(lane_key(lane, record))
    if stat is None or stat.backlog_count <= 0:
        return 0.0
    ms = predict_queue(fit, stat.backlog_count, stat.backlog_work)
    return ms / 1000.0 if ms is not None else stat.backlog_count * per_job
