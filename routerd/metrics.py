"""Prometheus metrics for one node (``GET /metrics``).

Each node owns its own ``CollectorRegistry`` so several nodes can run in one
process (integration tests do) without sharing counters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import attrs
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_LOAD_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)
_FIRST_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120)
_TOKEN_RATE_BUCKETS = (1, 2, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000, 2000)
_PLAN_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)

#: What the lending gauges read at scrape time: (lane, side) of each live lease, where side is
#: ``owner`` (held by this node for its queue) or ``book`` (the master's lease book); and the
#: (lane, state) of each router-held request (state queued | held | lent).
LeaseSides = Callable[[], Iterable[tuple[str, str]]]
HeldStates = Callable[[], Iterable[tuple[str, str]]]


class _LendingGauges(Collector):
    def __init__(self, leases: LeaseSides, held: HeldStates) -> None:
        self.leases = leases
        self.held = held

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield _counted("routerd_lending_live_leases",
                       "Live leases by lane: held by this owner, or in the master's book",
                       ("lane", "side"), self.leases())
        yield _counted("routerd_lending_held_requests",
                       "Requests held in this node's router queues, by lane and state",
                       ("lane", "state"), self.held())


def _counted(name: str, documentation: str, labels: tuple[str, str],
             pairs: Iterable[tuple[str, str]]) -> GaugeMetricFamily:
    """A gauge family with one sample per distinct label pair: how many times it occurs."""
    family = GaugeMetricFamily(name, documentation, labels=labels)
    for pair, count in _count(pairs).items():
        family.add_metric(pair, count)
    return family


@attrs.frozen
class RuntimeView:
    """One backend runtime at scrape time."""

    runtime: str  # the kind of work: text, image, stt
    backend: str  # the runtime's process: llama-server, sd-server, koboldcpp, vllm-generate, ...
    state: str
    model: str  # "" when it holds none
    users: int  # requests in the backend
    waiters: int  # requests queued for the runtime (a load or a switch first)


class _NodeGauges(Collector):
    def __init__(self, runtimes: Callable[[], Iterable[RuntimeView]], states: tuple[str, ...],
                 nodes: Callable[[], Iterable[tuple[str, bool]]]) -> None:
        self.runtimes = runtimes
        self.states = states
        self.nodes = nodes

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ("runtime", "backend")
        state = GaugeMetricFamily("routerd_runtime_state",
                                  "1 for the state each backend runtime is in (0 for the others)",
                                  labels=(*labels, "state"))
        model = GaugeMetricFamily("routerd_runtime_model", "The model each backend runtime holds",
                                  labels=(*labels, "model"))
        users = GaugeMetricFamily("routerd_runtime_requests", "Requests being served by each runtime",
                                  labels=labels)
        depth = GaugeMetricFamily("routerd_queue_depth",
                                  "Requests waiting for a backend runtime (its load, switch or a free slot)",
                                  labels=labels)
        for view in self.runtimes():
            key = (view.runtime, view.backend)
            for name in self.states:
                state.add_metric((*key, name), 1.0 if name == view.state else 0.0)
            if view.model:
                model.add_metric((*key, view.model), 1.0)
            users.add_metric(key, view.users)
            depth.add_metric(key, view.waiters)
        yield from (state, model, users, depth)
        health = GaugeMetricFamily("routerd_node_healthy",
                                   "1 when a node answers (the master: itself and each slave it knows)",
                                   labels=("node_id",))
        for node_id, healthy in self.nodes():
            health.add_metric((node_id,), 1.0 if healthy else 0.0)
        yield health


class _QueueGauges(Collector):
    def __init__(self, depths: Callable[[], Mapping[str, int]]) -> None:
        self.depths = depths

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("routerd_model_queue_depth",
                                   "Requests of each model waiting for this node's backend slot",
                                   labels=("model",))
        for model, depth in sorted(self.depths().items()):
            family.add_metric((model,), depth)
        yield family


def _count(pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for pair in pairs:
        out[pair] = out.get(pair, 0) + 1
    return out


class NodeMetrics:
    def __init__(self) -> None:
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._key_children: dict[tuple[str, str, str, bool, bool, bool], tuple[Any, Any, Any]] = {}
        self.registry = CollectorRegistry(auto_describe=True)
        # process_* (CPU, memory, open files, start time) and python_info, as every exporter has
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
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
        self.first_token = Histogram(
            "routerd_time_to_first_token_seconds",
            "Time from accepting a streamed request to the first answer bytes sent to the client",
            ("model", "lane"), buckets=_FIRST_TOKEN_BUCKETS, registry=self.registry)
        self.token_rate = Histogram(
            "routerd_generation_tokens_per_second",
            "Generated tokens per second of service time, per finished text request",
            ("model",), buckets=_TOKEN_RATE_BUCKETS, registry=self.registry)
        self.generated_tokens = Counter(
            "routerd_generated_tokens", "Tokens generated by this node's backends", ("model",),
            registry=self.registry)
        self.prompt_tokens = Counter(
            "routerd_prompt_tokens", "Prompt tokens processed by this node's backends", ("model",),
            registry=self.registry)
        # per named key and class: the key's name, never the key ("-" for none)
        self.key_requests = Counter(
            "routerd_key_requests", "Inference requests a client sent this node, by key name, class and "
            "status (429s: status key_limited or queue_full)", ("key", "class", "status"),
            registry=self.registry)
        self.key_tokens = Counter(
            "routerd_key_tokens", "Prompt and output tokens of those requests where this node knows them, "
            "by key name and class", ("key", "class"), registry=self.registry)
        self.key_queue_wait = Histogram(
            "routerd_key_queue_wait_seconds", "Time a request served here waited before its backend "
            "started it, by key name and class", ("key", "class"), buckets=_DURATION_BUCKETS,
            registry=self.registry)

        self.lending_decisions = Counter(
            "routerd_lending_decisions",
            "Lending decisions recorded by this node (lent, returned, cut off, held, granted, ...),"
            " by kind, outcome, lane and reason",
            ("kind", "outcome", "lane", "reason"), registry=self.registry)
        self.plan_duration = Histogram(
            "routerd_lending_plan_duration_seconds", "Time one lending plan takes (master)",
            buckets=_PLAN_BUCKETS, registry=self.registry)

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, looked up once: the request path asks for the same few
        children on every request, and prometheus_client validates and locks on each ``labels``."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def key_children(self, key: str, cls: str, status: str, *, waited: bool, counted: bool,
                     used_tokens: bool) -> tuple[Any, Any, Any]:
        """The per-key children one finished request updates, in one lookup: its queue wait, its
        request count and its tokens (None for each it does not update: a child once asked for
        shows in /metrics, at 0).  Three :meth:`child` look-ups a request cost ~9 calls
        (benchmarks/trees.py --profile), this one ~2."""
        found_key = (key, cls, status, waited, counted, used_tokens)
        found = self._key_children.get(found_key)
        if found is None:
            found = self._key_children[found_key] = (
                self.child(self.key_queue_wait, key, cls) if waited else None,
                self.child(self.key_requests, key, cls, status) if counted else None,
                self.child(self.key_tokens, key, cls) if used_tokens else None)
        return found

    def count_decision(self, row: Mapping[str, Any], count: int = 1) -> None:
        """Count ``count`` decision-log rows like ``row`` (a ``DecisionLog`` observer)."""
        self.lending_decisions.labels(str(row.get("kind", "")), str(row.get("outcome", "")),
                                      str(row.get("lane", "")), str(row.get("reason") or "")).inc(count)

    def watch_lending(self, leases: LeaseSides, held: HeldStates) -> None:
        """Report live leases and held requests from these views at every scrape."""
        self.registry.register(_LendingGauges(leases, held))

    def watch_queues(self, depths: Callable[[], Mapping[str, int]]) -> None:
        """Report per-model queue depth (requests waiting for the backend) at every scrape."""
        self.registry.register(_QueueGauges(depths))

    def watch_node(self, runtimes: Callable[[], Iterable[RuntimeView]], states: tuple[str, ...],
                   nodes: Callable[[], Iterable[tuple[str, bool]]]) -> None:
        """Report runtime states, queue depth and node health from these views at every scrape."""
        self.registry.register(_NodeGauges(runtimes, states, nodes))

    def observe_text_request(self, model: str, prompt_tokens: float, output_tokens: float,
                             seconds: float) -> None:
        """A finished text request: token counters and, when it generated any, its token rate."""
        self.child(self.prompt_tokens, model).inc(max(0.0, prompt_tokens))
        if output_tokens > 0:
            self.child(self.generated_tokens, model).inc(output_tokens)
            if seconds > 0:
                self.child(self.token_rate, model).observe(output_tokens / seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
