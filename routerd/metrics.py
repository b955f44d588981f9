"""Prometheus metrics for one node (``GET /metrics``).

Each node owns its own ``CollectorRegistry`` so several nodes can run in one
process (integration tests do) without sharing counters.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_LOAD_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)


class NodeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "routerd_requests", "Inference requests answered, by model, lane, route and status",
            ("model", "lane", "route", "status"), registry=self.registry)
        self.request_duration = Histogram(
            "routerd_request_duration_seconds", "Time from accepting a request to its last byte",
            ("model", "lane"), buckets=_DURATION_BUCKETS, registry=self.registry)
        self.in_flight = Gauge(
            "routerd_requests_in_flight", "Inference requests being served", ("lane",),
            registry=self.registry)
        self.loads = Counter(
            "routerd_model_loads", "Backend model loads, by model, runtime and outcome",
            ("model", "runtime", "status"), registry=self.registry)
        self.load_duration = Histogram(
            "routerd_model_load_duration_seconds", "Backend model load time, switch start to readiness",
            ("model", "runtime"), buckets=_LOAD_BUCKETS, registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)
