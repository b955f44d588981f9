"""The request path's metric families against prometheus_client's own metrics.

``routerd.metrics`` keeps the children the request path updates as plain floats and hands
prometheus_client their samples at scrape time.  The same random updates (children asked for,
counters and gauges moved, histograms observed) go to a prometheus_client Counter, Gauge and
Histogram in one registry and to the families in another: the two ``/metrics`` texts must be the
same, byte for byte (the ``_created`` timestamps included: both read one frozen clock).
"""

from __future__ import annotations

import math
from typing import Any

import prometheus_client.metrics
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from routerd import metrics as routerd_metrics
from routerd.metrics import CounterFamily, GaugeFamily, HistogramFamily

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
LABELS = st.sampled_from(["a", "b", "m/x:1", 'q"uote', "-"])
AMOUNTS = st.one_of(
    st.floats(min_value=0, max_value=1e6, allow_nan=False),
    st.sampled_from([0.0, *BUCKETS, 11.0, 1e9]),
    st.integers(min_value=0, max_value=1000),
)
OBSERVED = st.one_of(AMOUNTS, st.floats(allow_nan=True, allow_infinity=True), st.just(math.nan))

STEPS = st.lists(st.one_of(
    st.tuples(st.just("count"), LABELS, LABELS, AMOUNTS),
    st.tuples(st.just("gauge_inc"), LABELS, st.just(""), AMOUNTS),
    st.tuples(st.just("gauge_dec"), LABELS, st.just(""), AMOUNTS),
    st.tuples(st.just("observe"), LABELS, LABELS, OBSERVED),
    st.tuples(st.just("touch"), LABELS, LABELS, st.just(0)),  # a child asked for, never updated
), max_size=60)


class _Clock:
    """``time`` for both modules: every child is created one second after the one before."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def time(self) -> float:
        self.now += 1
        return self.now


def _render(steps: list[tuple[str, str, str, Any]], *, families: bool) -> bytes:
    with pytest.MonkeyPatch.context() as patch:
        clock = _Clock()
        patch.setattr(prometheus_client.metrics, "time", clock)
        patch.setattr(routerd_metrics, "time", clock)
        return _updated(steps, families=families)


def _updated(steps: list[tuple[str, str, str, Any]], *, families: bool) -> bytes:
    registry = CollectorRegistry(auto_describe=True)
    counter: Any
    gauge: Any
    histogram: Any
    if families:
        counter = CounterFamily("t_requests", "Requests", ("model", "status"), registry)
        gauge = GaugeFamily("t_in_flight", "In flight", ("lane",), registry)
        histogram = HistogramFamily("t_duration_seconds", "Duration", ("model", "lane"), registry,
                                    buckets=BUCKETS)

        def child(metric: Any, *values: str) -> Any:
            return metric.child(*values)
    else:
        counter = Counter("t_requests", "Requests", ("model", "status"), registry=registry)
        gauge = Gauge("t_in_flight", "In flight", ("lane",), registry=registry)
        histogram = Histogram("t_duration_seconds", "Duration", ("model", "lane"), registry=registry,
                              buckets=BUCKETS)

        def child(metric: Any, *values: str) -> Any:
            return metric.labels(*values)
    for what, first, second, amount in steps:
        if what == "count":
            child(counter, first, second).inc(amount)
        elif what == "gauge_inc":
            child(gauge, first).inc(amount)
        elif what == "gauge_dec":
            child(gauge, first).dec(amount)
        elif what == "observe":
            child(histogram, first, second).observe(amount)
        else:
            child(counter, first, second)
            child(histogram, second, first)
    return generate_latest(registry)


@settings(max_examples=300, deadline=None)
@given(steps=STEPS)
def test_families_render_what_prometheus_client_renders(steps: list[tuple[str, str, str, Any]]) -> None:
    assert _render(steps, families=True) == _render(steps, families=False)


@pytest.mark.parametrize("use_created", [True, False])
def test_created_series_follow_prometheus_clients_switch(use_created: bool) -> None:
    steps = [("count", "a", "ok", 1), ("observe", "a", "text", 0.2), ("touch", "b", "c", 0)]
    was = prometheus_client.metrics._use_created
    try:
        prometheus_client.metrics._use_created = use_created
        assert _render(steps, families=True) == _render(steps, families=False)
    finally:
        prometheus_client.metrics._use_created = was


def test_a_counter_refuses_to_go_down_and_a_child_needs_every_label() -> None:
    registry = CollectorRegistry()
    counter = CounterFamily("t_requests", "Requests", ("model", "status"), registry)
    with pytest.raises(ValueError, match="non-negative"):
        counter.child("a", "ok").inc(-1)
    with pytest.raises(ValueError, match="label count"):
        counter.child("a")
    with pytest.raises(ValueError, match="sorted"):
        HistogramFamily("t_bad", "Bad", ("model",), registry, buckets=(1, 0.5))


def test_node_metrics_keep_their_names_and_children() -> None:
    """The node's request children are looked up once per label set and read back through the
    registry like any prometheus_client metric."""
    metrics = routerd_metrics.NodeMetrics()
    requests, duration = metrics.request_children("m", "text", "openai_chat", "ok")
    assert metrics.request_children("m", "text", "openai_chat", "ok") == (requests, duration)
    requests.inc()
    duration.observe(0.2)
    metrics.in_flight.child("text").inc()
    value = metrics.registry.get_sample_value
    labels = {"model": "m", "lane": "text"}
    assert value("routerd_requests_total", {**labels, "route": "openai_chat", "status": "ok"}) == 1
    assert value("routerd_request_duration_seconds_bucket", {**labels, "le": "0.25"}) == 1
    assert value("routerd_request_duration_seconds_bucket", {**labels, "le": "0.1"}) == 0
    assert value("routerd_request_duration_seconds_count", labels) == 1
    assert value("routerd_requests_in_flight", {"lane": "text"}) == 1
