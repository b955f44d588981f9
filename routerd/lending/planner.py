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
from typing import Any, TypeVar

import attrs
import numpy as np

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
from routerd.wire.plan_rows import CompactRow, Head, PlanRows
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
            rows.compact,
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
    rows: list[CompactRow],
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
    append = rows.append

    views: dict[str, _NodeView] = {}

    def view_of(node_id: str, status: RuntimeStatus) -> _NodeView:
        found = views.get(node_id)
        if found is None:
            found = views[node_id] = _NodeView(status, lane, section)
        return found

    # -- owners: one Python pass, in index order ---------------------------------------------------
    queues: dict[str, dict[str, QueueStat]] = {}
    planned: list[int] = []  # positions in index.owners
    owner_rows: list[tuple[Any, ...]] = []
    for position, (owner, key, links) in enumerate(index.owners):
        if only_owners is not None and key not in only_owners:
            continue
        node_id, model_id = owner.node_id, owner.model_id
        status = statuses.get(node_id)
        owner_facts = facts.get(key)
        if status is None or owner_facts is None or not owner_facts.eligible:
            # unreachable, or its model disabled or gone: every pair of it says so
            head: Head = (trigger, lane, node_id, model_id, 0, 0, 0.0, 0.0)
            for link in links:
                append(_unavailable_row(head, link, "owner_unavailable"))
            continue
        node_queue = queues.get(node_id)
        if node_queue is None:
            node_queue = queues[node_id] = {q.model_id: q for q in status.lane(lane).queue}
        stat = node_queue.get(model_id)
        if stat is None or stat.pending_count <= 0:
            continue
        count = stat.pending_count
        backlog = stat.backlog_count
        pending_work = stat.pending_work
        width = len(pending_work)
        fit = view_of(node_id, status).fits.get(model_id)
        keep: float | None
        owner_job: float | None
        if (
            width == 1 and not text and fit is not None and fit.uniform_work is None
            and len(fit.slopes_ms) == 1 and backlog > 0 and len(stat.backlog_work) == 1
        ):  # fmt: skip
            # predict_queue and predict for the common one-term linear fit, inline
            w0 = pending_work[0] / count
            mean_work = [w0]
            base, slope = fit.base_ms, fit.slopes_ms[0]
            owner_job = base + slope * w0 if w0 > 0 else base
            backlog_work = stat.backlog_work[0]
            keep = backlog * base + slope * backlog_work if backlog_work > 0 else backlog * base
        else:
            mean_work = [w / count for w in pending_work]
            keep = predict_queue(fit, backlog, stat.backlog_work)
            owner_job = predict(fit, mean_work)
            if text and not any(w > 0 for w in pending_work):
                keep = owner_job = None  # no token profile: the queue has no size to price
        mean_context = stat.pending_context / count
        planned.append(position)
        owner_rows.append((
            -sum(stat.backlog_work), -backlog,
            (trigger, lane, node_id, model_id, count, backlog, keep or 0.0, owner_job or 0.0),
            (trigger, lane, node_id, model_id, count, backlog, 0.0, 0.0),
            keep or 0.0, owner_job or 0.0, keep is not None and owner_job is not None, owner_job is not None,
            width, mean_work[0] if width >= 1 else 0.0, mean_work[1] if width >= 2 else 0.0, mean_work,
            bool(owner_facts.ineligible), owner_facts.multimodal, mean_context, text and mean_context > 0,
            owner_job,
        ))  # fmt: skip
    if not planned:
        return None
    (
        o_work, o_count, o_head, o_dead_head, o_keep, o_job, o_priced, o_job_ok, o_width, o_w0, o_w1,
        o_mean, o_ineligible, o_multimodal, o_context, o_context_gate, o_job_value,
    ) = zip(*owner_rows, strict=True)  # fmt: skip

    # Biggest backlog first (work, then count), then node id and model id (index order): stable.
    order = np.lexsort((np.array(o_count), np.array(o_work)))
    owners_n = len(planned)
    first_pair = index.owner_first[np.array(planned, dtype=np.intp)[order]]
    lengths = index.owner_first[np.array(planned, dtype=np.intp)[order] + 1] - first_pair
    pairs_n = int(lengths.sum())
    # Every pair of the planned owners, owners by rank, links in listing order.
    pair_at = np.repeat(first_pair - (np.cumsum(lengths) - lengths), lengths) + np.arange(pairs_n)
    p_owner = np.repeat(order, lengths)  # position in owner_rows
    p_rank = np.repeat(np.arange(owners_n), lengths)  # the owner's place in planning order
    p_helper = index.pair_helper[pair_at]

    # -- helpers these owners reach: one Python pass ------------------------------------------------
    reached = np.zeros(len(index.helpers), dtype=np.bool_)
    reached[p_helper] = True
    needed = np.flatnonzero(reached)
    slot = np.empty(len(index.helpers), dtype=np.intp)
    slot[needed] = np.arange(len(needed))
    helpers, helper_keys = index.helpers, index.helper_keys
    side_rows: list[tuple[Any, ...]] = []
    for h in needed.tolist():
        helper = helpers[h]
        node_id, model_id = helper.node_id, helper.model_id
        status = statuses.get(node_id)
        helper_facts = facts.get(helper_keys[h])
        if status is None or helper_facts is None or not helper_facts.eligible:
            # its node unreachable, or its model disabled or gone
            side_rows.append(_DEAD_SIDE[:-1] + ((node_id, model_id, 0.0, 0.0, 0),))
            continue
        view = view_of(node_id, status)
        config = helper_facts.config_filename
        idle_ms = view.idle_ms
        switch: float | None
        restore: float | None
        if config and view.active == config:
            loaded = True
            switch = restore = 0.0
            bar_ms = probe_idle_ms
            busy = False
        else:
            loaded = False
            switch = view.loads.get(config)
            restore = view.restore(config)
            bar_ms = UNLOADED_PROBE_FACTOR * probe_idle_ms
            # Unloaded and busy with its own work more recently than the switch and the way back take.
            busy = switch is not None and restore is not None and idle_ms < switch + restore
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
        if helper_facts.ineligible:
            gate = _MODEL_INELIGIBLE
        else:
            gate = _NO_REASON if view.accepting else _NOT_ACCEPTING
        side_rows.append((
            True, gate, loaded, helper_facts.context, helper_facts.multimodal, busy, unpriced,
            switch + restore if switch is not None and restore is not None else 0.0,
            idle_ms >= bar_ms, idle_ms, now_ms + bar_ms - idle_ms, slopes_n, uniform, base, s0, s1, fit,
            switch, (node_id, model_id, switch or 0.0, restore or 0.0, idle_ms),
        ))  # fmt: skip
    (
        s_live, s_gate, s_loaded, s_context, s_multimodal, s_busy, s_unpriced, s_base_total, s_ready,
        s_idle, s_due_at, s_slopes_n, s_uniform, s_base, s_s0, s_s1, s_fit, s_switch, s_tail,
    ) = zip(*side_rows, strict=True)  # fmt: skip

    # -- every pair at once --------------------------------------------------------------------------
    ps = slot[p_helper]  # the pair's helper among the reached ones
    po = p_owner
    live = np.array(s_live)[ps]
    # gates before claims (the owner's, then the helper's own), after claims (the link, the context)
    before = np.array(s_gate, dtype=np.int8)[ps]
    owner_gate = np.array(o_ineligible)[po]
    if text:
        owner_gate |= np.array(s_multimodal)[ps] != np.array(o_multimodal)[po]
    before = np.where(owner_gate, np.int8(_MODEL_INELIGIBLE), before)
    loaded_p = np.array(s_loaded)[ps]
    after = np.where(~loaded_p & ~index.pair_load[pair_at], np.int8(_LOAD_FORBIDDEN), np.int8(_NO_REASON))
    if text:
        short = np.array(o_context_gate)[po] & (np.array(s_context)[ps] < np.array(o_context)[po])
        after = np.where((after == _NO_REASON) & short, np.int8(_CONTEXT_TOO_SMALL), after)
    # predict(helper fit, mean work): inline for a linear fit of the owner's width (<= 2 terms)
    width = np.array(o_width)[po]
    slopes_n = np.array(s_slopes_n)[ps]
    uniform = np.array(s_uniform)[ps]
    fast = (slopes_n == width) & ~uniform & (width <= 2)
    service = np.array(s_base)[ps]
    with np.errstate(all="ignore"):
        w = np.array(o_w0)[po]
        service = np.where(fast & (width >= 1) & (w > 0), service + np.array(s_s0)[ps] * w, service)
        if text:
            w = np.array(o_w1)[po]
            service = np.where(fast & (width >= 2) & (w > 0), service + np.array(s_s1)[ps] * w, service)
    priced_service = fast
    for p in np.flatnonzero((slopes_n == width) & (uniform | (width > 2))).tolist():
        value = predict(s_fit[ps[p]], o_mean[po[p]])
        if value is not None:
            service[p], priced_service[p] = value, True
    # None still only when the owner has no fit either: the owner is unpriced and ``owner_unpriced``
    # is reported first, so ``service_unpriced`` (kept in the enumeration) is never produced.
    job_ok = np.array(o_job_ok)[po]
    service = np.where(priced_service, service, np.array(o_job)[po])
    source = np.where(priced_service, 1, np.where(job_ok, 2, 0))
    total = np.array(s_base_total)[ps] + service
    cost = np.where(
        ~np.array(o_priced)[po],
        _OWNER_UNPRICED,
        np.where(
            np.array(s_unpriced)[ps] != _NO_REASON,
            np.array(s_unpriced)[ps],
            np.where(total >= np.array(o_keep)[po], _COST_REJECTED, _OUTRANKED),
        ),
    )
    busy_p = np.array(s_busy)[ps]
    ready = np.array(s_ready)[ps]
    open_ = live & (before == _NO_REASON) & (after == _NO_REASON) & ~busy_p  # eligible unless claimed
    payable = open_ & (cost == _OUTRANKED)
    probing = open_ & ~payable & ready

    # -- claims: each owner in turn takes its first candidate on a helper node not yet claimed ------
    # Candidates by owner rank, the payable ones first (cheapest, then node id and model id), then
    # the probe-ready ones (longest idle, then node id and model id).
    node_of = index.helper_node[p_helper]
    candidates = np.flatnonzero(payable | probing)
    by_cost = payable[candidates]
    key = np.where(by_cost, total[candidates], -np.array(s_idle, dtype=np.float64)[ps[candidates]])
    candidates = candidates[
        np.lexsort((index.helper_rank[p_helper[candidates]], key, ~by_cost, p_rank[candidates]))
    ]
    taken_at = np.full(len(index.nodes), owners_n, dtype=np.intp)  # rank of the owner that claimed it
    if claimed:
        for n, node_id in enumerate(index.nodes):
            if node_id in claimed:
                taken_at[n] = -1
    taken = bytearray(taken_at < owners_n)
    chosen: list[int] = []
    last = -1
    for p, rank, n in zip(
        candidates.tolist(), p_rank[candidates].tolist(), node_of[candidates].tolist(), strict=True
    ):
        if rank == last or taken[n]:
            continue
        last = rank
        taken[n] = 1
        taken_at[n] = rank
        chosen.append(p)
    claimed_p = taken_at[node_of] < p_rank

    # -- reasons, outcomes, leases ----------------------------------------------------------------
    gate_none = (before == _NO_REASON) & ~claimed_p & (after == _NO_REASON)
    reason = np.where(
        before != _NO_REASON,
        before,
        np.where(claimed_p, _CLAIMED, np.where(after != _NO_REASON, after, np.where(busy_p, _BUSY, cost))),
    )
    reason = np.where(live, reason, _HELPER_UNAVAILABLE)
    outcome: list[Outcome] = ["skipped"] * pairs_n
    slots = [0] * pairs_n
    reasons = list(_take(_REASON_NAMES, reason.tolist()))
    decided = np.zeros(owners_n, dtype=np.bool_)
    for p in chosen:
        o, s = int(po[p]), int(ps[p])
        decided[o] = True
        probe = not payable[p]
        owner_job = o_job_value[o]
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
        helper_switch = s_switch[s]
        leases.append(
            Lease(
                lane=lane,
                owner_node_id=o_head[o][2],
                owner_model_id=o_head[o][3],
                helper_node_id=link.helper.node_id,
                helper_model_id=link.helper.model_id,
                load_helper_model=link.load_if_unloaded,
                restore_helper_model=link.restore_after_borrow,
                helper_slots=slots[p],
                probe=probe,
                ttl_ms=ttl_ms,
                owner_job_ms=0.0 if probe or owner_job is None else owner_job,
                helper_switch_ms=0.0 if probe or helper_switch is None else helper_switch,
                helper_service_ms=0.0 if probe else helper_service,
                helper_context=s_context[s] if text else 0,
                helper_multimodal=s_multimodal[s],
            )
        )
    # Undecided owners probe again when their first eligible helper will have idled long enough.
    waiting = live & gate_none & ~ready & ~decided[po]
    due: float | None = None
    if waiting.any():
        due = float(np.array(s_due_at, dtype=np.float64)[ps][waiting].min())

    # -- rows: per owner in planning order, the pairs it cannot weigh first, each in listing order ----
    row_service = np.where(live & (priced_service | job_ok), service, 0.0)
    source = np.where(live, source, 0)
    at = po.tolist()
    heads = _take(o_head, at)
    if not live.all():
        heads = [h if ok else d for h, d, ok in zip(heads, _take(o_dead_head, at), live.tolist(), strict=True)]
    columns: list[Sequence[Any]] = [
        heads, _take(s_tail, ps.tolist()), outcome, reasons, row_service.tolist(),
        _take(_SOURCE_NAMES, source.tolist()), slots,
    ]  # fmt: skip
    if not live.all():
        ranked = np.lexsort((live, p_rank)).tolist()
        columns = [_take(column, ranked) for column in columns]
    rows.extend(zip(*columns, strict=True))
    return due


#: The side of a helper the plan cannot weigh (its tail is added per helper).
_DEAD_SIDE: tuple[Any, ...] = (
    False, _NO_REASON, False, 0, False, False, _NO_REASON, 0.0, False, 0, 0.0, -1, False, 0.0, 0.0, 0.0, None,
    None, None,
)


def _unavailable_row(head: Head, link: Link, reason: Reason) -> CompactRow:
    """The plan row of a linked pair the master cannot weigh: the owner or the helper is unreachable
    or its model disabled or gone (skipped; ``head`` carries the owner's counts when it has them,
    every time 0)."""
    helper = link.helper
    return (head, (helper.node_id, helper.model_id, 0.0, 0.0, 0), "skipped", reason, 0.0, None, 0)


__all__ = ["UNLOADED_PROBE_FACTOR", "FactKey", "ModelFacts", "PlanResult", "displaced_configs", "plan"]
