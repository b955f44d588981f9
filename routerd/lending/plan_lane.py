"""One lane of the lease plan, worked on arrays (issue 24: a plan for 64 nodes x 32 owners x 4
helpers, 8,192 owner/helper pairs, aims at 5 ms; ``benchmarks/plan_bench.py``).

The rules are those of ``routerd.lending.planner``'s docstring.  Python reads each owner and each
helper once (lookups and attributes; :func:`_weigh_owners`, :func:`_weigh_helpers`) into rows of
numbers; numpy then applies the gates and prices to every pair at once (:func:`_judge`); only the
claims, where a helper node serves one owner per lane and owners go biggest backlog first, walk
the candidates in order (:func:`_claim`).  A pair is never an object: its row goes to the plan's
:class:`~routerd.wire.plan_rows.PlanRows` as columns.  ``tests/unit/test_lending_planner_equivalence.py``
holds the decisions equal to the planner before this rewrite (``tests/unit/planner_reference.py``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from operator import itemgetter
from typing import TypeVar

import attrs
import numpy as np
import numpy.typing as npt

from routerd.config.lending import LendingSettings
from routerd.lending.links import LinkSet, PairIndex
from routerd.lending.plan_inputs import UNLOADED_PROBE_FACTOR, FactKey, ModelFacts, NodeView
from routerd.lending.pricing import predict, predict_queue
from routerd.wire.lending import (
    LANE_SECTION,
    Lane,
    Lease,
    Link,
    Outcome,
    Reason,
    ServiceSource,
    Trigger,
)
from routerd.wire.plan_rows import Gathered, Head, PlanRows, Tail
from routerd.wire.status import RuntimeStatus

Floats = npt.NDArray[np.float64]
Flags = npt.NDArray[np.bool_]
Ints = npt.NDArray[np.intp]
Codes = npt.NDArray[np.int64]

# Skip reasons as small codes while a plan works on arrays (0: none); names in _REASON_NAMES.
(
    _NO_REASON, _MODEL_INELIGIBLE, _NOT_ACCEPTING, _CLAIMED, _LOAD_FORBIDDEN, _CONTEXT_TOO_SMALL, _BUSY,
    _OWNER_UNPRICED, _SWITCH_UNPRICED, _RESTORE_UNPRICED, _COST_REJECTED, _OUTRANKED, _HELPER_UNAVAILABLE,
) = range(13)  # fmt: skip
_REASON_NAMES: tuple[Reason | None, ...] = (
    None, "model_ineligible", "helper_not_accepting", "helper_claimed", "load_forbidden",
    "context_too_small", "helper_recently_busy", "owner_unpriced", "switch_unpriced", "restore_unpriced",
    "cost_rejected", "outranked", "helper_unavailable",
)  # fmt: skip
# Outcomes as codes.
_OUTCOME_NAMES: tuple[Outcome, ...] = ("skipped", "granted", "probe")
_GRANTED, _PROBE = 1, 2
# Service sources as codes: none, the helper's own fit, the owner's job time.
_SOURCE_NAMES: tuple[ServiceSource | None, ...] = (None, "helper", "owner_fallback")

# Columns of an owner's numbers: -backlog work, -backlog count (the planning order), keep, owner
# job (0 when unpriced), both priced, job priced, number of work terms, mean work of the first term,
# ineligible; in the text lane also the mean work of the second term, multimodal, mean context and
# whether the context gates.
_O_WORK, _O_COUNT, _O_KEEP, _O_JOB, _O_PRICED, _O_JOB_OK, _O_WIDTH, _O_W0, _O_INELIGIBLE, _O_W1, \
    _O_MULTIMODAL, _O_CONTEXT, _O_CONTEXT_GATE = range(13)
# Columns of a helper's numbers: weighable (node reachable, model available), ineligible, loaded,
# switch and restore ms (0 when unpriced), switch/restore unpriced, number of slopes (-1: no fit),
# uniform fit, base, first slope; in the text lane also the second slope, the context window and
# multimodal.
_S_LIVE, _S_INELIGIBLE, _S_LOADED, _S_SWITCH, _S_RESTORE, _S_UNPRICED, _S_SLOPES, _S_UNIFORM, _S_BASE, \
    _S_SLOPE0, _S_SLOPE1, _S_CONTEXT, _S_MULTIMODAL = range(13)
_DEAD_SIDE = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
_DEAD_SIDE_IMAGE = _DEAD_SIDE[:_S_SLOPE1]

T = TypeVar("T")


def _take(values: Sequence[T], at: list[int]) -> Sequence[T]:
    """``[values[i] for i in at]`` without a Python loop."""
    if len(at) > 1:
        return itemgetter(*at)(values)  # type: ignore[no-any-return]
    return [values[i] for i in at]


class _Views:
    """Each node's :class:`NodeView` for one lane's plan, built the first time it is asked for
    (None: the node is unreachable)."""

    __slots__ = ("statuses", "lane", "section", "built")

    def __init__(self, statuses: Mapping[str, RuntimeStatus], lane: Lane) -> None:
        self.statuses = statuses
        self.lane = lane
        self.section = LANE_SECTION[lane]
        self.built: dict[str, NodeView | None] = {}

    def __call__(self, node_id: str) -> NodeView | None:
        try:
            return self.built[node_id]
        except KeyError:
            status = self.statuses.get(node_id)
            view = self.built[node_id] = None if status is None else NodeView(status, self.lane, self.section)
            return view


@attrs.define
class _Owners:
    """The owners a lane's plan weighs (reachable, model available, work waiting), in index order."""

    #: Positions in ``PairIndex.owners``.
    positions: list[int]
    #: One row per owner, the ``_O_*`` columns.
    numbers: Floats
    #: The owner's part of its rows.
    heads: list[Head]

    def job(self, owner: int) -> float | None:
        """The owner's job time (None when unpriced)."""
        numbers = self.numbers[owner]
        return float(numbers[_O_JOB]) if numbers[_O_JOB_OK] else None


def _weigh_owners(
    lane: Lane, trigger: Trigger, index: PairIndex, facts: Mapping[FactKey, ModelFacts],
    only_owners: Collection[FactKey] | None, views: _Views, rows: PlanRows,
) -> _Owners | None:
    """Read every owner once (keep and owner job priced here); the pairs of an unreachable or
    unavailable owner go to ``rows`` as ``owner_unavailable``.  None when no owner has work."""
    text = lane == "text"
    gone: list[tuple[Head, Link]] = []
    positions: list[int] = []
    numbers: list[tuple[float, ...]] = []
    heads: list[Head] = []
    last_node = ""
    view: NodeView | None = None
    for position, (_owner, key, links) in enumerate(index.owners):
        if only_owners is not None and key not in only_owners:
            continue
        _lane, node_id, model_id = key
        if node_id != last_node:  # owners come node by node
            last_node = node_id
            view = views(node_id)
        owner_facts = facts.get(key)
        if view is None or owner_facts is None or not owner_facts.eligible:
            # unreachable, or its model disabled or gone: every pair of it says so
            head: Head = (trigger, lane, node_id, model_id, 0, 0, 0.0, 0.0)
            gone.extend((head, link) for link in links)
            continue
        stat = view.queue.get(model_id)
        if stat is None or stat.pending_count <= 0:
            continue
        count = stat.pending_count
        backlog = stat.backlog_count
        pending_work = stat.pending_work
        width = len(pending_work)
        fit = view.fits.get(model_id)
        keep: float | None
        owner_job: float | None
        if (
            width == 1 and not text and fit is not None and fit.uniform_work is None
            and len(fit.slopes_ms) == 1 and backlog > 0 and len(stat.backlog_work) == 1
        ):  # fmt: skip
            # predict_queue and predict for the common one-term linear fit, inline
            w0 = pending_work[0] / count
            w1 = 0.0
            base, slope = fit.base_ms, fit.slopes_ms[0]
            owner_job = base + slope * w0 if w0 > 0 else base
            backlog_work = stat.backlog_work[0]
            keep = backlog * base + slope * backlog_work if backlog_work > 0 else backlog * base
            work = -backlog_work
        else:
            work = -sum(stat.backlog_work)
            mean_work = [w / count for w in pending_work]
            w0 = mean_work[0] if width >= 1 else 0.0
            w1 = mean_work[1] if width >= 2 else 0.0
            keep = predict_queue(fit, backlog, stat.backlog_work)
            owner_job = predict(fit, mean_work)
            if text and not any(w > 0 for w in pending_work):
                keep = owner_job = None  # no token profile: the queue has no size to price
        keep_ms = keep or 0.0
        owner_job_ms = owner_job or 0.0
        row: tuple[float, ...] = (
            work, -backlog, keep_ms, owner_job_ms,
            keep is not None and owner_job is not None, owner_job is not None, width, w0,
            owner_facts.ineligible != "",
        )  # fmt: skip
        if text:
            mean_context = stat.pending_context / count
            row += (w1, owner_facts.multimodal, mean_context, mean_context > 0)
        positions.append(position)
        numbers.append(row)
        heads.append((trigger, lane, node_id, model_id, count, backlog, keep_ms, owner_job_ms))
    if gone:
        many = len(gone)
        rows.add((
            [head for head, _link in gone], [_no_prices(link) for _head, link in gone], ["skipped"] * many,
            ["owner_unavailable"] * many, [0.0] * many, [None] * many, [0] * many,
        ))  # fmt: skip
    if not positions:
        return None
    return _Owners(positions, np.array(numbers, dtype=np.float64), heads)


@attrs.define
class _Pairs:
    """Every pair of the planned owners: owners in planning order, each one's links in listing
    order.  Per pair: its position in ``PairIndex.links``, its owner (in :class:`_Owners`), that
    owner's rank in planning order, its helper's position in ``PairIndex.helpers`` and node."""

    at: Ints
    owner: Ints
    rank: Ints
    helper: Ints
    node: Ints
    owners: int

    @property
    def count(self) -> int:
        return len(self.at)


def _lay_out(index: PairIndex, owners: _Owners) -> _Pairs:
    """Biggest backlog first (work, then count), then node id and model id (index order)."""
    by_count = np.argsort(owners.numbers[:, _O_COUNT], kind="stable")
    order = by_count[np.argsort(owners.numbers[by_count, _O_WORK], kind="stable")]
    planned = np.array(owners.positions, dtype=np.intp)[order]
    first = index.owner_first[planned]
    lengths = index.owner_first[planned + 1] - first
    count = int(lengths.sum())
    at = np.repeat(first - (np.cumsum(lengths) - lengths), lengths) + np.arange(count)
    helper = index.pair_helper[at]
    return _Pairs(at, np.repeat(order, lengths), np.repeat(np.arange(len(order)), lengths), helper,
                  index.helper_node[helper], len(order))


@attrs.define
class _Helpers:
    """The helpers the planned owners reach, each weighed once (what does not depend on the owner).

    ``slot`` maps a position in ``PairIndex.helpers`` to a reached helper.  Per reached helper: its
    ``_S_*`` numbers (one column per number), the helper's part of its rows, and figures from them
    and its node: idle ms, switch + restore, its own gate, recently busy, probe-ready, when it will
    be."""

    slot: Ints
    numbers: Floats
    tails: list[Tail]
    idle: Floats
    total: Floats
    gate: Codes
    busy: Flags
    ready: Flags
    due_at: Floats


def _weigh_helpers(
    lane: Lane, index: PairIndex, reached: Ints, facts: Mapping[FactKey, ModelFacts], views: _Views,
    probe_idle_ms: float, now_ms: int,
) -> _Helpers:
    text = lane == "text"
    mask = np.zeros(len(index.helpers), dtype=np.bool_)
    mask[reached] = True
    needed = np.flatnonzero(mask)
    slot = np.empty(len(index.helpers), dtype=np.intp)
    slot[needed] = np.arange(len(needed))
    at = needed.tolist()
    numbers: list[tuple[float, ...]] = []
    tails: list[Tail] = []
    last_node = ""
    view: NodeView | None = None
    for key in _take(index.helper_keys, at):
        _lane, node_id, model_id = key
        if node_id != last_node:  # helpers come node by node
            last_node = node_id
            view = views(node_id)
        helper_facts = facts.get(key)
        if view is None or helper_facts is None or not helper_facts.eligible:
            # its node unreachable, or its model disabled or gone
            numbers.append(_DEAD_SIDE if text else _DEAD_SIDE_IMAGE)
            tails.append((node_id, model_id, 0.0, 0.0, 0))
            continue
        config = helper_facts.config_filename
        switch: float | None
        restore: float | None
        if config and view.active == config:
            loaded = True
            switch = restore = 0.0
        else:
            loaded = False
            switch = view.loads.get(config)
            restore = view.restore(config) if config in view.displaceable else view.restore_all
        unpriced = _NO_REASON
        if switch is None:
            unpriced = _SWITCH_UNPRICED
        elif restore is None:
            unpriced = _RESTORE_UNPRICED
        fit = view.fits.get(model_id)
        slopes_n, uniform, base, s0, s1 = -1, False, 0.0, 0.0, 0.0
        if fit is not None:
            slopes = fit.slopes_ms
            slopes_n, uniform = len(slopes), fit.uniform_work is not None
            if not uniform:
                base = fit.base_ms
                s0 = slopes[0] if slopes_n >= 1 else 0.0
                s1 = slopes[1] if slopes_n >= 2 else 0.0
        row: tuple[float, ...] = (
            1.0, helper_facts.ineligible != "", loaded, switch or 0.0, restore or 0.0, unpriced, slopes_n,
            uniform, base, s0,
        )  # fmt: skip
        if text:
            row += (s1, helper_facts.context, helper_facts.multimodal)
        numbers.append(row)
        tails.append((node_id, model_id, switch or 0.0, restore or 0.0, view.idle_ms))

    sides = np.array(numbers, dtype=np.float64).T
    node_views = [views.built.get(node_id) for node_id in index.nodes]
    node_of = index.helper_node[needed]
    idle = np.array([0 if v is None else v.idle_ms for v in node_views], dtype=np.float64)[node_of]
    accepting = np.array([v is not None and v.accepting for v in node_views], dtype=np.bool_)[node_of]
    loaded_s = sides[_S_LOADED] > 0
    priced = sides[_S_UNPRICED] == _NO_REASON
    total = sides[_S_SWITCH] + sides[_S_RESTORE]  # switch + restore, when both are priced
    bar = np.where(loaded_s, probe_idle_ms, UNLOADED_PROBE_FACTOR * probe_idle_ms)
    return _Helpers(
        slot=slot,
        numbers=sides,
        tails=tails,
        idle=idle,
        total=total,
        gate=np.where(
            sides[_S_INELIGIBLE] > 0, _MODEL_INELIGIBLE, np.where(accepting, _NO_REASON, _NOT_ACCEPTING)
        ),
        # unloaded and busy with its own work more recently than the switch and the way back take
        busy=~loaded_s & priced & (idle < total),
        ready=idle >= bar,
        due_at=(now_ms + bar) - idle,
    )


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
    lane: Lane, index: PairIndex, owners: _Owners, pairs: _Pairs, helpers: _Helpers, views: _Views
) -> _Judged:
    text = lane == "text"
    ps = helpers.slot[pairs.helper]
    po = pairs.owner
    side = np.take(helpers.numbers, ps, axis=1)
    own = np.take(owners.numbers.T, po, axis=1)
    live = side[_S_LIVE] > 0
    owner_gate = own[_O_INELIGIBLE] > 0
    if text:
        owner_gate |= side[_S_MULTIMODAL] != own[_O_MULTIMODAL]
    before = np.where(owner_gate, _MODEL_INELIGIBLE, helpers.gate[ps])
    after = np.where((side[_S_LOADED] == 0) & ~index.pair_load[pairs.at], _LOAD_FORBIDDEN, _NO_REASON)
    if text:
        short = (own[_O_CONTEXT_GATE] > 0) & (side[_S_CONTEXT] < own[_O_CONTEXT])
        after = np.where((after == _NO_REASON) & short, _CONTEXT_TOO_SMALL, after)
    # predict(helper fit, mean work): inline for a linear fit of the owner's width (<= 2 terms)
    width = own[_O_WIDTH]
    slopes = side[_S_SLOPES]
    uniform = side[_S_UNIFORM] > 0
    priced = (slopes == width) & ~uniform & (width <= 2)
    service = side[_S_BASE]
    with np.errstate(all="ignore"):
        w = own[_O_W0]
        service = np.where(priced & (width >= 1) & (w > 0), service + side[_S_SLOPE0] * w, service)
        if text:
            w = own[_O_W1]
            service = np.where(priced & (width >= 2) & (w > 0), service + side[_S_SLOPE1] * w, service)
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
    job_ok = own[_O_JOB_OK] > 0
    service = np.where(priced, service, own[_O_JOB])
    source = np.where(priced, 1, np.where(job_ok, 2, 0))
    total = helpers.total[ps] + service
    unpriced = side[_S_UNPRICED].astype(np.int64)
    cost = np.where(
        own[_O_PRICED] > 0,
        np.where(
            unpriced != _NO_REASON, unpriced, np.where(total >= own[_O_KEEP], _COST_REJECTED, _OUTRANKED)
        ),
        _OWNER_UNPRICED,
    )
    busy = helpers.busy[ps]
    open_ = live & (before == _NO_REASON) & (after == _NO_REASON) & ~busy  # eligible unless claimed
    payable = open_ & (cost == _OUTRANKED)
    ready = helpers.ready[ps]
    row_service = np.where(live & (priced | job_ok), service, 0.0)
    return _Judged(
        side=ps, live=live, before=before, after=after, busy=busy, ready=ready, service=row_service,
        priced=priced, source=np.where(live, source, 0), total=total, cost=cost, payable=payable,
        probing=open_ & ~payable & ready,
    )


def _claim(
    index: PairIndex, pairs: _Pairs, judged: _Judged, idle: Floats, claimed: set[str]
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
    leases: list[Lease],
    rows: PlanRows,
) -> float | None:
    """Plan one lane: its leases to ``leases``, its rows to ``rows``; the instant the next probe
    falls due (None: none waits for one).  ``claimed`` holds helper nodes taken already."""
    text = lane == "text"
    index = link_set.pair_index
    views = _Views(statuses, lane)
    owners = _weigh_owners(lane, trigger, index, facts, only_owners, views, rows)
    if owners is None:
        return None
    pairs = _lay_out(index, owners)
    helpers = _weigh_helpers(
        lane, index, pairs.helper, facts, views, settings.offload_probe_idle * 1000.0, now_ms
    )
    judged = _judge(lane, index, owners, pairs, helpers, views)
    chosen, taken_at = _claim(index, pairs, judged, helpers.idle, claimed)

    # reasons, in the order of the module docstring
    claimed_p = taken_at[pairs.node] < pairs.rank
    open_gates = (judged.before == _NO_REASON) & (judged.after == _NO_REASON)
    reason = np.where(
        judged.before != _NO_REASON,
        judged.before,
        np.where(claimed_p, _CLAIMED, np.where(judged.after != _NO_REASON, judged.after,
                                                np.where(judged.busy, _BUSY, judged.cost))),
    )
    reason = np.where(judged.live, reason, _HELPER_UNAVAILABLE)
    outcome = np.zeros(pairs.count, dtype=np.intp)  # codes into _OUTCOME_NAMES
    slots = [0] * pairs.count
    decided = np.zeros(len(owners.positions), dtype=np.bool_)
    ttl_ms = int(round(settings.scheduling_grant_ttl * 1000.0))
    for p in chosen:
        o = int(pairs.owner[p])
        decided[o] = True
        probe = not judged.payable[p]
        head, owner_job = owners.heads[o], owners.job(o)
        service = float(judged.service[p])
        if probe:
            slots[p] = settings.offload_probe_helper_slots
        else:
            reason[p] = _NO_REASON
            assert owner_job is not None
            if service <= owner_job:
                slots[p] = settings.offload_faster_helper_slots
            else:
                slots[p] = settings.offload_slower_helper_slots
        outcome[p] = _PROBE if probe else _GRANTED
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
        rows.add((
            Gathered(heads, head_at), Gathered(helpers.tails, judged.side), Gathered(_OUTCOME_NAMES, outcome),
            Gathered(_REASON_NAMES, reason), judged.service.tolist(), Gathered(_SOURCE_NAMES, judged.source),
            slots,
        ))  # fmt: skip
        return due
    # the owner's counts, no prices, on the row of a pair it cannot weigh
    heads = [*heads, *(head[:6] + (0.0, 0.0) for head in heads)]
    head_at = np.where(judged.live, head_at, head_at + len(owners.heads))
    ranked = np.argsort(pairs.rank * 2 + judged.live, kind="stable")
    rows.add((
        Gathered(heads, head_at[ranked]), Gathered(helpers.tails, judged.side[ranked]),
        Gathered(_OUTCOME_NAMES, outcome[ranked]), Gathered(_REASON_NAMES, reason[ranked]),
        judged.service[ranked].tolist(), Gathered(_SOURCE_NAMES, judged.source[ranked]),
        _take(slots, ranked.tolist()),
    ))  # fmt: skip
    return due


def _no_prices(link: Link) -> Tail:
    """The helper's part of the row of a pair the master cannot weigh."""
    helper = link.helper
    return (helper.node_id, helper.model_id, 0.0, 0.0, 0)


__all__ = ["plan_lane"]
