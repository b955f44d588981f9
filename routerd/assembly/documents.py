"""The documents a node answers with — its records, listings, snapshot, state and runtime status —
computed by ``routerd.documents`` from the node's live state, and the metrics gauges fed from it.

The catalog and config are read through their holders' ``get`` (``assembly.current``): a reload
replaces them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from routerd import documents
from routerd.assets.service import AssetService
from routerd.backends.runtimes import Runtimes
from routerd.backends.slot import SlotState
from routerd.catalog.catalog import Catalog
from routerd.catalog.model import Capabilities
from routerd.cluster.master import MasterAgent
from routerd.config.schema import Config
from routerd.inference.local import LocalInference
from routerd.inference.recipes import RecipeRouter, merge_listing
from routerd.inference.samples import Measurements
from routerd.lending.coordinator import Coordinator
from routerd.lending.service import LendingService
from routerd.metrics import KvSlotRows, NodeMetrics
from routerd.routing.adapters.ollama import ListedModel
from routerd.telemetry.collector import Telemetry
from routerd.wire.records import ModelRecord, Snapshot, snapshot_to_json
from routerd.wire.status import RuntimeStatus
from routerd.wire.telemetry import telemetry_to_json


class LocalReadiness:
    """A master's own replica is eligible only while its lane is ready (what its registry asks)."""

    def __init__(self, catalog: Callable[[], Catalog], runtimes: Runtimes) -> None:
        self.catalog, self.runtimes = catalog, runtimes

    def __call__(self, kind: Any, record: ModelRecord) -> bool:
        model = self.catalog().get(record.local_id)
        return model is not None and self.runtimes.ready(kind, model)


class NodeDocuments:
    def __init__(self, *, node_id: str, public_url: str, clock: Any, started_at: float,
                 config: Callable[[], Config], catalog: Callable[[], Catalog], runtimes: Runtimes,
                 assets: AssetService, local: LocalInference, lending: LendingService,
                 samples: Measurements, own_busy: Callable[[], bool], master: MasterAgent | None,
                 recipes: RecipeRouter | None, telemetry: Telemetry,
                 benchmark: Callable[[str], dict[str, Any] | None] = lambda _model: None,
                 metrics: NodeMetrics | None = None, kv_slots: KvSlotRows | None = None) -> None:
        self.node_id, self.public_url, self.clock, self.started_at = node_id, public_url, clock, started_at
        self.config, self.catalog, self.runtimes, self.assets = config, catalog, runtimes, assets
        self.local, self.lending, self.samples, self.own_busy = local, lending, samples, own_busy
        self.master, self.recipes, self.telemetry = master, recipes, telemetry
        self.benchmark = benchmark  # a model's latest benchmark result (inference.bench), or None
        self.metrics = metrics  # the master's replica choice counters (``replica_choices``)
        self.kv_slots = kv_slots  # the KV slot keeper's rows, when it keeps slots

    def local_records(self) -> list[ModelRecord]:
        records = self.assets.annotate(documents.local_records(self.catalog(), self.node_id, self.public_url,
                                                               self.runtimes.loaded_config))
        return documents.with_benchmarks(records, self.benchmark)

    def records(self) -> list[ModelRecord]:
        """The models this node lists: the merged registry on a master, else its own."""
        if self.master is not None:
            return documents.with_local_loaded(self.master.registry.records(), self.node_id, self.catalog(),
                                               self.runtimes.loaded_config)
        return self.local_records()

    def listing(self, keep: Callable[[Capabilities], bool]) -> list[ListedModel]:
        listed = documents.listing(self.records(), keep, self.catalog(), self.node_id, self.started_at)
        if self.recipes is None:
            return listed
        return merge_listing(self.recipes.listed(keep), listed, lambda e: e.name)

    def image_listing(self) -> list[dict[str, Any]]:
        listed = documents.image_listing(self.records())
        if self.recipes is None:
            return listed
        return merge_listing(self.recipes.image_listed(), listed, lambda e: e["model_name"])

    def snapshot_wire(self) -> Snapshot:
        """The node's models and its latest telemetry (asking for it starts the next reading: the master's
        health poll asks for this)."""
        return documents.snapshot(self.node_id, self.public_url, self.local_records(),
                                  self.telemetry.reading_json())

    def own_telemetry(self) -> dict[str, Any]:
        """This node's telemetry for its site inventory: a master's latest (its health poll reads it), a
        site of one's latest with the next reading started (it has no poll)."""
        if self.master is not None:
            return telemetry_to_json(self.telemetry.current())
        return self.telemetry.reading_json()

    def snapshot(self) -> dict[str, Any]:
        return snapshot_to_json(self.snapshot_wire())

    def state_document(self) -> dict[str, Any]:
        return documents.state(self.node_id, int(self.clock.seconds() * 1000), self.runtimes.status(),
                               self.local.active.values(), self.lending.held_requests(),
                               documents.warm_counts(self.swap_tallies(),
                                                     self.kv_slots() if self.kv_slots is not None else ()))

    def swap_tallies(self) -> list[tuple[str, str, int, int]]:
        """(lane, model kept loaded, served ahead, switches avoided) of each lane queue's swap order."""
        return [(lane, model, *tally) for lane, queue in self.lending.queues.items()
                for model, tally in queue.swap.tally.items()]

    def replica_choices(self) -> list[dict[str, Any]]:
        """The master's replica choice counts per (public ID, node): those ``/metrics`` shows."""
        if self.metrics is None:
            return []
        return documents.replica_choice_counts(
            ((labels, child.value) for labels, child in self.metrics.replica_choices.children.items()),
            ((labels, child.value) for labels, child in self.metrics.replica_bound_moves.children.items()))

    def runtime_status(self) -> RuntimeStatus:
        # borrowed work does not count as busy (spec "Probes")
        idle_s = 0.0 if self.own_busy() else max(0.0, self.clock.seconds() - self.samples.own_work_at)
        return documents.runtime_status(
            self.node_id, self.config().backend.mode, self.runtimes.status(),
            self.runtimes.loaded_config("stt") or "", int(idle_s * 1000),
            self.lending.sync_fingerprint(), self.lending.lane_statuses(), self.lending.costs)

    def watch(self, metrics: NodeMetrics, coordinator: Coordinator | None) -> None:
        """Feed the node's queue, lending and runtime gauges from this state."""
        metrics.watch_queues(lambda: self.local.queued)
        metrics.watch_lending(
            lambda: documents.lease_sides(self.lending.live_lease_lanes(), coordinator),
            lambda: [(h["lane"], h["state"]) for h in self.lending.held_requests()])
        metrics.watch_swaps(self.swap_tallies)
        metrics.watch_node(lambda: documents.runtime_views(self.runtimes.slots()),
                           tuple(s.value for s in SlotState),
                           lambda: documents.node_health(self.node_id, self.master))
