"""The lease planner as it was before the scale rewrite (issue 24 item 3), kept unchanged as the
oracle of ``test_lending_planner_equivalence.py``: the fast planner must return the same leases,
plan rows and next probe instant on any input.  Do not edit it to match the planner; a behaviour
change belongs in both, deliberately.
Issue 21 changed one rule deliberately in both: pairs of an unreachable or disabled owner or
helper are written as ``owner_unavailable`` / ``helper_unavailable`` rows instead of left out.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping

from routerd.config.lending import LendingSettings
from routerd.lending.links import LinkSet
from routerd.lending.planner import FactKey, ModelFacts, PlanResult
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
from routerd.wire.status import RuntimeStatus

#: An unloaded helper waits this many times ``offload_probe_idle`` before a probe.
UNLOADED_PROBE_FACTOR = 12


class _NodeCosts:
    """One node's published costs, indexed for the lanes' sections."""

    __slots__ = ("models", "loads")

    def __init__(self, status: RuntimeStatus) -> None:
        self.models: dict[tuple[str, str], ModelCost] = {
            (c.model_id, c.section): c for c in status.costs.models
        }
        self.loads: dict[str, float] = {c.config_filename: c.load_ms for c in status.costs.loads}


class _HelperSide:
    """Everything about one helper model that does not depend on the owner (computed once a plan)."""

    __slots__ = (
        "endpoint", "facts", "accepting", "loaded", "idle_ms", "bar_ms", "switch", "restore",
        "fit", "move_unpriced", "recently_busy", "base_total",
    )  # fmt: skip

    def __init__(
        self,
        lane: Lane,
        section: str,
        endpoint: Endpoint,
        status: RuntimeStatus,
        facts: ModelFacts,
        node_costs: _NodeCosts,
        probe_idle_ms: float,
    ) -> None:
        lane_status = status.lane(lane)
        config = facts.config_filename
        self.endpoint = endpoint
        self.facts = facts
        self.accepting = lane_status.accepting_borrowed
        self.loaded = bool(config) and lane_status.active_config == config
        self.idle_ms = max(int(status.idle_for_ms), 0)
        self.bar_ms = probe_idle_ms if self.loaded else UNLOADED_PROBE_FACTOR * probe_idle_ms
        self.switch: float | None = 0.0
        self.restore: float | None = 0.0
        if not self.loaded:
            self.switch = node_costs.loads.get(config)
            for displaced in displaced_configs(status, lane, config):
                load = node_costs.loads.get(displaced)
                if load is None:
                    self.restore = None
                    break
                self.restore += load
        self.fit = node_costs.models.get((endpoint.model_id, section))
        self.move_unpriced: Reason | None = None
        #: switch + restore, when both are priced.
        self.base_total = 0.0
        if self.switch is not None and self.restore is not None:
            self.base_total = self.switch + self.restore
        if self.switch is None:
            self.move_unpriced = "switch_unpriced"
        elif self.restore is None:
            self.move_unpriced = "restore_unpriced"
        # Unloaded and busy with its own work more recently than the switch and the way back take.
        self.recently_busy = (
            not self.loaded
            and self.switch is not None
            and self.restore is not None
            and self.idle_ms < self.switch + self.restore
        )


class _Candidate:
    """One helper priced for one owner."""

    __slots__ = ("link", "side", "gate", "service", "source", "unpriced", "reason", "total")

    def __init__(
        self,
        link: Link,
        side: _HelperSide,
        gate: Reason | None,
        service: float | None,
        source: ServiceSource | None,
    ) -> None:
        self.link = link
        self.side = side
        self.gate = gate
        self.service = service
        self.source = source
        #: Ineligibility: a gate, else ``helper_recently_busy``, else None.
        self.reason: Reason | None = gate
        if gate is None and side.recently_busy:
            self.reason = "helper_recently_busy"
        # ``service`` is None only when the helper has no fit and the owner none either, so the
        # owner is unpriced and ``owner_unpriced`` is reported first: ``service_unpriced`` (kept in
        # the enumeration) is never produced under this rule order.
        self.unpriced: Reason | None = side.move_unpriced
        self.total = math.inf
        if self.unpriced is None and service is not None:
            self.total = side.base_total + service

    def order(self) -> tuple[str, str]:
        return (self.side.endpoint.node_id, self.side.endpoint.model_id)

    def skip_reason(self, owner_priced: bool, keep: float | None) -> Reason:
        """Why the cost rule did not choose this helper (first match)."""
        if self.reason is not None:
            return self.reason
        if not owner_priced:
            return "owner_unpriced"
        if self.unpriced is not None:
            return self.unpriced
        assert keep is not None
        return "cost_rejected" if self.total >= keep else "outranked"


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
    rows: list[PlanRow] = []
    due: float | None = None
    costs: dict[str, _NodeCosts] = {}
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
            costs,
            claimed,
            only_owners,
            leases,
            rows,
        )
        if lane_due is not None and (due is None or lane_due < due):
            due = lane_due
    return PlanResult(leases, rows, None if due is None else math.ceil(due))


def _node_costs(cache: dict[str, _NodeCosts], status: RuntimeStatus) -> _NodeCosts:
    found = cache.get(status.node_id)
    if found is None:
        found = cache[status.node_id] = _NodeCosts(status)
    return found


def _fast_predict(cost: ModelCost | None, work: list[float]) -> float | None:
    """:func:`predict` without the checks a plan has already made, for the common linear case."""
    if cost is None or cost.uniform_work is not None or len(work) != len(cost.slopes_ms):
        return predict(cost, work)
    total = cost.base_ms
    for slope, w in zip(cost.slopes_ms, work):  # noqa: B905 - lengths checked above
        if w > 0:
            total += slope * w
    return total


def _plan_lane(
    lane: Lane,
    trigger: Trigger,
    now_ms: int,
    link_set: LinkSet,
    statuses: Mapping[str, RuntimeStatus],
    settings: LendingSettings,
    facts: Mapping[FactKey, ModelFacts],
    costs: dict[str, _NodeCosts],
    claimed: set[str],
    only_owners: Collection[tuple[Lane, str, str]] | None,
    leases: list[Lease],
    rows: list[PlanRow],
) -> float | None:
    section = LANE_SECTION[lane]
    text = lane == "text"
    probe_idle_ms = settings.offload_probe_idle * 1000.0
    ttl_ms = int(round(settings.scheduling_grant_ttl * 1000.0))

    queues: dict[str, dict[str, QueueStat]] = {}
    owners: list[tuple[Endpoint, RuntimeStatus, ModelFacts, QueueStat]] = []
    for owner in link_set.owners():
        if only_owners is not None and (lane, owner.node_id, owner.model_id) not in only_owners:
            continue
        status = statuses.get(owner.node_id)
        owner_facts = facts.get((lane, owner.node_id, owner.model_id))
        if status is None or owner_facts is None or not owner_facts.eligible:
            # unreachable, or its model disabled or gone: every pair of it says so
            for link in link_set.helpers_of(owner):
                rows.append(_unavailable_row(trigger, lane, link, "owner_unavailable"))
            continue
        node_queue = queues.get(owner.node_id)
        if node_queue is None:
            node_queue = queues[owner.node_id] = {q.model_id: q for q in status.lane(lane).queue}
        stat = node_queue.get(owner.model_id)
        if stat is None or stat.pending_count <= 0:
            continue
        owners.append((owner, status, owner_facts, stat))
    # Biggest backlog first (work, then count), then node id and model id.
    owners.sort(
        key=lambda o: (-sum(o[3].backlog_work), -o[3].backlog_count, o[0].node_id, o[0].model_id)
    )

    sides: dict[Endpoint, _HelperSide | None] = {}
    for owner_links in (link_set.helpers_of(o[0]) for o in owners):
        for link in owner_links:
            helper = link.helper
            if helper in sides:
                continue
            status = statuses.get(helper.node_id)
            helper_facts = facts.get((lane, helper.node_id, helper.model_id))
            sides[helper] = None
            if status is not None and helper_facts is not None and helper_facts.eligible:
                node_costs = _node_costs(costs, status)
                sides[helper] = _HelperSide(
                    lane, section, helper, status, helper_facts, node_costs, probe_idle_ms
                )

    due: float | None = None
    for owner, owner_status, owner_facts, stat in owners:
        count = stat.pending_count
        mean_work = [w / count for w in stat.pending_work]
        mean_context = stat.pending_context / count
        owner_fit = _node_costs(costs, owner_status).models.get((owner.model_id, section))
        keep = predict_queue(owner_fit, stat.backlog_count, stat.backlog_work)
        owner_job = predict(owner_fit, mean_work)
        if text and not any(w > 0 for w in stat.pending_work):
            keep = owner_job = None  # no token profile: the queue has no size to price
        owner_priced = keep is not None and owner_job is not None

        candidates: list[_Candidate] = []
        unavailable: list[Link] = []
        for link in link_set.helpers_of(owner):
            side = sides[link.helper]
            if side is None:
                unavailable.append(link)  # its node unreachable, or its model disabled or gone
                continue
            gate: Reason | None = None
            if owner_facts.ineligible or side.facts.ineligible or (
                text and side.facts.multimodal != owner_facts.multimodal
            ):
                gate = "model_ineligible"
            elif not side.accepting:
                gate = "helper_not_accepting"
            elif link.helper.node_id in claimed:
                gate = "helper_claimed"
            elif not side.loaded and not link.load_if_unloaded:
                gate = "load_forbidden"
            elif text and mean_context > 0 and side.facts.context < mean_context:
                gate = "context_too_small"
            service = _fast_predict(side.fit, mean_work)
            source: ServiceSource | None = None
            if service is not None:
                source = "helper"
            elif owner_job is not None:
                service, source = owner_job, "owner_fallback"
            candidates.append(_Candidate(link, side, gate, service, source))
        for link in unavailable:
            rows.append(_unavailable_row(trigger, lane, link, "helper_unavailable", stat))
        if not candidates:
            continue

        chosen: _Candidate | None = None
        probe = False
        if owner_priced:
            assert keep is not None
            payable = [c for c in candidates if c.reason is None and c.total < keep]
            if payable:
                chosen = min(payable, key=lambda c: (c.total, c.order()))
        if chosen is None:
            idle = [c for c in candidates if c.reason is None and c.side.idle_ms >= c.side.bar_ms]
            if idle:
                chosen = min(idle, key=lambda c: (-c.side.idle_ms, c.order()))
                probe = True

        slots = 0
        if chosen is not None:
            helper = chosen.side.endpoint
            claimed.add(helper.node_id)
            if probe:
                slots = settings.offload_probe_helper_slots
            else:
                assert chosen.service is not None and owner_job is not None
                if chosen.service <= owner_job:
                    slots = settings.offload_faster_helper_slots
                else:
                    slots = settings.offload_slower_helper_slots
            leases.append(
                Lease(
                    lane=lane,
                    owner_node_id=owner.node_id,
                    owner_model_id=owner.model_id,
                    helper_node_id=helper.node_id,
                    helper_model_id=helper.model_id,
                    load_helper_model=chosen.link.load_if_unloaded,
                    restore_helper_model=chosen.link.restore_after_borrow,
                    helper_slots=slots,
                    probe=probe,
                    ttl_ms=ttl_ms,
                    owner_job_ms=0.0 if probe or owner_job is None else owner_job,
                    helper_switch_ms=0.0 if probe or chosen.side.switch is None else chosen.side.switch,
                    helper_service_ms=0.0 if probe or chosen.service is None else chosen.service,
                    helper_context=chosen.side.facts.context if text else 0,
                    helper_multimodal=chosen.side.facts.multimodal,
                )
            )
        else:
            for c in candidates:
                if c.gate is None and c.side.idle_ms < c.side.bar_ms:
                    at = now_ms + c.side.bar_ms - c.side.idle_ms
                    if due is None or at < due:
                        due = at

        keep_ms = keep or 0.0
        owner_job_ms = owner_job or 0.0
        for c in candidates:
            if c is chosen:
                outcome: Outcome = "probe" if probe else "granted"
                reason = c.skip_reason(owner_priced, keep) if probe else None
            else:
                outcome = "skipped"
                reason = c.skip_reason(owner_priced, keep)
            helper = c.side.endpoint
            rows.append(
                PlanRow(
                    trigger,
                    lane,
                    owner.node_id,
                    owner.model_id,
                    helper.node_id,
                    helper.model_id,
                    outcome,
                    reason,
                    count,
                    stat.backlog_count,
                    keep_ms,
                    c.side.switch or 0.0,
                    c.side.restore or 0.0,
                    c.service or 0.0,
                    owner_job_ms,
                    c.source,
                    c.side.idle_ms,
                    slots if c is chosen else 0,
                )
            )
    return due


def _unavailable_row(trigger: Trigger, lane: Lane, link: Link, reason: Reason,
                     stat: QueueStat | None = None) -> PlanRow:
    """The plan row of a linked pair the master cannot weigh: the owner or the helper is unreachable
    or its model disabled or gone (skipped, with the owner's counts when it has them)."""
    owner, helper = link.owner, link.helper
    pending = stat.pending_count if stat is not None else 0
    backlog = stat.backlog_count if stat is not None else 0
    return PlanRow(trigger, lane, owner.node_id, owner.model_id, helper.node_id, helper.model_id, "skipped",
                   reason, pending, backlog, 0.0, 0.0, 0.0, 0.0, 0.0, None, 0, 0)


__all__ = ["plan"]
