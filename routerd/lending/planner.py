"""The master's lease plan (spec "Backlog lending" → "Probes"; lending reference §4.3–4.4).

:func:`plan` is pure: links, every node's status (queues, idle time, published cost fits), the
lending settings and per-model facts in; leases, the plan rows that explain them, and the instant
the next probe falls due out.  The caller replaces its lease book with the leases, writes the rows
to the decision log as they are, and re-plans with trigger ``probe_due`` at ``next_probe_due_ms``.

Per lane (image, then text), owners with waiting work are planned biggest backlog first.  For each
owner only the helpers it links to are considered:

* **keep** = the owner's fit over its whole backlog (the owner draining alone); **owner job** = the
  owner's fit at the mean waiting work.  The owner is priced when both are.
* Per helper: **switch** = 0 when the linked model is loaded, else the helper node's mean load time of
  its config; **restore** = 0 when loaded, else the load times of every config the switch would push
  out; **service** = the helper's own fit at the mean work (``helper``), else the owner job
  (``owner_fallback``).
* A pair whose owner node is unreachable or whose owner model is disabled or gone is skipped with
  ``owner_unavailable``; with a live owner holding work, a pair whose helper is so is skipped with
  ``helper_unavailable`` (one row per linked pair per plan, none left out silently).
* Skipped first, in this order: ``model_ineligible`` (the owner or the helper no longer meets
  text-lending eligibility, or one is multimodal and the other not: re-checked at every plan),
  ``helper_not_accepting``, ``helper_claimed`` (a helper node serves
  one owner per lane per plan), ``load_forbidden``, ``context_too_small``; after pricing
  ``helper_recently_busy`` (unloaded and idle from own work for less than switch + restore).
* Granted: the eligible, priced helper with the smallest switch + restore + service strictly below
  keep (ties: node id, model id), with the faster slot count when service ≤ owner job, else the
  slower one.
* Otherwise a probe: the longest-idle eligible helper whose own-work idle time reached
  ``offload_probe_idle`` (12 × that when it must switch models), with the probe slot count.
* Other helpers are skipped with the first of: their ineligibility, ``owner_unpriced``, their own
  unpriced reason, ``cost_rejected``, ``outranked``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from operator import itemgetter
from typing import TypeVar

import attrs
import numpy as np
import numpy.typing as npt

from routerd.config.lending import LendingSettings
from routerd.lending.links import LinkSet
from routerd.lending.pricing import predict, predict_queue
from routerd.wire.lending import (
    LANE_SECTION,
    LANES,
    Endpoint,
    Lane,
    Lease,
    Link,
    ModelCost,
    Outcome,
    PlanRow,
    QueueStat,
    Reason,
    ServiceSource,
    Trigger,
)
from routerd.wire.plan_rows import Head, PlanRows, Tail
from routerd.wire.status import RuntimeStatus

#: An unloaded helper waits this many times ``offload_probe_idle`` before a probe.
UNLOADED_PROBE_FACTOR = 12


@attrs.frozen
class ModelFacts:
    """What the registry knows of one model on one node, as the planner needs it.

    ``config_filename`` identifies the config the helper would load (compared with the lane's
    ``active_config`` and looked up in load costs).  ``context`` is the text context window.
    ``eligible`` is false for a model that is disabled or unavailable: its pairs are skipped with
    ``owner_unavailable`` or ``helper_unavailable``.  ``ineligible`` says why a (text) model no
    longer meets lending eligibility (empty when it does): its pairs are skipped with reason
    ``model_ineligible``.
    """

    config_filename: str
    context: int = 0
    eligible: bool = True
    multimodal: bool = False
    ineligible: str = ""


#: Key of :class:`ModelFacts`: lane, node id, lane-specific model id.
FactKey = tuple[Lane, str, str]


@attrs.frozen
class PlanResult:
    leases: list[Lease]
    #: One row per linked pair planned (a :class:`~routerd.wire.plan_rows.PlanRows` from :func:`plan`).
    rows: Sequence[PlanRow]
    next_probe_due_ms: int | None


class _NodeView:
    """One node's status as one lane's plan reads it (built once per node and lane a plan)."""

    __slots__ = ("accepting", "active", "idle_ms", "fits", "loads", "displaceable", "restore_all")

    def __init__(self, status: RuntimeStatus, lane: Lane, section: str) -> None:
        lane_status = status.lane(lane)
        self.accepting = lane_status.accepting_borrowed
        self.active = lane_status.active_config
        self.idle_ms = max(int(status.idle_for_ms), 0)
        #: The node's fits for this lane's section, by model id (a later duplicate wins).
        self.fits: dict[str, ModelCost] = {c.model_id: c for c in status.costs.models if c.section == section}
        self.loads: dict[str, float] = {c.config_filename: c.load_ms for c in status.costs.loads}
        #: Every config a load in this lane would push out (for a config not among them).
        self.displaceable = displaced_configs(status, lane, "")
        self.restore_all = self.restore_of(self.displaceable)

    def restore(self, config: str) -> float | None:
        """Load time of every config that loading ``config`` pushes out (None when one is unpriced)."""
        if config in self.displaceable:
            return self.restore_of([c for c in self.displaceable if c != config])
        return self.restore_all

    def restore_of(self, configs: list[str]) -> float | None:
        total = 0.0
        for config in configs:
            load = self.loads.get(config)
            if load is None:
                return None
            total += load
        return total



def displaced_configs(status: RuntimeStatus, lane: Lane, config_filename: str) -> list[str]:
    """Configs a helper would push out to load ``config_filename`` for ``lane``.

    The lane's own runtime always; with ``backend_mode == "kobold"`` one process serves every lane,
    so the other lane's config and the speech config go too.
    """
    found: list[str] = []
    candidates = [status.lane(lane).active_config]
    if status.backend_mode == "kobold":
        candidates += [status.lane(other).active_config for other in LANES if other != lane]
        candidates.append(status.active_stt_config)
    for config in candidates:
        if config and config != config_filename and config not in found:
            found.append(config)
    return found


def plan(
    trigger: Trigger,
    now_ms: int,
    links: Iterable[LinkSet],
    statuses: Mapping[str, RuntimeStatus],
    settings: LendingSettings,
    facts: Mapping[FactKey, ModelFacts],
    *,
    in_force: Iterable[Lease] = (),
    only_owners: Collection[tuple[Lane, str, str]] | None = None,
) -> PlanResult:
    """Plan every lane's leases.

    ``links`` holds one :class:`LinkSet` per lane (a lane without one has no leases).
    ``statuses`` maps node id → its latest status (unreachable nodes absent).  ``facts`` carries
    each linked model's config file name, context window and eligibility; a model without facts
    is left out.  By default every owner is planned and the result replaces the whole lease book.
    With ``only_owners`` (keys ``(lane, owner node, owner model)``) only those owners are planned,
    and the live leases in ``in_force`` of every other owner keep their helper nodes claimed.
    """
    sets: dict[Lane, LinkSet] = {link_set.lane: link_set for link_set in links}
    leases: list[Lease] = []
    rows = PlanRows()
    due: float | None = None
    forced = list(in_force)
    for lane in LANES:
        link_set = sets.get(lane)
        if link_set is None or not link_set.links:
            continue
        claimed: set[str] = set()
        if only_owners is not None:
            claimed = {
                lease.helper_node_id
                for lease in forced
                if lease.lane == lane and lease.key() not in only_owners
            }
        lane_due = _plan_lane(
            lane,
            trigger,
            now_ms,
            link_set,
            statuses,
            settings,
            facts,
            claimed,
            only_owners,
            leases,
            rows,
        )
        if lane_due is not None and (due is None or lane_due < due):
            due = lane_due
    return PlanResult(leases, rows, None if due is None else math.ceil(due))


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
# Service sources as codes: none, the helper's own fit, the owner's job time.
_SOURCE_NAMES: tuple[ServiceSource | None, ...] = (None, "helper", "owner_fallback")

# Columns of an owner's numbers: -backlog work, -backlog count (the planning order), keep, owner
# job (0 when unpriced), both priced, job priced, number of work terms, mean work of the first term,
# ineligible; in the text lane also the mean work of the second term, multimodal, mean context and
# whether the context gates.
_O_KEEP, _O_JOB, _O_PRICED, _O_JOB_OK, _O_WIDTH, _O_W0, _O_INELIGIBLE, _O_W1, _O_MULTIMODAL, _O_CONTEXT, \
    _O_CONTEXT_GATE = range(2, 13)
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


def _plan_lane(
    lane: Lane,
    trigger: Trigger,
    now_ms: int,
    link_set: LinkSet,
    statuses: Mapping[str, RuntimeStatus],
    settings: LendingSettings,
    facts: Mapping[FactKey, ModelFacts],
    claimed: set[str],
    only_owners: Collection[tuple[Lane, str, str]] | None,
    leases: list[Lease],
    rows: PlanRows,
) -> float | None:
    # Thousands of pairs a plan on a big site (issue 24: 64 nodes x 32 owners x 4 helpers in
    # <= 5 ms): Python looks up each owner and each helper once; the rules of the module docstring
    # then run on arrays over every pair at once, and only the claims (a helper node serves one
    # owner per lane, biggest backlog first) walk the candidates in order.  Checked against the
    # previous planner by tests/unit/test_lending_planner_equivalence.py.
    section = LANE_SECTION[lane]
    text = lane == "text"
    probe_idle_ms = settings.offload_probe_idle * 1000.0
    ttl_ms = int(round(settings.scheduling_grant_ttl * 1000.0))
    index = link_set.pair_index
    views: dict[str, _NodeView | None] = {}

    # -- owners: one Python pass, in index order (so node by node) -----------------------------------
    gone: list[tuple[Head, Link]] = []  # pairs of unreachable or unavailable owners
    planned: list[int] = []  # positions in index.owners
    owner_numbers: list[tuple[float, ...]] = []
    owner_objects: list[tuple[Head, QueueStat, float | None]] = []
    last_node = ""
    view: _NodeView | None = None
    node_queue: dict[str, QueueStat] = {}
    for position, (owner, key, links) in enumerate(index.owners):
        if only_owners is not None and key not in only_owners:
            continue
        node_id, model_id = owner.node_id, owner.model_id
        if node_id != last_node:
            last_node = node_id
            status = statuses.get(node_id)
            view = None
            if status is not None:
                view = views.get(node_id)
                if view is None:
                    view = views[node_id] = _NodeView(status, lane, section)
                node_queue = {q.model_id: q for q in status.lane(lane).queue}
        owner_facts = facts.get(key)
        if view is None or owner_facts is None or not owner_facts.eligible:
            # unreachable, or its model disabled or gone: every pair of it says so
            head: Head = (trigger, lane, node_id, model_id, 0, 0, 0.0, 0.0)
            gone.extend((head, link) for link in links)
            continue
        stat = node_queue.get(model_id)
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
        else:
            mean_work = [w / count for w in pending_work]
            w0 = mean_work[0] if width >= 1 else 0.0
            w1 = mean_work[1] if width >= 2 else 0.0
            keep = predict_queue(fit, backlog, stat.backlog_work)
            owner_job = predict(fit, mean_work)
            if text and not any(w > 0 for w in pending_work):
                keep = owner_job = None  # no token profile: the queue has no size to price
        planned.append(position)
        keep_ms = keep or 0.0
        owner_job_ms = owner_job or 0.0
        numbers: tuple[float, ...] = (
            -sum(stat.backlog_work), -backlog, keep_ms, owner_job_ms,
            keep is not None and owner_job is not None, owner_job is not None, width, w0,
            owner_facts.ineligible != "",
        )  # fmt: skip
        if text:
            mean_context = stat.pending_context / count
            numbers += (w1, owner_facts.multimodal, mean_context, mean_context > 0)
        owner_numbers.append(numbers)
        head = (trigger, lane, node_id, model_id, count, backlog, keep_ms, owner_job_ms)
        owner_objects.append((head, stat, owner_job))
    if gone:
        rows.add((
            [head for head, _link in gone], [_gone_tail(link) for _head, link in gone],
            ["skipped"] * len(gone), ["owner_unavailable"] * len(gone), [0.0] * len(gone), [None] * len(gone),
            [0] * len(gone),
        ))  # fmt: skip
    if not planned:
        return None
    owners = np.array(owner_numbers, dtype=np.float64)
    # Biggest backlog first (work, then count), then node id and model id (index order): stable.
    order = np.lexsort((owners[:, 1], owners[:, 0]))
    owners_n = len(planned)
    planned_at = np.array(planned, dtype=np.intp)[order]
    first_pair = index.owner_first[planned_at]
    lengths = index.owner_first[planned_at + 1] - first_pair
    pairs_n = int(lengths.sum())
    # Every pair of the planned owners: owners in planning order, links in listing order.
    pair_at = np.repeat(first_pair - (np.cumsum(lengths) - lengths), lengths) + np.arange(pairs_n)
    po = np.repeat(order, lengths)  # the pair's owner in owner_numbers
    p_rank = np.repeat(np.arange(owners_n), lengths)  # the owner's place in planning order
    p_helper = index.pair_helper[pair_at]

    # -- helpers these owners reach: one Python pass, node by node -----------------------------------
    reached = np.zeros(len(index.helpers), dtype=np.bool_)
    reached[p_helper] = True
    needed = np.flatnonzero(reached)
    slot = np.empty(len(index.helpers), dtype=np.intp)
    slot[needed] = np.arange(len(needed))
    at = needed.tolist()
    side_numbers: list[tuple[float, ...]] = []
    tails: list[Tail] = []
    last_node = ""
    view = None
    for helper, key in zip(_take(index.helpers, at), _take(index.helper_keys, at), strict=True):
        node_id, model_id = helper.node_id, helper.model_id
        if node_id != last_node:
            last_node = node_id
            view = views.get(node_id)
            if view is None and node_id not in views:
                status = statuses.get(node_id)
                view = views[node_id] = None if status is None else _NodeView(status, lane, section)
        helper_facts = facts.get(key)
        if view is None or helper_facts is None or not helper_facts.eligible:
            # its node unreachable, or its model disabled or gone
            side_numbers.append(_DEAD_SIDE if text else _DEAD_SIDE_IMAGE)
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
        side_row: tuple[float, ...] = (
            1.0, helper_facts.ineligible != "", loaded, switch or 0.0, restore or 0.0, unpriced, slopes_n,
            uniform, base, s0,
        )  # fmt: skip
        if text:
            side_row += (s1, helper_facts.context, helper_facts.multimodal)
        side_numbers.append(side_row)
        tails.append((node_id, model_id, switch or 0.0, restore or 0.0, view.idle_ms))

    # -- every pair at once ----------------------------------------------------------------------------
    # What depends on the helper alone, over the reached helpers (node figures by node).
    sides = np.array(side_numbers, dtype=np.float64).T
    node_of_side = index.helper_node[needed]
    node_views = [views.get(node_id) for node_id in index.nodes]
    idle = np.array([0 if v is None else v.idle_ms for v in node_views], dtype=np.float64)[node_of_side]
    accepting = np.array([v is not None and v.accepting for v in node_views], dtype=np.bool_)[node_of_side]
    loaded_s = sides[_S_LOADED] > 0
    unpriced_s = sides[_S_UNPRICED]
    # switch + restore, when both are priced
    base_total_s = sides[_S_SWITCH] + sides[_S_RESTORE]
    # unloaded and busy with its own work more recently than the switch and the way back take
    busy_s = ~loaded_s & (unpriced_s == _NO_REASON) & (idle < base_total_s)
    bar = np.where(loaded_s, probe_idle_ms, UNLOADED_PROBE_FACTOR * probe_idle_ms)
    ready_s = idle >= bar
    due_at_s = (now_ms + bar) - idle
    gate_s = np.where(
        sides[_S_INELIGIBLE] > 0, _MODEL_INELIGIBLE, np.where(accepting, _NO_REASON, _NOT_ACCEPTING)
    )

    ps = slot[p_helper]  # the pair's helper among the reached ones
    side = np.take(sides, ps, axis=1)
    own = np.take(owners.T, po, axis=1)
    live = side[_S_LIVE] > 0
    # gates before claims (the owner's, then the helper's own), after claims (the link, the context)
    owner_gate = own[_O_INELIGIBLE] > 0
    if text:
        owner_gate |= side[_S_MULTIMODAL] != own[_O_MULTIMODAL]
    before = np.where(owner_gate, _MODEL_INELIGIBLE, gate_s[ps])
    loaded_p = loaded_s[ps]
    after = np.where(~loaded_p & ~index.pair_load[pair_at], _LOAD_FORBIDDEN, _NO_REASON)
    if text:
        short = (own[_O_CONTEXT_GATE] > 0) & (side[_S_CONTEXT] < own[_O_CONTEXT])
        after = np.where((after == _NO_REASON) & short, _CONTEXT_TOO_SMALL, after)
    # predict(helper fit, mean work): inline for a linear fit of the owner's width (<= 2 terms)
    width = own[_O_WIDTH]
    slopes_p = side[_S_SLOPES]
    uniform_p = side[_S_UNIFORM] > 0
    priced_service = (slopes_p == width) & ~uniform_p & (width <= 2)
    service = side[_S_BASE]
    with np.errstate(all="ignore"):
        w = own[_O_W0]
        term = priced_service & (width >= 1) & (w > 0)
        service = np.where(term, service + side[_S_SLOPE0] * w, service)
        if text:
            w = own[_O_W1]
            term = priced_service & (width >= 2) & (w > 0)
            service = np.where(term, service + side[_S_SLOPE1] * w, service)
    for p in np.flatnonzero((slopes_p == width) & (uniform_p | (width > 2))).tolist():
        stat = owner_objects[po[p]][1]
        mean_work = [w / stat.pending_count for w in stat.pending_work]
        value = predict(_fit_of(views, index.helpers[p_helper[p]]), mean_work)
        if value is not None:
            service[p], priced_service[p] = value, True
    # None still only when the owner has no fit either: the owner is unpriced and ``owner_unpriced``
    # is reported first, so ``service_unpriced`` (kept in the enumeration) is never produced.
    job_ok = own[_O_JOB_OK] > 0
    service = np.where(priced_service, service, own[_O_JOB])
    source = np.where(priced_service, 1, np.where(job_ok, 2, 0))
    total = base_total_s[ps] + service
    unpriced_p = unpriced_s[ps]
    cost = np.where(
        own[_O_PRICED] > 0,
        np.where(
            unpriced_p != _NO_REASON, unpriced_p, np.where(total >= own[_O_KEEP], _COST_REJECTED, _OUTRANKED)
        ),
        _OWNER_UNPRICED,
    )
    busy_p = busy_s[ps]
    ready = ready_s[ps]
    open_ = live & (before == _NO_REASON) & (after == _NO_REASON) & ~busy_p  # eligible unless claimed
    payable = open_ & (cost == _OUTRANKED)
    probing = open_ & ~payable & ready

    # -- claims: each owner in turn takes its first candidate on a helper node not yet claimed -------
    # Candidates by owner rank, the payable ones first (cheapest, then node id and model id), then
    # the probe-ready ones (longest idle, then node id and model id).
    node_of = index.helper_node[p_helper]
    candidates = np.flatnonzero(payable | probing)
    by_cost = payable[candidates]
    cost_or_idle = np.where(by_cost, total[candidates], -idle[ps[candidates]])
    candidates = candidates[
        _preference(p_rank[candidates], by_cost, cost_or_idle, p_helper[candidates], len(index.helpers))
    ]
    taken_at = np.full(len(index.nodes), owners_n, dtype=np.intp)  # rank of the owner that claimed it
    if claimed:
        for n, node_id in enumerate(index.nodes):
            if node_id in claimed:
                taken_at[n] = -1
    taken = bytearray((taken_at < owners_n).tobytes())
    chosen: list[int] = []
    last = -1
    for p, rank, n in zip(
        candidates.tolist(), p_rank[candidates].tolist(), node_of[candidates].tolist(), strict=True
    ):
        if rank != last and not taken[n]:
            last = rank
            taken[n] = 1
            taken_at[n] = rank
            chosen.append(p)
    claimed_p = taken_at[node_of] < p_rank

    # -- reasons, outcomes, leases ---------------------------------------------------------------------
    gate_none = (before == _NO_REASON) & ~claimed_p & (after == _NO_REASON)
    reason = np.where(
        before != _NO_REASON,
        before,
        np.where(claimed_p, _CLAIMED, np.where(after != _NO_REASON, after, np.where(busy_p, _BUSY, cost))),
    )
    reason = np.where(live, reason, _HELPER_UNAVAILABLE).astype(np.intp)
    outcome: list[Outcome] = ["skipped"] * pairs_n
    slots = [0] * pairs_n
    reasons = list(_take(_REASON_NAMES, reason.tolist()))
    decided = np.zeros(len(owner_numbers), dtype=np.bool_)
    for p in chosen:
        o, s = int(po[p]), int(ps[p])
        decided[o] = True
        probe = not payable[p]
        head, _stat, owner_job = owner_objects[o]
        helper_service = float(service[p])
        if probe:
            slots[p] = settings.offload_probe_helper_slots
        else:
            reasons[p] = None
            assert owner_job is not None
            if helper_service <= owner_job:
                slots[p] = settings.offload_faster_helper_slots
            else:
                slots[p] = settings.offload_slower_helper_slots
        outcome[p] = "probe" if probe else "granted"
        link = index.links[pair_at[p]]
        helper_facts = facts[index.helper_keys[p_helper[p]]]
        helper_switch = tails[s][2]
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
                helper_switch_ms=0.0 if probe else helper_switch,
                helper_service_ms=0.0 if probe else helper_service,
                helper_context=helper_facts.context if text else 0,
                helper_multimodal=helper_facts.multimodal,
            )
        )
    # Undecided owners probe again when their first eligible helper will have idled long enough.
    waiting = live & gate_none & ~ready & ~decided[po]
    due: float | None = None
    if waiting.any():
        due = float(due_at_s[ps][waiting].min())

    # -- rows: per owner in planning order, the pairs it cannot weigh first, each in listing order ----
    row_service = np.where(live & (priced_service | job_ok), service, 0.0)
    at = po.tolist()
    heads: Sequence[Head] = _take([objects[0] for objects in owner_objects], at)
    row_tails: Sequence[Tail] = _take(tails, ps.tolist())
    if live.all():
        rows.add(
            (heads, row_tails, outcome, reasons, row_service.tolist(), _take(_SOURCE_NAMES, source.tolist()),
             slots)
        )
        return due
    # the owner's counts, no prices, on the row of a pair it cannot weigh
    heads = [h if ok else h[:6] + (0.0, 0.0) for h, ok in zip(heads, live.tolist(), strict=True)]
    source = np.where(live, source, 0)
    ranked = np.argsort(p_rank * 2 + live, kind="stable").tolist()
    rows.add((
        _take(heads, ranked), _take(row_tails, ranked), _take(outcome, ranked), _take(reasons, ranked),
        _take(row_service.tolist(), ranked), _take(_SOURCE_NAMES, source[ranked].tolist()),
        _take(slots, ranked),
    ))  # fmt: skip
    return due


def _preference(
    rank: npt.NDArray[np.intp], first: npt.NDArray[np.bool_], key: npt.NDArray[np.float64],
    helper: npt.NDArray[np.intp], helpers: int,
) -> npt.NDArray[np.intp]:
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


def _fit_of(views: Mapping[str, _NodeView | None], helper: Endpoint) -> ModelCost | None:
    view = views.get(helper.node_id)
    return None if view is None else view.fits.get(helper.model_id)


def _gone_tail(link: Link) -> Tail:
    """The helper side of the row of a pair the master cannot weigh (no prices)."""
    helper = link.helper
    return (helper.node_id, helper.model_id, 0.0, 0.0, 0)


__all__ = ["UNLOADED_PROBE_FACTOR", "FactKey", "ModelFacts", "PlanResult", "displaced_configs", "plan"]
