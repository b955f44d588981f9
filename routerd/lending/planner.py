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
from typing import Any

import attrs

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
    PlanRow,
    QueueStat,
    Reason,
    ServiceSource,
    Trigger,
)
from routerd.wire.plan_rows import CompactRow, Head, PlanRows, Tail
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

    __slots__ = ("gate", "active", "idle_ms", "fits", "loads", "displaceable", "restore_all")

    def __init__(self, status: RuntimeStatus, lane: Lane, section: str) -> None:
        lane_status = status.lane(lane)
        #: ``helper_not_accepting`` when the lane takes no borrowed work.
        self.gate: Reason | None = None if lane_status.accepting_borrowed else "helper_not_accepting"
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


#: Everything about one helper model that does not depend on the owner, computed once a plan, as
#: one tuple (a tuple is built and unpacked faster than an object's attributes are set and read):
#: node id, (node id, model id) for tie-breaks, the row tail (``routerd.wire.plan_rows.Tail``),
#: its own gate (``model_ineligible``, ``helper_not_accepting`` or None), loaded, context window,
#: multimodal, ``helper_recently_busy`` or None, ``switch_unpriced``/``restore_unpriced`` or None,
#: switch + restore, probe-ready, idle ms, the instant it will be probe-ready, the number of slopes
#: of a linear fit (-1 for a uniform fit or none: priced by :func:`predict`), its base, its first
#: slope, all its slopes, the fit, the switch time (None when unpriced), the model id.
_Side = tuple[
    str, tuple[str, str], Tail, "Reason | None", bool, int, bool, "Reason | None", "Reason | None", float,
    bool, int, float, int, float, float, tuple[float, ...], "ModelCost | None", "float | None", str,
]


def _helper_side(
    node_id: str, model_id: str, facts: ModelFacts, view: _NodeView, probe_idle_ms: float, now_ms: int
) -> _Side:
    config = facts.config_filename
    idle_ms = view.idle_ms
    switch: float | None
    restore: float | None
    if config and view.active == config:
        loaded = True
        switch = restore = 0.0
        bar_ms = probe_idle_ms
        busy: Reason | None = None
    else:
        loaded = False
        switch = view.loads.get(config)
        restore = view.restore(config)
        bar_ms = UNLOADED_PROBE_FACTOR * probe_idle_ms
        # Unloaded and busy with its own work more recently than the switch and the way back take.
        busy = None
        if switch is not None and restore is not None and idle_ms < switch + restore:
            busy = "helper_recently_busy"
    unpriced: Reason | None = None
    base_total = 0.0
    if switch is None:
        unpriced = "switch_unpriced"
    elif restore is None:
        unpriced = "restore_unpriced"
    else:
        base_total = switch + restore
    fit = view.fits.get(model_id)
    width, base, first, slopes = -1, 0.0, 0.0, ()
    if fit is not None and fit.uniform_work is None:
        slopes = fit.slopes_ms
        width, base = len(slopes), fit.base_ms
        first = slopes[0] if slopes else 0.0
    gate: Reason | None = "model_ineligible" if facts.ineligible else view.gate
    tail: Tail = (node_id, model_id, switch or 0.0, restore or 0.0, idle_ms)
    return (
        node_id, (node_id, model_id), tail, gate, loaded, facts.context, facts.multimodal, busy, unpriced,
        base_total, idle_ms >= bar_ms, idle_ms, now_ms + bar_ms - idle_ms, width, base, first, slopes, fit,
        switch, model_id,
    )  # fmt: skip


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


_UNBUILT: Any = object()


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
    # One pass per owner over its links, no object per pair but a small row tuple: thousands of
    # pairs a plan on a big site (issue 24: 64 nodes x 32 owners x 4 helpers in <= 5 ms).  Decisions
    # are the rules of the module docstring, checked against the previous planner by
    # tests/unit/test_lending_planner_equivalence.py.
    section = LANE_SECTION[lane]
    text = lane == "text"
    probe_idle_ms = settings.offload_probe_idle * 1000.0
    ttl_ms = int(round(settings.scheduling_grant_ttl * 1000.0))
    index = link_set.pair_index

    views: dict[str, _NodeView] = {}

    def view_of(node_id: str, status: RuntimeStatus) -> _NodeView:
        found = views.get(node_id)
        if found is None:
            found = views[node_id] = _NodeView(status, lane, section)
        return found

    append = rows.append
    queues: dict[str, dict[str, QueueStat]] = {}
    # (-backlog work, -backlog count, owner, its status, its facts, its queue, its pairs)
    owners: list[tuple[float, int, Endpoint, RuntimeStatus, ModelFacts, QueueStat,
                       tuple[tuple[Link, int, bool], ...]]] = []
    for owner, key, pairs in index.owners:
        if only_owners is not None and key not in only_owners:
            continue
        status = statuses.get(owner.node_id)
        owner_facts = facts.get(key)
        if status is None or owner_facts is None or not owner_facts.eligible:
            # unreachable, or its model disabled or gone: every pair of it says so
            head: Head = (trigger, lane, owner.node_id, owner.model_id, 0, 0, 0.0, 0.0)
            for link, _position, _load in pairs:
                append(_unavailable_row(head, link, "owner_unavailable"))
            continue
        node_queue = queues.get(owner.node_id)
        if node_queue is None:
            node_queue = queues[owner.node_id] = {q.model_id: q for q in status.lane(lane).queue}
        stat = node_queue.get(owner.model_id)
        if stat is None or stat.pending_count <= 0:
            continue
        owners.append((-sum(stat.backlog_work), -stat.backlog_count, owner, status, owner_facts, stat, pairs))
    # Biggest backlog first (work, then count), then node id and model id (the order owners come
    # in): two stable sorts on plain numbers, the minor key first.
    owners.sort(key=itemgetter(1))
    owners.sort(key=itemgetter(0))

    # Helper sides by position in the index, built the first time an owner reaches them (None: its
    # node unreachable, or its model disabled or gone).
    helpers, helper_keys = index.helpers, index.helper_keys
    sides: list[_Side | None] = [_UNBUILT] * len(helpers)

    def build_side(position: int) -> _Side | None:
        helper = helpers[position]
        status = statuses.get(helper.node_id)
        helper_facts = facts.get(helper_keys[position])
        side = None
        if status is not None and helper_facts is not None and helper_facts.eligible:
            view = view_of(helper.node_id, status)
            side = _helper_side(helper.node_id, helper.model_id, helper_facts, view, probe_idle_ms, now_ms)
        sides[position] = side
        return side

    due: float | None = None
    for _work, _count, owner, owner_status, owner_facts, stat, pairs in owners:
        count = stat.pending_count
        backlog = stat.backlog_count
        pending_work = stat.pending_work
        width = len(pending_work)
        owner_node, owner_model = owner.node_id, owner.model_id
        owner_fit = view_of(owner_node, owner_status).fits.get(owner_model)
        keep: float | None
        owner_job: float | None
        if (
            width == 1 and not text and owner_fit is not None and owner_fit.uniform_work is None
            and len(owner_fit.slopes_ms) == 1 and backlog > 0 and len(stat.backlog_work) == 1
        ):  # fmt: skip
            # predict_queue and predict for the common one-term linear fit, inline
            w0 = pending_work[0] / count
            mean_work = [w0]
            base, slope = owner_fit.base_ms, owner_fit.slopes_ms[0]
            owner_job = base + slope * w0 if w0 > 0 else base
            backlog_work = stat.backlog_work[0]
            keep = backlog * base + slope * backlog_work if backlog_work > 0 else backlog * base
        else:
            mean_work = [w / count for w in pending_work]
            w0 = mean_work[0] if width == 1 else 0.0
            keep = predict_queue(owner_fit, backlog, stat.backlog_work)
            owner_job = predict(owner_fit, mean_work)
            if text and not any(w > 0 for w in pending_work):
                keep = owner_job = None  # no token profile: the queue has no size to price
        owner_priced = keep is not None and owner_job is not None
        keep_ms = keep or 0.0
        owner_job_ms = owner_job or 0.0
        owner_gate: Reason | None = "model_ineligible" if owner_facts.ineligible else None
        owner_multimodal = owner_facts.multimodal
        mean_context = stat.pending_context / count
        context_gate = text and mean_context > 0
        head = (trigger, lane, owner_node, owner_model, count, backlog, keep_ms, owner_job_ms)

        first = len(rows)
        dead: list[Link] = []
        # The cheapest payable helper: (total, order, row offset, side, link, service).
        best: tuple[float, tuple[str, str], int, _Side, Link, float] | None = None
        # The longest-idle helper a probe may go to: (idle, order, row offset, side, link, reason).
        idlest: tuple[int, tuple[str, str], int, _Side, Link, Reason] | None = None
        owner_due: float | None = None
        for link, position, may_load in pairs:
            side = sides[position]
            if side is _UNBUILT:
                side = build_side(position)
            if side is None:
                dead.append(link)
                continue
            (
                node_id, order, tail, gate, loaded, context, multimodal, busy, unpriced, base_total, ready,
                idle, due_at, side_width, base, slope, slopes, fit, _switch, _model,
            ) = side  # fmt: skip
            if owner_gate is not None or (text and multimodal != owner_multimodal):
                gate = "model_ineligible"
            elif gate is None:
                if node_id in claimed:
                    gate = "helper_claimed"
                elif not loaded and not may_load:
                    gate = "load_forbidden"
                elif context_gate and context < mean_context:
                    gate = "context_too_small"
            # predict(fit, mean_work), inline for a linear fit of the right shape
            service: float | None
            if side_width == width:
                if width == 1:
                    service = base + slope * w0 if w0 > 0 else base
                else:
                    service = base
                    for s, w in zip(slopes, mean_work):  # noqa: B905 - lengths equal
                        if w > 0:
                            service += s * w
            else:
                service = predict(fit, mean_work)
            source: ServiceSource | None = "helper"
            if service is None:
                # None still only when the owner has no fit either: the owner is unpriced and
                # ``owner_unpriced`` is reported first, so ``service_unpriced`` (kept in the
                # enumeration) is never produced under this rule order.
                service, source = owner_job, None if owner_job is None else "owner_fallback"
            skip: Reason | None = gate
            if gate is None:
                skip = busy
                if skip is None:  # eligible: priced, then chosen or not
                    if not owner_priced:
                        skip = "owner_unpriced"
                    elif unpriced is not None:
                        skip = unpriced
                    else:
                        assert service is not None  # an owner job is the fallback
                        total = base_total + service
                        if total >= keep_ms:
                            skip = "cost_rejected"
                        else:
                            skip = "outranked"
                            if best is None or total < best[0] or (total == best[0] and order < best[1]):
                                best = (total, order, len(rows) - first, side, link, service)
                    if ready and (
                        idlest is None or idle > idlest[0] or (idle == idlest[0] and order < idlest[1])
                    ):
                        idlest = (idle, order, len(rows) - first, side, link, skip)
                if not ready and (owner_due is None or due_at < owner_due):
                    owner_due = due_at
            append((head, tail, "skipped", skip, service or 0.0, source, 0))
        if dead:  # the pairs it cannot weigh come first, as rows of their own
            dead_head: Head = (trigger, lane, owner_node, owner_model, count, backlog, 0.0, 0.0)
            rows[first:first] = [_unavailable_row(dead_head, link, "helper_unavailable") for link in dead]
            first += len(dead)
        if len(rows) == first:
            continue  # no helper to consider: no decision

        if best is not None:
            _total, _order, at_row, chosen, chosen_link, service = best
            assert owner_job is not None
            probe = False
            reason = None
            if service <= owner_job:
                slots = settings.offload_faster_helper_slots
            else:
                slots = settings.offload_slower_helper_slots
        elif idlest is not None:
            _idle, _order, at_row, chosen, chosen_link, reason = idlest
            service = None
            probe = True
            slots = settings.offload_probe_helper_slots
        else:
            if owner_due is not None and (due is None or owner_due < due):
                due = owner_due
            continue
        chosen_node, chosen_model, chosen_context, chosen_multimodal = chosen[0], chosen[19], chosen[5], chosen[6]
        chosen_switch = chosen[18]
        claimed.add(chosen_node)
        row_head, row_tail, _outcome, _reason, row_service, row_source, _slots = rows[first + at_row]
        rows[first + at_row] = (
            row_head, row_tail, "probe" if probe else "granted", reason, row_service, row_source, slots
        )
        leases.append(
            Lease(
                lane=lane,
                owner_node_id=owner_node,
                owner_model_id=owner_model,
                helper_node_id=chosen_node,
                helper_model_id=chosen_model,
                load_helper_model=chosen_link.load_if_unloaded,
                restore_helper_model=chosen_link.restore_after_borrow,
                helper_slots=slots,
                probe=probe,
                ttl_ms=ttl_ms,
                owner_job_ms=0.0 if probe or owner_job is None else owner_job,
                helper_switch_ms=0.0 if probe or chosen_switch is None else chosen_switch,
                helper_service_ms=0.0 if probe or service is None else service,
                helper_context=chosen_context if text else 0,
                helper_multimodal=chosen_multimodal,
            )
        )
    return due


def _unavailable_row(head: Head, link: Link, reason: Reason) -> CompactRow:
    """The plan row of a linked pair the master cannot weigh: the owner or the helper is unreachable
    or its model disabled or gone (skipped; ``head`` carries the owner's counts when it has them,
    every time 0)."""
    helper = link.helper
    return (head, (helper.node_id, helper.model_id, 0.0, 0.0, 0), "skipped", reason, 0.0, None, 0)


__all__ = ["UNLOADED_PROBE_FACTOR", "FactKey", "ModelFacts", "PlanResult", "displaced_configs", "plan"]
