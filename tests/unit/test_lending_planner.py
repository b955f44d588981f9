"""The lease planner (spec "Pricing", "Probes"; reference §4.3–4.4 and scenarios §10 P 32–47)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs
import pytest

from routerd.config.lending import LendingSettings
from routerd.lending.links import LinkSet
from routerd.lending.planner import ModelFacts, PlanResult, displaced_configs, plan
from routerd.lending.queue import LaneQueue
from routerd.wire.lending import (
    Costs,
    Endpoint,
    Lane,
    LaneStatus,
    Lease,
    Link,
    LoadCost,
    ModelCost,
    PlanRow,
    QueueStat,
)
from routerd.wire.status import RuntimeStatus

S = 1000  # ms per second
NOW = 1_000_000
SETTINGS = LendingSettings()


def fit(model: str, ms: float, lane: Lane = "image") -> ModelCost:
    """A fit whose every job costs ``ms`` regardless of its work."""
    if lane == "text":
        return ModelCost(model, "llm", ms, (0.0, 0.0), 20)
    return ModelCost(model, "image", ms, (0.0,), 20)


def queue(model: str, pending: int, admitted: int = 2, lane: Lane = "image", context: int = 0) -> QueueStat:
    width = 2 if lane == "text" else 1
    return QueueStat(
        model, pending, (float(pending),) * width, context * pending, pending + admitted,
        (float(pending + admitted),) * width,
    )  # fmt: skip


def node(
    node_id: str,
    *,
    lane: Lane = "image",
    idle_s: float = 0.0,
    active: str = "",
    accepting: bool = True,
    stats: Sequence[QueueStat] = (),
    fits: Sequence[ModelCost] = (),
    loads: Mapping[str, float] | None = None,
    mode: str = "llama_sdcpp",
    other_active: str = "",
) -> RuntimeStatus:
    other: Lane = "text" if lane == "image" else "image"
    return RuntimeStatus(
        node_id,
        backend_mode=mode,
        idle_for_ms=int(idle_s * S),
        lanes={
            lane: LaneStatus(accepting, active, tuple(stats)),
            other: LaneStatus(True, other_active, ()),
        },
        costs=Costs(
            models=tuple(fits),
            loads=tuple(LoadCost(name, ms, 3) for name, ms in (loads or {}).items()),
        ),
    )


def link(owner: str, helper: str, load: bool = True, restore: bool = False) -> Link:
    on, om = owner.split("/")
    hn, hm = helper.split("/")
    return Link(Endpoint(on, om), Endpoint(hn, hm), load, restore)


def facts(lane: Lane = "image", **extra: ModelFacts) -> dict[tuple[Lane, str, str], ModelFacts]:
    out = {
        (lane, "owner", "A"): ModelFacts("a.kcpps", 8192),
        (lane, "helper", "B"): ModelFacts("b.kcpps", 8192),
        (lane, "helper2", "C"): ModelFacts("c.kcpps", 8192),
        (lane, "owner2", "D"): ModelFacts("d.kcpps", 8192),
    }
    for key, value in extra.items():
        node_id, model_id = key.split("__")
        out[(lane, node_id, model_id)] = value
    return out


def pair(
    *,
    pending: int = 16,
    owner_job: float | None = 8 * S,
    helper_job: float | None = 8 * S,
    load_ms: float | None = 19 * S,
    loaded: bool = False,
    idle_s: float = 120.0,
    accepting: bool = True,
    load_if_unloaded: bool = True,
    restore: bool = False,
    settings: LendingSettings = SETTINGS,
    trigger: str = "enqueued",
) -> PlanResult:
    """One owner (owner/A) linked to one helper (helper/B) on the image lane."""
    owner = node("owner", stats=[queue("A", pending)], fits=[fit("A", owner_job)] if owner_job else [])
    helper = node(
        "helper",
        idle_s=idle_s,
        active="b.kcpps" if loaded else "",
        accepting=accepting,
        fits=[fit("B", helper_job)] if helper_job else [],
        loads={} if load_ms is None else {"b.kcpps": load_ms},
    )
    links = LinkSet.build("image", [link("owner/A", "helper/B", load_if_unloaded, restore)])
    return plan(
        trigger,  # type: ignore[arg-type]
        NOW,
        [links],
        {"owner": owner, "helper": helper},
        settings,
        facts(),
    )


def only_row(result: PlanResult) -> PlanRow:
    assert len(result.rows) == 1
    return result.rows[0]


# -- the cost rule --------------------------------------------------------------------------------------


def test_deep_backlog_pays_for_a_helper_load_and_the_lease_names_both_models_and_link_flags() -> None:
    result = pair(pending=16, restore=True)
    assert result.leases == [
        Lease(
            lane="image",
            owner_node_id="owner",
            owner_model_id="A",
            helper_node_id="helper",
            helper_model_id="B",
            load_helper_model=True,
            restore_helper_model=True,
            helper_slots=2,
            probe=False,
            ttl_ms=30_000,
            owner_job_ms=8 * S,
            helper_switch_ms=19 * S,
            helper_service_ms=8 * S,
        )
    ]
    row = only_row(result)
    assert (row.outcome, row.reason, row.slots) == ("granted", None, 2)
    assert (row.pending_count, row.backlog_count) == (16, 18)
    assert (row.keep_ms, row.switch_ms, row.service_ms, row.owner_job_ms) == (144 * S, 19 * S, 8 * S, 8 * S)
    assert row.service_source == "helper" and row.trigger == "enqueued"
    assert result.next_probe_due_ms is None


def test_shallow_backlog_does_not_pay_for_a_load() -> None:
    result = pair(pending=1, idle_s=30)  # keep 3 × 8 s = 24 s < 19 s + 8 s
    assert result.leases == []
    row = only_row(result)
    assert (row.outcome, row.reason, row.keep_ms) == ("skipped", "cost_rejected", 24 * S)


def test_a_loaded_helper_pays_off_even_for_one_waiting_request() -> None:
    result = pair(pending=1, loaded=True, idle_s=0)
    assert [lease.helper_switch_ms for lease in result.leases] == [0.0]
    assert only_row(result).outcome == "granted"


def test_a_link_that_forbids_loading_only_lends_to_a_loaded_helper() -> None:
    refused = pair(load_if_unloaded=False)
    assert refused.leases == [] and only_row(refused).reason == "load_forbidden"
    granted = pair(load_if_unloaded=False, loaded=True)
    assert [lease.load_helper_model for lease in granted.leases] == [False]


def test_a_helper_config_without_measured_loads_is_unpriced() -> None:
    result = pair(load_ms=None, idle_s=30)
    assert result.leases == [] and only_row(result).reason == "switch_unpriced"


def test_an_unfitted_helper_is_priced_with_the_owner_fit_until_it_has_its_own() -> None:
    fallback = only_row(pair(helper_job=None))
    assert (fallback.service_source, fallback.service_ms, fallback.slots) == ("owner_fallback", 8 * S, 2)
    own = only_row(pair(helper_job=3 * S))
    assert (own.service_source, own.service_ms) == ("helper", 3 * S)


def test_a_helper_at_least_as_fast_per_job_gets_two_slots_a_slower_one_gets_one() -> None:
    assert [lease.helper_slots for lease in pair(owner_job=28 * S, helper_job=11 * S).leases] == [2]
    assert [lease.helper_slots for lease in pair(owner_job=8 * S, helper_job=8 * S).leases] == [2]
    slower = pair(pending=4, owner_job=8 * S, helper_job=12 * S, loaded=True)
    assert [lease.helper_slots for lease in slower.leases] == [1]
    assert only_row(slower).outcome == "granted"


def test_slot_counts_come_from_the_settings() -> None:
    tuned = LendingSettings(offload_faster_helper_slots=5, offload_slower_helper_slots=3)
    assert [x.helper_slots for x in pair(owner_job=28 * S, helper_job=11 * S, settings=tuned).leases] == [5]
    slower = pair(pending=4, helper_job=12 * S, loaded=True, settings=tuned)
    assert [x.helper_slots for x in slower.leases] == [3]


def test_a_probe_lease_gets_offload_probe_helper_slots() -> None:
    """``offload_probe_helper_slots`` sets how many requests a probe may lend (default 1)."""
    unpriced = {"owner_job": None, "helper_job": None, "loaded": True, "idle_s": 60}
    assert [(x.probe, x.helper_slots) for x in pair(pending=1, **unpriced).leases] == [(True, 1)]
    tuned = LendingSettings(offload_probe_helper_slots=3)
    tuned_leases = pair(pending=1, settings=tuned, **unpriced).leases
    assert [(x.probe, x.helper_slots) for x in tuned_leases] == [(True, 3)]


def test_the_lease_lifetime_is_the_grant_ttl() -> None:
    result = pair(settings=LendingSettings(scheduling_grant_ttl=7.5))
    assert [lease.ttl_ms for lease in result.leases] == [7500]


# -- restore pricing ------------------------------------------------------------------------------------


def _displacing(
    displaced_ms: float | None, pending: int = 16, idle_s: float = 300.0, mode: str = "llama_sdcpp"
) -> PlanResult:
    loads: dict[str, float] = {"b.kcpps": 19 * S}
    if displaced_ms is not None:
        loads["own.kcpps"] = displaced_ms
    active, other = ("own.kcpps", "") if mode != "kobold" else ("", "own.kcpps")
    helper = node(
        "helper",
        idle_s=idle_s,
        active=active,
        other_active=other,
        fits=[fit("B", 8 * S)],
        loads=loads,
        mode=mode,
    )
    owner = node("owner", stats=[queue("A", pending)], fits=[fit("A", 8 * S)])
    links = [LinkSet.build("image", [link("owner/A", "helper/B")])]
    return plan("tick", NOW, links, {"owner": owner, "helper": helper}, SETTINGS, facts())


def test_the_reload_of_the_displaced_model_is_part_of_the_price() -> None:
    row = only_row(_displacing(30 * S))
    assert (row.outcome, row.switch_ms, row.restore_ms, row.service_ms) == ("granted", 19 * S, 30 * S, 8 * S)
    rejected = only_row(_displacing(130 * S))  # 19 + 130 + 8 > keep 144: only a probe (idle 300 s)
    assert (rejected.outcome, rejected.reason) == ("probe", "cost_rejected")


def test_a_displaced_model_without_measured_loads_makes_the_helper_restore_unpriced() -> None:
    row = only_row(_displacing(None, idle_s=50))
    assert (row.outcome, row.reason) == ("skipped", "restore_unpriced")
    probe = only_row(_displacing(None, idle_s=300))  # unpriced pairs are still probed
    assert (probe.outcome, probe.reason) == ("probe", "restore_unpriced")


def test_a_helper_busy_with_own_work_more_recently_than_switch_and_return_is_skipped() -> None:
    row = only_row(_displacing(30 * S, idle_s=40.0))  # idle 40 s < 19 s + 30 s
    assert (row.outcome, row.reason, row.helper_idle_ms) == ("skipped", "helper_recently_busy", 40 * S)


def test_only_the_lane_runtime_is_displaced_unless_one_process_serves_every_lane() -> None:
    status = node("h", active="x.kcpps", other_active="y.kcpps")
    status = attrs.evolve(status, active_stt_config="w.kcpps")
    assert displaced_configs(status, "image", "b.kcpps") == ["x.kcpps"]
    assert displaced_configs(status, "image", "x.kcpps") == []
    kobold = attrs.evolve(status, backend_mode="kobold")
    assert displaced_configs(kobold, "image", "b.kcpps") == ["x.kcpps", "y.kcpps", "w.kcpps"]
    row = only_row(_displacing(30 * S, mode="kobold"))
    assert row.restore_ms == 30 * S


# -- probes ---------------------------------------------------------------------------------------------


def test_an_idle_unloaded_helper_gets_a_probe_after_twelve_times_the_probe_idle() -> None:
    probed = pair(pending=1, idle_s=60)
    assert [(x.probe, x.helper_slots) for x in probed.leases] == [(True, 1)]
    row = only_row(probed)
    assert (row.outcome, row.reason, row.slots) == ("probe", "cost_rejected", 1)
    waiting = pair(pending=1, idle_s=30)
    assert waiting.leases == []
    assert waiting.next_probe_due_ms == NOW + 30 * S


def test_a_helper_idle_less_than_switch_and_return_is_neither_granted_nor_probed() -> None:
    result = pair(pending=1, idle_s=4)
    assert result.leases == []
    row = only_row(result)
    assert (row.reason, row.helper_idle_ms) == ("helper_recently_busy", 4 * S)


def test_the_next_probe_falls_due_when_the_helper_has_idled_long_enough() -> None:
    result = pair(pending=1, idle_s=3)
    assert result.leases == []
    assert result.next_probe_due_ms == NOW + 57 * S
    loaded = pair(pending=1, owner_job=None, helper_job=None, loaded=True, idle_s=3)
    assert loaded.next_probe_due_ms == NOW + 2 * S


def test_a_loaded_helper_is_probed_after_the_probe_idle_even_with_nothing_priced() -> None:
    result = pair(pending=1, owner_job=None, helper_job=None, loaded=True, idle_s=60)
    assert [(x.probe, x.owner_job_ms, x.helper_service_ms) for x in result.leases] == [(True, 0.0, 0.0)]
    row = only_row(result)
    assert (row.outcome, row.reason) == ("probe", "owner_unpriced")
    assert pair(pending=1, owner_job=None, loaded=True, idle_s=5).leases[0].probe


def test_a_helper_not_accepting_borrowed_work_is_skipped_without_a_probe_timer() -> None:
    result = pair(accepting=False, idle_s=1)
    assert result.leases == []
    assert only_row(result).reason == "helper_not_accepting"
    assert result.next_probe_due_ms is None


def test_the_probe_idle_setting_scales_the_probe_bar() -> None:
    tuned = LendingSettings(offload_probe_idle=2.0)
    assert pair(pending=1, idle_s=24, settings=tuned).leases[0].probe
    assert pair(pending=1, idle_s=23, settings=tuned).next_probe_due_ms == NOW + 1 * S


# -- several helpers and owners -------------------------------------------------------------------------


def _two_helpers(c_job: float, b_job: float = 8 * S, c_idle: float = 120.0) -> PlanResult:
    owner = node("owner", stats=[queue("A", 16)], fits=[fit("A", 8 * S)])
    b = node("helper", idle_s=120, fits=[fit("B", b_job)], loads={"b.kcpps": 19 * S})
    c = node("helper2", idle_s=c_idle, fits=[fit("C", c_job)], loads={"c.kcpps": 19 * S})
    links = LinkSet.build("image", [link("owner/A", "helper/B"), link("owner/A", "helper2/C")])
    return plan("completed", NOW, [links], {"owner": owner, "helper": b, "helper2": c}, SETTINGS, facts())


def test_the_cheaper_of_two_helpers_is_granted_and_the_other_is_outranked() -> None:
    result = _two_helpers(c_job=5 * S)
    assert [x.helper_node_id for x in result.leases] == ["helper2"]
    outcomes = {(r.helper_node_id, r.outcome, r.reason, r.trigger) for r in result.rows}
    assert outcomes == {
        ("helper", "skipped", "outranked", "completed"),
        ("helper2", "granted", None, "completed"),
    }


def test_equal_helpers_are_broken_by_node_id() -> None:
    result = _two_helpers(c_job=8 * S)
    assert [x.helper_node_id for x in result.leases] == ["helper"]


def test_the_longest_idle_helper_gets_the_probe() -> None:
    owner = node("owner", stats=[queue("A", 1)], fits=[fit("A", 8 * S)])
    b = node("helper", idle_s=70, fits=[fit("B", 8 * S)], loads={"b.kcpps": 19 * S})
    c = node("helper2", idle_s=90, fits=[fit("C", 8 * S)], loads={"c.kcpps": 19 * S})
    links = LinkSet.build("image", [link("owner/A", "helper/B"), link("owner/A", "helper2/C")])
    result = plan("tick", NOW, [links], {"owner": owner, "helper": b, "helper2": c}, SETTINGS, facts())
    assert [(x.helper_node_id, x.probe) for x in result.leases] == [("helper2", True)]
    assert {(r.helper_node_id, r.outcome) for r in result.rows} == {
        ("helper", "skipped"),
        ("helper2", "probe"),
    }


def _shared_helper(a_pending: int, d_pending: int) -> PlanResult:
    a = node("owner", stats=[queue("A", a_pending)], fits=[fit("A", 8 * S)])
    d = node("owner2", stats=[queue("D", d_pending)], fits=[fit("D", 8 * S)])
    b = node("helper", idle_s=120, fits=[fit("B", 8 * S)], loads={"b.kcpps": 19 * S})
    links = LinkSet.build("image", [link("owner/A", "helper/B"), link("owner2/D", "helper/B")])
    return plan("tick", NOW, [links], {"owner": a, "owner2": d, "helper": b}, SETTINGS, facts())


def test_a_helper_node_serves_only_the_owner_with_the_bigger_backlog() -> None:
    result = _shared_helper(10, 20)
    assert [x.owner_node_id for x in result.leases] == ["owner2"]
    claimed = [r for r in result.rows if r.owner_node_id == "owner"]
    assert [(r.outcome, r.reason) for r in claimed] == [("skipped", "helper_claimed")]
    assert [x.owner_node_id for x in _shared_helper(20, 10).leases] == ["owner"]


def test_a_claimed_helper_sets_no_probe_timer() -> None:
    assert _shared_helper(10, 20).next_probe_due_ms is None


def test_leases_in_force_claim_their_helper_when_only_some_owners_are_planned() -> None:
    a = node("owner", stats=[queue("A", 16)], fits=[fit("A", 8 * S)])
    d = node("owner2", stats=[queue("D", 20)], fits=[fit("D", 8 * S)])
    b = node("helper", idle_s=120, fits=[fit("B", 8 * S)], loads={"b.kcpps": 19 * S})
    links = [LinkSet.build("image", [link("owner/A", "helper/B"), link("owner2/D", "helper/B")])]
    statuses = {"owner": a, "owner2": d, "helper": b}
    held = Lease("image", "owner2", "D", "helper", "B", True, False, 2, False, 30000)
    only_a: set[tuple[Lane, str, str]] = {("image", "owner", "A")}
    result = plan("enqueued", NOW, links, statuses, SETTINGS, facts(), in_force=[held], only_owners=only_a)
    assert result.leases == []
    assert [(r.owner_node_id, r.reason) for r in result.rows] == [("owner", "helper_claimed")]
    replanned = plan("enqueued", NOW, links, statuses, SETTINGS, facts(), in_force=[held])
    assert [x.owner_node_id for x in replanned.leases] == ["owner2"]  # the whole book is replanned


# -- what is left out -----------------------------------------------------------------------------------


def test_owners_without_waiting_work_are_not_planned() -> None:
    result = pair(pending=0)
    assert result == PlanResult([], [], None)


def test_no_links_no_plan_and_unreachable_nodes_still_write_their_pairs_rows() -> None:
    assert plan("tick", NOW, [], {}, SETTINGS, {}) == PlanResult([], [], None)
    links = [LinkSet.build("image", [link("owner/A", "helper/B")])]
    result = plan("tick", NOW, links, {}, SETTINGS, facts())
    assert result.leases == [] and result.next_probe_due_ms is None
    assert [(r.owner_node_id, r.helper_node_id, r.outcome, r.reason) for r in result.rows] == [
        ("owner", "helper", "skipped", "owner_unavailable")]


def test_every_linked_pair_gets_a_row_even_when_its_owner_or_helper_is_unavailable() -> None:
    """Issue 21 §3: one plan row per owner and helper pair per decision; a pair whose helper (or
    owner) is unreachable, disabled or gone is skipped with a reason instead of left out."""
    owner = node("owner", stats=[queue("A", 16)], fits=[fit("A", 8 * S)])
    helper = node("helper", idle_s=120, fits=[fit("B", 8 * S)], loads={"b.kcpps": 19 * S})
    links = [LinkSet.build("image", [link("owner/A", "helper/B")])]
    statuses = {"owner": owner, "helper": helper}
    gone = facts(helper__B=ModelFacts("b.kcpps", eligible=False))
    row = only_row(plan("tick", NOW, links, statuses, SETTINGS, gone))
    assert (row.outcome, row.reason, row.pending_count) == ("skipped", "helper_unavailable", 16)
    unreachable = plan("tick", NOW, links, {"owner": owner}, SETTINGS, facts())
    assert (only_row(unreachable).reason, unreachable.leases) == ("helper_unavailable", [])
    unknown = {k: v for k, v in facts().items() if k[1] != "owner"}
    assert only_row(plan("tick", NOW, links, statuses, SETTINGS, unknown)).reason == "owner_unavailable"
    disabled = facts(owner__A=ModelFacts("a.kcpps", eligible=False))
    assert only_row(plan("tick", NOW, links, statuses, SETTINGS, disabled)).reason == "owner_unavailable"


def test_uniform_fits_price_only_work_like_their_samples() -> None:
    uniform = ModelCost("A", "image", 8 * S, (0.0,), 20, uniform_work=(1.0,))
    owner = node("owner", stats=[queue("A", 16)], fits=[uniform])
    helper = node("helper", idle_s=120, fits=[fit("B", 8 * S)], loads={"b.kcpps": 19 * S})
    links = [LinkSet.build("image", [link("owner/A", "helper/B")])]
    ok = plan("tick", NOW, links, {"owner": owner, "helper": helper}, SETTINGS, facts())
    assert only_row(ok).outcome == "granted"
    bigger = attrs.evolve(uniform, uniform_work=(5.0,))
    owner = node("owner", stats=[queue("A", 16)], fits=[bigger])
    off = plan("tick", NOW, links, {"owner": owner, "helper": helper}, SETTINGS, facts())
    assert only_row(off).reason == "owner_unpriced"


# -- text lane ------------------------------------------------------------------------------------------


def _text(window: int, mean_context: int = 6000, idle_s: float = 120.0, sized: bool = True) -> PlanResult:
    stat = queue("A", 16, lane="text", context=mean_context)
    if not sized:
        stat = attrs.evolve(stat, pending_work=(0.0, 0.0), pending_context=0)
    owner = node("owner", lane="text", stats=[stat], fits=[fit("A", 8 * S, "text")])
    helper = node(
        "helper", lane="text", idle_s=idle_s, fits=[fit("B", 8 * S, "text")], loads={"b.kcpps": 19 * S}
    )
    links = [LinkSet.build("text", [link("owner/A", "helper/B")])]
    known = facts("text", helper__B=ModelFacts("b.kcpps", window))
    return plan("enqueued", NOW, links, {"owner": owner, "helper": helper}, SETTINGS, known)


def test_a_text_helper_whose_window_cannot_hold_the_mean_request_gets_no_lease_and_no_probe() -> None:
    small = _text(4096)
    assert small.leases == [] and small.next_probe_due_ms is None
    assert only_row(small).reason == "context_too_small"
    big = _text(8192)
    assert [(x.lane, x.probe) for x in big.leases] == [("text", False)]


def test_a_text_queue_without_a_size_estimate_is_unpriced_and_only_probed() -> None:
    result = _text(8192, sized=False)
    assert [x.probe for x in result.leases] == [True]
    assert only_row(result).reason == "owner_unpriced"


def test_multimodal_and_text_only_models_are_never_paired() -> None:
    stat = queue("A", 16, lane="text", context=100)
    owner = node("owner", lane="text", stats=[stat], fits=[fit("A", 8 * S, "text")])
    helper = node(
        "helper", lane="text", idle_s=120, fits=[fit("B", 8 * S, "text")], loads={"b.kcpps": 19 * S}
    )
    links = [LinkSet.build("text", [link("owner/A", "helper/B")])]
    known = facts("text", helper__B=ModelFacts("b.kcpps", 8192, multimodal=True))
    result = plan("tick", NOW, links, {"owner": owner, "helper": helper}, SETTINGS, known)
    assert result.leases == [] and result.next_probe_due_ms is None
    assert (only_row(result).outcome, only_row(result).reason) == ("skipped", "model_ineligible")


def test_lanes_are_planned_separately_with_their_own_claims() -> None:
    owner = RuntimeStatus(
        "owner",
        lanes={
            "image": LaneStatus(True, "", (queue("A", 16),)),
            "text": LaneStatus(True, "", (queue("A", 16, lane="text"),)),
        },
        costs=Costs(models=(fit("A", 8 * S), fit("A", 8 * S, "text"))),
    )
    helper = RuntimeStatus(
        "helper",
        idle_for_ms=120 * S,
        lanes={"image": LaneStatus(True, "b.kcpps", ()), "text": LaneStatus(True, "b.kcpps", ())},
        costs=Costs(models=(fit("B", 8 * S), fit("B", 8 * S, "text"))),
    )
    links = [
        LinkSet.build("text", [link("owner/A", "helper/B")]),
        LinkSet.build("image", [link("owner/A", "helper/B")]),
    ]
    known = {**facts("image"), **facts("text")}
    result = plan("tick", NOW, links, {"owner": owner, "helper": helper}, SETTINGS, known)
    assert [x.lane for x in result.leases] == ["image", "text"]


# -- the spec's ten-request flow ------------------------------------------------------------------------


@pytest.mark.parametrize(("helper_job", "slots"), [(8 * S, 2), (6 * S, 2), (10 * S, 1)])
def test_ten_requests_two_in_the_backend_and_the_helper_gets_two_or_one(
    helper_job: float, slots: int
) -> None:
    q = LaneQueue("image", SETTINGS.scheduling_backend_depth, enrolled={"A"}, owners={"A"})
    admitted = [rid for i in range(10) for rid in q.arrive(f"r{i}", "A", NOW + i, work=(1.0,)).admit]
    assert admitted == ["r0", "r1"]
    owner = node("owner", stats=q.stats(), fits=[fit("A", 8 * S)])
    helper = node("helper", idle_s=0, active="b.kcpps", fits=[fit("B", helper_job)])
    links = [LinkSet.build("image", [link("owner/A", "helper/B")])]
    result = plan("enqueued", NOW, links, {"owner": owner, "helper": helper}, SETTINGS, facts())
    (lease,) = result.leases
    assert lease.helper_slots == slots
    lent = q.withdraw_for_lending("A", lease.slots() - q.lent_count("A"), NOW, "helper", "B")
    assert len(lent) == slots
    assert len(q.admitted()) == 2  # the owner's pipe never moves
    assert q.stats()[0].pending_count == 8 - slots
    # a result comes back: the owner is topped up from the held requests
    assert q.finished("r0", NOW + 8 * S).admit == (q.admitted()[-1].request_id,)
