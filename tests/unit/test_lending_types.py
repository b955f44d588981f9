"""Lending wire types: contract field names, JSON round trips, enumerations (contract §6, §8)."""

from __future__ import annotations

import json

import attrs
import pytest
from cattrs.errors import ClassValidationError
from hypothesis import given
from hypothesis import strategies as st

from routerd.wire.lending import (
    OUTCOMES,
    REASONS,
    TRIGGERS,
    Costs,
    Endpoint,
    HeldRequest,
    LaneStatus,
    Lease,
    Link,
    LoadCost,
    ModelCost,
    PlanRow,
    QueueStat,
    TokenProfile,
    from_json,
    to_json,
)
from routerd.wire.status import RuntimeStatus


def names(cls: type) -> list[str]:
    return [f.name for f in attrs.fields(cls)]


def test_field_names_are_exactly_the_contracts() -> None:
    assert names(Lease) == [
        "lane", "owner_node_id", "owner_model_id", "helper_node_id", "helper_model_id",
        "load_helper_model", "restore_helper_model", "helper_slots", "probe", "ttl_ms",
        "owner_job_ms", "helper_switch_ms", "helper_service_ms",
        # additive: the per-request gates at withdrawal (reference §6/§7)
        "helper_context", "helper_multimodal",
    ]  # fmt: skip
    assert names(Link) == ["owner", "helper", "load_if_unloaded", "restore_after_borrow"]
    assert names(QueueStat) == [
        "model_id", "pending_count", "pending_work", "pending_context", "backlog_count", "backlog_work",
    ]  # fmt: skip
    assert names(LaneStatus) == ["accepting_borrowed", "active_config", "queue"]
    assert names(ModelCost) == ["model_id", "section", "base_ms", "slopes_ms", "samples", "uniform_work"]
    assert names(LoadCost) == ["config_filename", "load_ms", "samples"]
    assert names(TokenProfile) == [
        "model_id", "conservative_bytes_per_token", "reserved_output_tokens", "samples",
        "overhead_bytes", "marginal_bytes_per_token",
    ]  # fmt: skip
    assert names(RuntimeStatus) == [
        "node_id", "build_version", "backend_mode", "active_requests", "queued_requests",
        "active_stt_config", "idle_for_ms", "settings_fingerprint", "lanes", "costs",
    ]  # fmt: skip
    assert names(HeldRequest) == [
        "request_id", "lane", "model_id", "state", "waiting_ms", "helper_node_id", "helper_model_id",
        "priority", "key_name",
    ]  # fmt: skip


def test_plan_rows_fill_offload_decisions_columns() -> None:
    decision_columns = (
        "id, recorded_at, node_id, kind, trigger, lane, owner_node_id, owner_model_id, helper_node_id, "
        "helper_model_id, outcome, reason, request_id, pending_count, backlog_count, keep_ms, switch_ms, "
        "restore_ms, service_ms, owner_job_ms, service_source, helper_idle_ms, slots, lent_out, "
        "borrowed_ahead, wait_ms, router_version"
    ).split(", ")
    row = PlanRow("tick", "image", "m", "a", "s", "b", "skipped", "cost_rejected")
    columns = row.columns()
    assert set(columns) <= set(decision_columns)
    assert columns["kind"] == "plan"
    assert PlanRow("tick", "image", "m", "a", "s", "b", "granted").columns()["reason"] == ""


def test_enumerations_are_the_spec_and_contract_values() -> None:
    assert set(TRIGGERS) == {"enqueued", "completed", "borrowed_completed", "probe_due", "tick"}
    assert set(OUTCOMES) == {"granted", "probe", "skipped"}
    assert set(REASONS) == {
        "owner_unpriced", "switch_unpriced", "restore_unpriced", "service_unpriced", "cost_rejected",
        "outranked", "helper_not_accepting", "helper_claimed", "load_forbidden", "context_too_small",
        "helper_recently_busy", "model_ineligible", "owner_unavailable", "helper_unavailable",
    }  # fmt: skip


def test_a_status_round_trips_through_json_text() -> None:
    status = RuntimeStatus(
        "slave",
        build_version="1.0",
        idle_for_ms=1234,
        lanes={
            "image": LaneStatus(True, "b.kcpps", (QueueStat("flux", 2, (10.0,), 0, 3, (15.0,)),)),
            "text": LaneStatus(False, "", ()),
        },
        costs=Costs(
            models=(
                ModelCost("flux", "image", 100.0, (0.0,), 20, (5.0,)),
                ModelCost("chat", "llm", 10.0, (0.5, 20.0), 30),
            ),
            loads=(LoadCost("b.kcpps", 19000.0, 4),),
            tokens=(TokenProfile("chat", 3.5, 300, 20),),
        ),
    )
    data = json.loads(json.dumps(to_json(status)))
    assert data["lanes"]["image"]["queue"][0]["pending_work"] == [10.0]
    assert "uniform_work" not in data["costs"]["models"][1]
    assert from_json(data, RuntimeStatus) == status


def test_unknown_keys_are_ignored_and_missing_optional_ones_default() -> None:
    data = {"node_id": "n", "surprise": 1, "lanes": {"text": {"accepting_borrowed": True}}}
    status = from_json(data, RuntimeStatus)
    assert status.lane("text").accepting_borrowed
    assert status.lane("image") == LaneStatus()


def test_a_bad_enumeration_value_is_refused() -> None:
    lease = to_json(Lease("image", "m", "a", "s", "b", True, False, 2, False, 30000))
    with pytest.raises(ClassValidationError):
        from_json({**lease, "lane": "video"}, Lease)
    row = to_json(PlanRow("tick", "image", "m", "a", "s", "b", "skipped", "cost_rejected"))
    with pytest.raises(ClassValidationError):
        from_json({**row, "reason": "bored"}, PlanRow)


def test_a_link_serialises_with_nested_endpoints() -> None:
    lk = Link(Endpoint("m", "a"), Endpoint("s", "b"), False, True)
    assert to_json(lk) == {
        "owner": {"node_id": "m", "model_id": "a"},
        "helper": {"node_id": "s", "model_id": "b"},
        "load_if_unloaded": False,
        "restore_after_borrow": True,
    }
    minimal = {"owner": {"node_id": "m", "model_id": "a"}, "helper": {"node_id": "s", "model_id": "b"}}
    assert from_json(minimal, Link) == Link(Endpoint("m", "a"), Endpoint("s", "b"))


def test_lease_slots_are_at_least_one_and_probes_have_no_speeds() -> None:
    lease = Lease("image", "m", "a", "s", "b", True, False, 0, False, 30000, 8000.0, 0.0, 8000.0)
    assert lease.slots() == 1
    assert lease.has_speeds()
    assert not attrs.evolve(lease, probe=True).has_speeds()
    assert lease.key() == ("image", "m", "a")


@given(
    slots=st.integers(1, 64),
    probe=st.booleans(),
    ttl=st.integers(1, 10**7),
    job=st.floats(0, 1e7),
    lane=st.sampled_from(["image", "text"]),
)
def test_any_lease_round_trips(slots: int, probe: bool, ttl: int, job: float, lane: str) -> None:
    lease = Lease(lane, "m", "a", "s", "b", True, True, slots, probe, ttl, job, job / 2, job)  # type: ignore[arg-type]
    assert from_json(json.loads(json.dumps(to_json(lease))), Lease) == lease
