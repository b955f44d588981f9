"""One lane of the lease plan, judged on arrays: a plan for 64 nodes x 32 owners x 4 helpers,
8,192 owner/helper pairs, aims at 5 ms (``benchmarks/plan_bench.py``).

The rules are those of ``routerd.lending.planner``'s docstring.  The owners and helpers are read
once into columns of numbers (:mod:`routerd.lending.plan_columns`); numpy then applies the gates
and prices to every pair at once (:func:`_judge`); only the claims, where a helper node serves one
owner per lane and owners go biggest backlog first, walk the candidates in order (:func:`_claim`).
A pair is never an object: :func:`plan_lane` returns a :class:`LanePlan`, its leases and its rows
as :class:`~routerd.wire.plan_rows.PlanRows` chunks of columns, and changes none of its arguments.
``tests/unit/test_lending_planner_equivalence.py`` holds the decisions equal to the planner before
the arrays (``tests/unit/planner_reference.py``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import attrs
import numpy as np

from routerd.config.lending import LendingSettings
from routerd.lending.links import LinkSet, PairIndex
from routerd.lending.plan_columns import (
    BUSY,
    CLAIMED,
    CONTEXT_TOO_SMALL,
    COST_REJECTED,
    GRANTED,
    HELPER_UNAVAILABLE,
    LOAD_FORBIDDEN,
    MODEL_INELIGIBLE,
    NO_REASON,
    O_CONTEXT,
    O_CONTEXT_GATE,
    O_INELIGIBLE,
    O_JOB,
    O_JOB_OK,
    O_KEEP,
    O_MULTIMODAL,
    O_PRICED,
    O_W0,
    O_W1,
    O_WIDTH,
    OUTCOME_NAMES,
    OUTRANKED,
    OWNER_UNPRICED,
    PROBE,
    REASON_NAMES,
    S_BASE,
    S_CONTEXT,
    S_LIVE,
    S_LOADED,
    S_MULTIMODAL,
    S_SLOPE0,
    S_SLOPE1,
    S_SLOPES,
    S_UNIFORM,
    S_UNPRICED,
    SOURCE_NAMES,
    Codes,
    Flags,
    Floats,
    Helpers,
    Ints,
    Owners,
    Pairs,
    Views,
    lay_out,
    take,
    weigh_helpers,
    weigh_owners,
)
from routerd.lending.plan_inputs import FactKey, ModelFacts
from routerd.lending.pricing import predict
from routerd.wire.lending import Lane, Lease, Trigger
from routerd.wire.plan_rows import Chunk, Gathered, Head
from routerd.wire.status import RuntimeStatus


@attrs.frozen
class LanePlan:
    """One lane's plan: its leases, its rows (chunks of columns, in order) and the instant the next
    probe falls due (None: none waits for one)."""

    leases: list[Lease]
    chunks: tuple[Chunk, ...]
    due: float | None


@attrs.define
class _Judged:
    """Every pair weighed before claims: ``before`` = the gates that come before a claim (the
    owner's, then the helper's own), ``after`` = those after it (the link, the context); the
    service time and its source; switch + restore + service; the reason a priced pair is passed
    over (``cost``: owner unpriced, move unpriced, cost rejected, or outranked when payable)."""

    side: Ints
    live: Flags
    before: Codes
    after: Codes
    busy: Flags
    ready: Flags
    service: Floats
    priced: Flags
    source: Codes
    total: Floats
    cost: Codes
    payable: Flags
    probing: Flags


def _judge(
    lane: Lane, index: PairIndex, owners: Owners, pairs: Pairs, helpers: Helpers, views: Views
) -> _Judged:
    text = lane == "text"
    ps = helpers.slot[pairs.helper]
    po = pairs.owner
    side = np.take(helpers.numbers, ps, axis=1)
    own = np.take(owners.numbers.T, po, axis=1)
    live = side[S_LIVE] > 0
    owner_gate = own[O_INELIGIBLE] > 0
    if text:
        owner_gate |= side[S_MULTIMODAL] != own[O_MULTIMODAL]
    before = np.where(owner_gate, MODEL_INELIGIBLE, helpers.gate[ps])
    after = np.where((side[S_LOADED] == 0) & ~index.pair_load[pairs.at], LOAD_FORBIDDEN, NO_REASON)
    if text:
        short = (own[O_CONTEXT_GATE] > 0) & (side[S_CONTEXT] < own[O_CONTEXT])
        after = np.where((after == NO_REASON) & short, CONTEXT_TOO_SMALL, after)
    # predict(helper fit, mean work): inline for a linear fit of the owner's width (<= 2 terms)
    width = own[O_WIDTH]
    slopes = side[S_SLOPES]
    uniform = side[S_UNIFORM] > 0
    priced = (slopes == width) & ~uniform & (width <= 2)
    service = side[S_BASE]
    with np.errstate(all="ignore"):
        w = own[O_W0]
        service = np.where(priced & (width >= 1) & (w > 0), service + side[S_SLOPE0] * w, service)
        if text:
            w = own[O_W1]
            service = np.where(priced & (width >= 2) & (w > 0), service + side[S_SLOPE1] * w, service)
    for p in np.flatnonzero((slopes == width) & (uniform | (width > 2))).tolist():  # the rest: predict
        owner = index.owners[owners.positions[po[p]]][0]
        owner_view = views(owner.node_id)
        stat = owner_view.queue[owner.model_id] if owner_view is not None else None
        assert stat is not None  # a planned owner's queue
        helper = index.helpers[pairs.helper[p]]
        view = views(helper.node_id)
        fit = None if view is None else view.fits.get(helper.model_id)
        value = predict(fit, [w / stat.pending_count for w in stat.pending_work])
        if value is not None:
            service[p], priced[p] = value, True
    # None still only when the owner has no fit either: the owner is unpriced and ``owner_unpriced``
    # is reported first, so ``service_unpriced`` (kept in the enumeration) is never produced.
    job_ok = own[O_JOB_OK] > 0
    service = np.where(priced, service, own[O_JOB])
    source = np.where(priced, 1, np.where(job_ok, 2, 0))
    total = helpers.total[ps] + service
    unpriced = side[S_UNPRICED].astype(np.int64)
    cost = np.where(
        own[O_PRICED] > 0,
        np.where(
            unpriced != NO_REASON, unpriced, np.where(total >= own[O_KEEP], COST_REJECTED, OUTRANKED)
        ),
        OWNER_UNPRICED,
    )
    busy = helpers.busy[ps]
    open_ = live & (before == NO_REASON) & (after == NO_REASON) & ~busy  # eligible unless claimed
    payable = open_ & (cost == OUTRANKED)
    ready = helpers.ready[ps]
    row_service = np.where(live & (priced | job_ok), service, 0.0)
    return _Judged(
        side=ps, live=live, before=before, after=after, busy=busy, ready=ready, service=row_service,
        priced=priced, source=np.where(live, source, 0), total=total, cost=cost, payable=payable,
        probing=open_ & ~payable & ready,
    )


def _claim(
    index: PairIndex, pairs: Pairs, judged: _Judged, idle: Floats, claimed: set[str]
) -> tuple[list[int], Ints]:
    """Each owner in turn takes its first candidate on a helper node not yet claimed: the payable
    ones first (cheapest, then node id and model id), then the probe-ready ones (longest idle, then
    node id and model id).  The pairs chosen, and the rank of the owner that claimed each node
    (-1: claimed before the plan, ``pairs.owners``: never)."""
    candidates = np.flatnonzero(judged.payable | judged.probing)
    by_cost = judged.payable[candidates]
    cost_or_idle = np.where(by_cost, judged.total[candidates], -idle[judged.side[candidates]])
    candidates = candidates[
        _preference(
            pairs.rank[candidates], by_cost, cost_or_idle, pairs.helper[candidates], len(index.helpers)
        )
    ]
    taken_at = np.full(len(index.nodes), pairs.owners, dtype=np.intp)
    if claimed:
        taken_at[[n for n, node_id in enumerate(index.nodes) if node_id in claimed]] = -1
    taken = bytearray((taken_at < pairs.owners).tobytes())
    chosen: list[int] = []
    last = -1
    for p, rank, n in zip(
        candidates.tolist(), pairs.rank[candidates].tolist(), pairs.node[candidates].tolist(), strict=True
    ):
        if rank != last and not taken[n]:
            last = rank
            taken[n] = 1
            taken_at[n] = rank
            chosen.append(p)
    return chosen, taken_at


def _preference(rank: Ints, first: Flags, key: Floats, helper: Ints, helpers: int) -> Ints:
    """The order of candidates by owner rank, then ``first`` ones before the others, then ``key``,
    then helper position: what ``np.lexsort`` would give, but as one sort of unique integers (four
    stable sorts of 6,000 candidates take 0.8 ms, this a quarter of that)."""
    if len(key) == 0:
        return np.zeros(0, dtype=np.intp)
    by_key = np.argsort(key)
    sorted_key = key[by_key]
    dense = np.empty(len(key), dtype=np.int64)  # equal keys get equal places
    dense[by_key] = np.cumsum(np.concatenate(([0], sorted_key[1:] != sorted_key[:-1])))
    group = rank.astype(np.int64) * 2 + ~first
    # an owner links a helper once, so (rank, group, key place, helper) is unique
    combined = (group * (int(dense[by_key[-1]]) + 1) + dense) * helpers + helper
    return np.argsort(combined).astype(np.intp)


def plan_lane(
    lane: Lane,
    trigger: Trigger,
    now_ms: int,
    link_set: LinkSet,
    statuses: Mapping[str, RuntimeStatus],
    settings: LendingSettings,
    facts: Mapping[FactKey, ModelFacts],
    claimed: set[str],
    only_owners: Collection[FactKey] | None,
) -> LanePlan:
    """Plan one lane: its leases, its rows and the instant the next probe falls due.
    ``claimed`` holds helper nodes taken already."""
    text = lane == "text"
    index = link_set.pair_index
    views = Views(statuses, lane)
    owners, unweighed = weigh_owners(lane, trigger, index, facts, only_owners, views)
    chunks = () if unweighed is None else (unweighed,)
    if owners is None:
        return LanePlan([], chunks, None)
    pairs = lay_out(index, owners)
    helpers = weigh_helpers(
        lane, index, pairs.helper, facts, views, settings.offload_probe_idle * 1000.0, now_ms
    )
    judged = _judge(lane, index, owners, pairs, helpers, views)
    chosen, taken_at = _claim(index, pairs, judged, helpers.idle, claimed)

    # reasons, in the order of the module docstring
    claimed_p = taken_at[pairs.node] < pairs.rank
    open_gates = (judged.before == NO_REASON) & (judged.after == NO_REASON)
    reason = np.where(
        judged.before != NO_REASON,
        judged.before,
        np.where(claimed_p, CLAIMED, np.where(judged.after != NO_REASON, judged.after,
                                                np.where(judged.busy, BUSY, judged.cost))),
    )
    reason = np.where(judged.live, reason, HELPER_UNAVAILABLE)
    outcome = np.zeros(pairs.count, dtype=np.intp)  # codes into OUTCOME_NAMES
    slots = [0] * pairs.count
    decided = np.zeros(len(owners.positions), dtype=np.bool_)
    ttl_ms = int(round(settings.scheduling_grant_ttl * 1000.0))
    leases: list[Lease] = []
    for p in chosen:
        o = int(pairs.owner[p])
        decided[o] = True
        probe = not judged.payable[p]
        head, owner_job = owners.heads[o], owners.job(o)
        service = float(judged.service[p])
        if probe:
            slots[p] = settings.offload_probe_helper_slots
        else:
            reason[p] = NO_REASON
            assert owner_job is not None
            if service <= owner_job:
                slots[p] = settings.offload_faster_helper_slots
            else:
                slots[p] = settings.offload_slower_helper_slots
        outcome[p] = PROBE if probe else GRANTED
        link = index.links[pairs.at[p]]
        helper_facts = facts[index.helper_keys[pairs.helper[p]]]
        leases.append(
            Lease(
                lane=lane,
                owner_node_id=head[2],
                owner_model_id=head[3],
                helper_node_id=link.helper.node_id,
                helper_model_id=link.helper.model_id,
                load_helper_model=link.load_if_unloaded,
                restore_helper_model=link.restore_after_borrow,
                helper_slots=slots[p],
                probe=probe,
                ttl_ms=ttl_ms,
                owner_job_ms=0.0 if probe or owner_job is None else owner_job,
                helper_switch_ms=0.0 if probe else helpers.tails[judged.side[p]][2],
                helper_service_ms=0.0 if probe else service,
                helper_context=helper_facts.context if text else 0,
                helper_multimodal=helper_facts.multimodal,
            )
        )
    # Undecided owners probe again when their first eligible helper will have idled long enough.
    waiting = judged.live & open_gates & ~claimed_p & ~judged.ready & ~decided[pairs.owner]
    due = float(helpers.due_at[judged.side][waiting].min()) if waiting.any() else None

    # rows: per owner in planning order, the pairs it cannot weigh first, each in listing order;
    # columns of shared values are gathered only when the rows are read (Gathered)
    heads: Sequence[Head] = owners.heads
    head_at = pairs.owner
    if judged.live.all():
        return LanePlan(leases, (*chunks, (
            Gathered(heads, head_at), Gathered(helpers.tails, judged.side), Gathered(OUTCOME_NAMES, outcome),
            Gathered(REASON_NAMES, reason), judged.service.tolist(), Gathered(SOURCE_NAMES, judged.source),
            slots,
        )), due)  # fmt: skip
    # the owner's counts, no prices, on the row of a pair it cannot weigh
    heads = [*heads, *(head[:6] + (0.0, 0.0) for head in heads)]
    head_at = np.where(judged.live, head_at, head_at + len(owners.heads))
    ranked = np.argsort(pairs.rank * 2 + judged.live, kind="stable")
    return LanePlan(leases, (*chunks, (
        Gathered(heads, head_at[ranked]), Gathered(helpers.tails, judged.side[ranked]),
        Gathered(OUTCOME_NAMES, outcome[ranked]), Gathered(REASON_NAMES, reason[ranked]),
        judged.service[ranked].tolist(), Gathered(SOURCE_NAMES, judged.source[ranked]),
        take(slots, ranked.tolist()),
    )), due)  # fmt: skip


__all__ = ["LanePlan", "plan_lane"]
