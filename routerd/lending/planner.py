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

A lane is planned on arrays by :mod:`routerd.lending.plan_lane` (thousands of pairs a plan on a
big site), from columns read by :mod:`routerd.lending.plan_columns`; the inputs' types live in
:mod:`routerd.lending.plan_inputs`.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence

import attrs

from routerd.config.lending import LendingSettings
from routerd.lending.links import LinkSet
from routerd.lending.plan_inputs import UNLOADED_PROBE_FACTOR, FactKey, ModelFacts, displaced_configs
from routerd.wire.lending import LANES, Lane, Lease, PlanRow, Trigger
from routerd.wire.plan_rows import PlanRows
from routerd.wire.status import RuntimeStatus


@attrs.frozen
class PlanResult:
    leases: list[Lease]
    #: One row per linked pair planned (a :class:`~routerd.wire.plan_rows.PlanRows` from :func:`plan`).
    rows: Sequence[PlanRow]
    next_probe_due_ms: int | None


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
    # numpy (the lane planner's arrays) is imported the first time a master plans, not at a node's
    # start (tests/integration/test_cli_process.py: a node's start time and idle memory)
    from routerd.lending.plan_lane import plan_lane

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
        lane_plan = plan_lane(
            lane, trigger, now_ms, link_set, statuses, settings, facts, claimed, only_owners
        )
        leases.extend(lane_plan.leases)
        for chunk in lane_plan.chunks:
            rows.add(chunk)
        lane_due = lane_plan.due
        if lane_due is not None and (due is None or lane_due < due):
            due = lane_due
    return PlanResult(leases, rows, None if due is None else math.ceil(due))


__all__ = ["UNLOADED_PROBE_FACTOR", "FactKey", "ModelFacts", "PlanResult", "displaced_configs", "plan"]
