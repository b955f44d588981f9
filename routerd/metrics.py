"""Prometheus metrics for one node (``GET /metrics``).

Each node owns its own ``CollectorRegistry`` so several nodes can run in one
process (integration tests do) without sharing counters.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar

import attrs
import prometheus_client.metrics
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

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


#: What the swap counters read at scrape time: (runtime, model kept loaded, requests of it served
#: ahead of a switch, switches avoided), cumulative, per lane queue (:mod:`routerd.lending.swap_batch`).
SwapTallies = Callable[[], Iterable[tuple[str, str, int, int]]]


class _SwapCounters(Collector):
    def __init__(self, tallies: SwapTallies) -> None:
        self.tallies = tallies

    def collect(self) -> Iterator[CounterMetricFamily]:
        labels = ("runtime", "model")
        served = CounterMetricFamily(
            "routerd_swap_batch_served", "Requests of the model a shared runtime holds served ahead of "
            "one that would have switched it (scheduling.swap_batch), by runtime and model", labels=labels)
        avoided = CounterMetricFamily(
            "routerd_swaps_avoided", "Model switches of a shared runtime the swap-avoiding order spared "
            "(counted in the queue's arrival order), by runtime and the model kept loaded", labels=labels)
        for runtime, model, n_served, n_avoided in self.tallies():
            served.add_metric((runtime, model), n_served)
            avoided.add_metric((runtime, model), n_avoided)
        yield from (served, avoided)


def _count(pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for pair in pairs:
        out[pair] = out.get(pair, 0) + 1
    return out


# -- the request path's metrics ---------------------------------------------------------------
# Every request updates about a dozen labelled children.  prometheus_client's take a lock and check
# that the metric is a child on each update (a counter's inc is 5 calls, a histogram's observe 9:
# 45 calls a request at 1 client, benchmarks/trees.py --profile); these families keep each child
# as plain floats updated on the reactor thread (the only thread that updates or scrapes them) and
# hand prometheus_client the same samples at scrape time: /metrics reads exactly as it did.
# tests/unit/test_metric_families.py renders both for the same updates.

_INF = float("inf")


class CountChild:
    """One child of a :class:`CounterFamily`: its total and when it was created."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.value += amount


class GaugeChild:
    """One child of a :class:`GaugeFamily`."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        self.value += amount

    def dec(self, amount: float = 1) -> None:
        self.value += -amount


class HistogramChild:
    """One child of a :class:`HistogramFamily`: the observations in each bucket (not cumulated),
    their sum, and when it was created."""

    __slots__ = ("bounds", "counts", "created", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0.0] * len(bounds)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        self.sum += amount
        if amount <= _INF:  # the first bucket whose bound is at least the amount (none for NaN)
            self.counts[bisect_left(self.bounds, amount)] += 1


Child = TypeVar("Child", CountChild, GaugeChild, HistogramChild)


class _Family(Collector, Generic[Child]):
    """A labelled metric whose children are asked for by their label values."""

    kind = ""

    def __init__(self, name: str, documentation: str, labels: Sequence[str],
                 registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.labels = tuple(labels)
        self.children: dict[tuple[str, ...], Child] = {}
        registry.register(self)

    def child(self, *values: str) -> Child:
        """The child of these label values, created the first time it is asked for (it shows in
        /metrics from then on, at 0)."""
        found = self.children.get(values)
        if found is None:
            if len(values) != len(self.labels):
                raise ValueError("Incorrect label count")
            found = self.children[values] = self._new()
        return found

    def _new(self) -> Child:
        raise NotImplementedError

    def describe(self) -> list[Metric]:
        return [Metric(self.name, self.documentation, self.kind)]

    def collect(self) -> Iterator[Metric]:
        metric = Metric(self.name, self.documentation, self.kind)
        for values, child in list(self.children.items()):
            self._samples(metric, list(zip(self.labels, (str(v) for v in values), strict=True)), child)
        yield metric

    def _samples(self, metric: Metric, labels: list[tuple[str, str]], child: Child) -> None:
        raise NotImplementedError


def _created() -> bool:
    # prometheus_client's own switch (PROMETHEUS_DISABLE_CREATED_SERIES, disable_created_metrics)
    return bool(getattr(prometheus_client.metrics, "_use_created", True))


class CounterFamily(_Family[CountChild]):
    kind = "counter"

    def _new(self) -> CountChild:
        return CountChild()

    def _samples(self, metric: Metric, labels: list[tuple[str, str]], child: CountChild) -> None:
        metric.add_sample(self.name + "_total", dict(labels), child.value)
        if _created():
            metric.add_sample(self.name + "_created", dict(labels), child.created)


class GaugeFamily(_Family[GaugeChild]):
    kind = "gauge"

    def _new(self) -> GaugeChild:
        return GaugeChild()

    def _samples(self, metric: Metric, labels: list[tuple[str, str]], child: GaugeChild) -> None:
        metric.add_sample(self.name, dict(labels), child.value)


class HistogramFamily(_Family[HistogramChild]):
    kind = "histogram"

    def __init__(self, name: str, documentation: str, labels: Sequence[str], registry: CollectorRegistry,
                 *, buckets: Sequence[float]) -> None:
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds):
            raise ValueError("Buckets not in sorted order")
        if bounds[-1] != _INF:
            bounds.append(_INF)
        self.bounds = tuple(bounds)
        self._le: tuple[str, ...] = tuple(floatToGoString(b) for b in bounds)  # type: ignore[no-untyped-call]
        super().__init__(name, documentation, labels, registry)

    def _new(self) -> HistogramChild:
        return HistogramChild(self.bounds)

    def _samples(self, metric: Metric, labels: list[tuple[str, str]], child: HistogramChild) -> None:
        acc = 0.0
        for le, count in zip(self._le, child.counts, strict=True):
            acc += count
            metric.add_sample(self.name + "_bucket", dict([*labels, ("le", le)]), acc)
        metric.add_sample(self.name + "_count", dict(labels), acc)
        if self.bounds[0] >= 0:
            metric.add_sample(self.name + "_sum", dict(labels), child.sum)
        if _created():
            metric.add_sample(self.name + "_created", dict(labels), child.created)


#: Request statuses that are the server's failure, not the client's (``routerd_requests_total{status}``):
#: what the rack view's ``failed_requests`` counts.
_FAILED_STATUSES = frozenset({"backend_error", "internal_error", "stream_broken"})


def request_failed(status: str) -> bool:
    """Whether a request that ended with ``status`` failed on the server's side (a 5xx answer too)."""
    return status in _FAILED_STATUSES or status.startswith("http_5")


#: What the kept KV slot counters read at scrape time: (runtime, model, saved, restored, saved bytes,
#: restored bytes, failed), cumulative (:mod:`routerd.backends.kv_slots`).
KvSlotRows = Callable[[], Iterable[tuple[str, str, int, int, int, int, int]]]


class _KvSlotCounters(Collector):
    def __init__(self, rows: KvSlotRows) -> None:
        self.rows = rows

    def collect(self) -> Iterator[CounterMetricFamily]:
        labels = ("runtime", "model")
        saved = CounterMetricFamily("routerd_kv_slots_saved", "KV slots saved before their model was "
                                    "unloaded (models.slot_keep_count), by runtime and model", labels=labels)
        restored = CounterMetricFamily("routerd_kv_slots_restored", "Kept KV slots restored before their "
                                       "session's next request, by runtime and model", labels=labels)
        size = CounterMetricFamily("routerd_kv_slot_bytes", "Bytes of KV slots written (saved) and read "
                                   "back (restored), by runtime, model and direction",
                                   labels=(*labels, "direction"))
        failed = CounterMetricFamily("routerd_kv_slot_failures", "Slot saves and restores that failed "
                                     "(logged; the request and the unload went on), by runtime and model",
                                     labels=labels)
        for runtime, model, n_saved, n_restored, saved_bytes, restored_bytes, n_failed in self.rows():
            saved.add_metric((runtime, model), n_saved)
            restored.add_metric((runtime, model), n_restored)
            size.add_metric((runtime, model, "saved"), saved_bytes)
            size.add_metric((runtime, model, "restored"), restored_bytes)
            failed.add_metric((runtime, model), n_failed)
        yield from (saved, restored, size, failed)


class NodeMetrics:
    def __init__(self) -> None:
        self._request_children: dict[tuple[str, str, str, str], tuple[CountChild, HistogramChild]] = {}
        self._key_children: dict[tuple[str, str, str, bool, bool, bool],
                                 tuple[HistogramChild | None, CountChild | None, CountChild | None]] = {}
        self._text_children: dict[tuple[str, bool, bool],
                                  tuple[CountChild, CountChild | None, HistogramChild | None]] = {}
        self.registry = CollectorRegistry(auto_describe=True)
        # process_* (CPU, memory, open files, start time) and python_info, as every exporter has
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.requests = CounterFamily(
            "routerd_requests", "Inference requests answered, by model, lane, route and status",
            ("model", "lane", "route", "status"), self.registry)
        self.request_duration = HistogramFamily(
            "routerd_request_duration_seconds", "Time from accepting a request to its last byte",
            ("model", "lane"), self.registry, buckets=_DURATION_BUCKETS)
        self.in_flight = GaugeFamily(
            "routerd_requests_in_flight", "Inference requests being served", ("lane",), self.registry)
        self.loads = Counter(
            "routerd_model_loads", "Backend model loads, by model, runtime and outcome",
            ("model", "runtime", "status"), registry=self.registry)
        self.load_duration = Histogram(
            "routerd_model_load_duration_seconds", "Backend model load time, switch start to readiness",
            ("model", "runtime"), buckets=_LOAD_BUCKETS, registry=self.registry)
        self.first_token = HistogramFamily(
            "routerd_time_to_first_token_seconds",
            "Time from accepting a streamed request to the first answer bytes sent to the client",
            ("model", "lane"), self.registry, buckets=_FIRST_TOKEN_BUCKETS)
        self.token_rate = HistogramFamily(
            "routerd_generation_tokens_per_second",
            "Generated tokens per second of service time, per finished text request",
            ("model",), self.registry, buckets=_TOKEN_RATE_BUCKETS)
        self.generated_tokens = CounterFamily(
            "routerd_generated_tokens", "Tokens generated by this node's backends", ("model",), self.registry)
        self.prompt_tokens = CounterFamily(
            "routerd_prompt_tokens", "Prompt tokens processed by this node's backends", ("model",),
            self.registry)
        # per named key and class: the key's name, never the key ("-" for none)
        self.key_requests = CounterFamily(
            "routerd_key_requests", "Inference requests a client sent this node, by key name, class and "
            "status (429s: status key_limited or queue_full)", ("key", "class", "status"), self.registry)
        self.key_tokens = CounterFamily(
            "routerd_key_tokens", "Prompt and output tokens of those requests where this node knows them, "
            "by key name and class", ("key", "class"), self.registry)
        self.key_queue_wait = HistogramFamily(
            "routerd_key_queue_wait_seconds", "Time a request served here waited before its backend "
            "started it, by key name and class", ("key", "class"), self.registry, buckets=_DURATION_BUCKETS)

        self.lending_decisions = Counter(
            "routerd_lending_decisions",
            "Lending decisions recorded by this node (lent, returned, cut off, held, granted, ...),"
            " by kind, outcome, lane and reason",
            ("kind", "outcome", "lane", "reason"), registry=self.registry)
        # the master's replica choice (routing.replica_choice), per replica: model is the public ID
        self.replica_choices = CounterFamily(
            "routerd_replica_choices", "Requests a master routed by least_loaded or affinity, by model, the"
            " chosen replica's node, mode and reason (affinity_hit: a hit; affinity_new/gone/moved: a miss)",
            ("model", "node", "mode", "reason"), self.registry)
        self.replica_bound_moves = CounterFamily(
            "routerd_replica_bound_moves", "Session keys moved off a replica because it was over the affinity"
            " load bound, by model and the node of the replica they left", ("model", "node"), self.registry)
        self.plan_duration = Histogram(
            "routerd_lending_plan_duration_seconds", "Time one lending plan takes (master)",
            buckets=_PLAN_BUCKETS, registry=self.registry)

    def failed_requests(self) -> int:
        """Requests this node answered that failed on its side, since start (read at each telemetry
        reading, never per request)."""
        children = self.requests.children.items()
        return int(sum(child.value for (_model, _lane, _route, status), child in children
                       if request_failed(status)))

    def request_children(self, model: str, lane: str, route: str,
                         status: str) -> tuple[CountChild, HistogramChild]:
        """The request count and duration children one finished request updates, in one lookup."""
        key = (model, lane, route, status)
        found = self._request_children.get(key)
        if found is None:
            found = self._request_children[key] = (self.requests.child(model, lane, route, status),
                                                   self.request_duration.child(model, lane))
        return found

    def key_children(self, key: str, cls: str, status: str, *, waited: bool, counted: bool,
                     used_tokens: bool) -> tuple[HistogramChild | None, CountChild | None, CountChild | None]:
        """The per-key children one finished request updates, in one lookup: its queue wait, its
        request count and its tokens (None for each it does not update: a child once asked for
        shows in /metrics, at 0)."""
        found_key = (key, cls, status, waited, counted, used_tokens)
        found = self._key_children.get(found_key)
        if found is None:
            found = self._key_children[found_key] = (
                self.key_queue_wait.child(key, cls) if waited else None,
                self.key_requests.child(key, cls, status) if counted else None,
                self.key_tokens.child(key, cls) if used_tokens else None)
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

    def watch_swaps(self, tallies: SwapTallies) -> None:
        """Report the swap-avoiding order's counters from these tallies at every scrape."""
        self.registry.register(_SwapCounters(tallies))

    def watch_kv_slots(self, rows: KvSlotRows) -> None:
        """Report the kept KV slots' counters from these rows at every scrape."""
        self.registry.register(_KvSlotCounters(rows))

    def watch_node(self, runtimes: Callable[[], Iterable[RuntimeView]], states: tuple[str, ...],
                   nodes: Callable[[], Iterable[tuple[str, bool]]]) -> None:
        """Report runtime states, queue depth and node health from these views at every scrape."""
        self.registry.register(_NodeGauges(runtimes, states, nodes))

    def observe_text_request(self, model: str, prompt_tokens: float, output_tokens: float,
                             seconds: float) -> None:
        """A finished text request: token counters and, when it generated any, its token rate."""
        generated = output_tokens > 0
        timed = generated and seconds > 0
        key = (model, generated, timed)
        found = self._text_children.get(key)
        if found is None:  # only the children it updates (one asked for shows in /metrics at 0)
            found = self._text_children[key] = (
                self.prompt_tokens.child(model), self.generated_tokens.child(model) if generated else None,
                self.token_rate.child(model) if timed else None)
        prompt, output, rate = found
        prompt.inc(max(0.0, prompt_tokens))
        if output is not None:
            output.inc(output_tokens)
        if rate is not None:
            rate.observe(output_tokens / seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
