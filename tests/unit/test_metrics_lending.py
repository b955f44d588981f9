"""Lending metrics on ``/metrics`` (issue 8): decisions counted by kind/outcome/lane/reason, the plan
duration histogram, and gauges of live leases and held requests read at scrape time."""

from __future__ import annotations

from typing import Any

import attrs
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.task import Clock

from routerd.lending.decisions import DecisionLog
from routerd.metrics import NodeMetrics
from routerd.wire.lending import PlanRow


def samples(metrics: NodeMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_every_decision_row_is_counted_by_kind_outcome_lane_and_reason() -> None:
    metrics = NodeMetrics()
    log = DecisionLog(None, Clock(), "owner")
    log.observe(metrics.count_decision)
    log.record("dispatch", "lent", lane="text", owner_node_id="owner", owner_model_id="a", request_id="r1")
    log.record("dispatch", "lent", lane="text", owner_node_id="owner", owner_model_id="a", request_id="r2")
    log.record("helper", "borrowed_returned", lane="image", reason="own_work_arrived", request_id="r3")
    got = samples(metrics)
    lent = ("routerd_lending_decisions_total",
            (("kind", "dispatch"), ("lane", "text"), ("outcome", "lent"), ("reason", "")))
    back = ("routerd_lending_decisions_total",
            (("kind", "helper"), ("lane", "image"), ("outcome", "borrowed_returned"),
             ("reason", "own_work_arrived")))
    assert got[lent] == 2.0
    assert got[back] == 1.0


def test_a_refused_row_is_not_counted() -> None:
    metrics = NodeMetrics()
    log = DecisionLog(None, Clock(), "owner")
    log.observe(metrics.count_decision)
    try:
        log.record("dispatch", "no_such_outcome", lane="text")
    except ValueError:
        pass
    assert not [k for k in samples(metrics) if k[0] == "routerd_lending_decisions_total"]


def test_lease_and_held_gauges_read_the_current_state_at_each_scrape() -> None:
    metrics = NodeMetrics()
    state: dict[str, Any] = {"leases": [("text", "owner"), ("text", "book"), ("text", "book")],
                             "held": [("text", "queued"), ("text", "lent"), ("image", "held")]}
    metrics.watch_lending(lambda: state["leases"], lambda: state["held"])
    got = samples(metrics)
    assert got[("routerd_lending_live_leases", (("lane", "text"), ("side", "book")))] == 2.0
    assert got[("routerd_lending_live_leases", (("lane", "text"), ("side", "owner")))] == 1.0
    assert got[("routerd_lending_held_requests", (("lane", "image"), ("state", "held")))] == 1.0
    state["leases"], state["held"] = [], []
    got = samples(metrics)
    assert not [k for k in got if k[0] in ("routerd_lending_live_leases", "routerd_lending_held_requests")]


def test_plan_durations_are_observed_in_a_histogram() -> None:
    metrics = NodeMetrics()
    metrics.plan_duration.observe(0.003)
    got = samples(metrics)
    assert got[("routerd_lending_plan_duration_seconds_count", ())] == 1.0
    assert got[("routerd_lending_plan_duration_seconds_bucket", (("le", "0.005"),))] == 1.0
    assert got[("routerd_lending_plan_duration_seconds_bucket", (("le", "0.002"),))] == 0.0


def test_a_plans_rows_are_counted_by_outcome_lane_and_reason_in_one_call_each() -> None:
    """A plan of thousands of rows is counted per distinct outcome/lane/reason, not row by row."""
    metrics = NodeMetrics()
    log = DecisionLog(None, Clock(), "master")
    calls: list[int] = []
    log.observe(metrics.count_decision)
    log.observe(lambda _row, count: calls.append(count))
    skipped = PlanRow("tick", "image", "a", "sd", "b", "sd-b", "skipped", "outranked")
    log.record_plan_rows([attrs.evolve(skipped, outcome="granted", reason=None), *[skipped] * 300,
                          attrs.evolve(skipped, lane="text", reason="helper_claimed")])
    got = samples(metrics)

    def counted(lane: str, outcome: str, reason: str) -> float:
        labels = (("kind", "plan"), ("lane", lane), ("outcome", outcome), ("reason", reason))
        return got[("routerd_lending_decisions_total", labels)]

    assert counted("image", "skipped", "outranked") == 300
    assert counted("image", "granted", "") == 1
    assert counted("text", "skipped", "helper_claimed") == 1
    assert sorted(calls) == [1, 1, 300]


def test_text_request_tokens_add_up_per_model_across_requests() -> None:
    """observe_text_request reuses one child per model: counts still add up per model."""
    metrics = NodeMetrics()
    metrics.observe_text_request("m", 10, 4, 2.0)
    metrics.observe_text_request("m", 5, 0, 1.0)  # generated nothing: no rate
    metrics.observe_text_request("n", 3, 6, 0.0)  # no service time: no rate
    value = metrics.registry.get_sample_value
    assert value("routerd_prompt_tokens_total", {"model": "m"}) == 15
    assert value("routerd_generated_tokens_total", {"model": "m"}) == 4
    assert value("routerd_generation_tokens_per_second_count", {"model": "m"}) == 1
    assert value("routerd_generation_tokens_per_second_sum", {"model": "m"}) == 2.0
    assert value("routerd_prompt_tokens_total", {"model": "n"}) == 3
    assert value("routerd_generated_tokens_total", {"model": "n"}) == 6
    assert value("routerd_generation_tokens_per_second_count", {"model": "n"}) is None


def test_key_children_create_only_the_samples_a_request_updates() -> None:
    """A child once asked for shows in /metrics at 0: a request forwarded here by another node
    (not counted here) or without tokens must not make its key's counters appear."""
    metrics = NodeMetrics()
    wait, requests, tokens = metrics.key_children("k", "standard", "ok", waited=True, counted=False,
                                                  used_tokens=False)
    assert requests is None and tokens is None
    wait.observe(0.5)
    text = metrics.render().decode()
    assert 'routerd_key_queue_wait_seconds_count{class="standard",key="k"} 1.0' in text
    assert "routerd_key_requests_total{" not in text and "routerd_key_tokens_total{" not in text
    again = metrics.key_children("k", "standard", "ok", waited=True, counted=True, used_tokens=True)
    assert again[0] is wait
    again[1].inc()
    again[2].inc(7)
    value = metrics.registry.get_sample_value
    assert value("routerd_key_requests_total", {"key": "k", "class": "standard", "status": "ok"}) == 1
    assert value("routerd_key_tokens_total", {"key": "k", "class": "standard"}) == 7
