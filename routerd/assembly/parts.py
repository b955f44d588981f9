"""The parts one node is made of (:class:`NodeParts`) and how they are built, in dependency order:
each constructor takes what already exists; the references that point forward (lending told of own
work before lending exists, a slave's snapshot from documents built last, ...) are left to
``assembly.wiring``.  The catalog, store and config a node replaces while it runs sit in holders
(``assembly.current``) whose ``get`` the parts are given.  Nothing here decides anything.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from routerd import __version__
from routerd.assembly.clients import NodeClients
from routerd.assembly.current import Current, Held, Late
from routerd.assembly.documents import LocalReadiness, NodeDocuments
from routerd.assembly.ports import KeyBook, LocalSide, RuntimeModels
from routerd.assembly.rack import build_telemetry
from routerd.assembly.reactions import OwnWork, RecordsChanged, SettingsApplied
from routerd.assembly.refit import CostRefit
from routerd.assembly.restore import build_restorer
from routerd.assembly.roles import (
    Peers,
    RoleParts,
    borrowed_server,
    master_coordinator,
    master_parts,
    recipe_router,
    slave_parts,
    standalone_parts,
)
from routerd.assets.service import AssetService, build_asset_service
from routerd.backends.kv_slots import SlotKeeper, kv_slot_keeper
from routerd.backends.runtimes import Runtimes
from routerd.catalog.catalog import Catalog
from routerd.catalog.hashing import FileHashCache
from routerd.catalog.model import Capabilities
from routerd.cluster.auth import AuthPolicy
from routerd.cluster.master import MasterAgent
from routerd.cluster.slave import RegistrationRefused, SlaveAgent
from routerd.cluster.steering import ReplicaSteering
from routerd.config.schema import Config, TracingConfig
from routerd.inference.admin import ModelAdmin
from routerd.inference.analytics import AnalyticsRecorder
from routerd.inference.bench import BenchBook, BenchRunner
from routerd.inference.front import InferenceFront
from routerd.inference.keepalive import KeepAlive, OllamaControl
from routerd.inference.local import LocalInference
from routerd.inference.own_loads import OwnLoads
from routerd.inference.recipes import RecipeRouter
from routerd.inference.samples import Measurements
from routerd.inference.video import VideoJobs
from routerd.lending.coordinator import Coordinator, ServeBorrowed
from routerd.lending.decisions import DecisionLog
from routerd.lending.restore import Restorer
from routerd.lending.service import LendingService
from routerd.metrics import NodeMetrics
from routerd.registry.identity import MemoryPublicIdStore
from routerd.routing.adapters.ollama import ListedModel
from routerd.routing.key_limits import KeyLimiter
from routerd.routing.relay import Timeouts
from routerd.services import IntervalService
from routerd.store.store import Store
from routerd.telemetry.collector import Telemetry
from routerd.tracing import NO_TRACER, Tracer
from routerd.wire.records import ModelRecord, Snapshot
from routerd.wire.status import RuntimeStatus

log = Logger()


class NodeParts:
    """Every part of a node, as the HTTP edge, the site service and the tests read them."""

    reactor: Any
    role: str
    node_id: str
    public_url: str
    started_at: float
    #: ``starting`` until start() has loaded the startup model, ``ready``, then ``draining``
    #: from a stop on (what ``/health`` answers).
    phase: str
    current_config: Current[Config]
    current_catalog: Current[Catalog]
    current_store: Current[Store | None]
    clients: NodeClients
    agent: Any
    http: Any
    backend_agent: Any
    _open_store: Callable[[str], Awaitable[Store]]
    _run_in_thread: Callable[..., Any]
    run_in_thread: Callable[..., Any]
    hash_cache: FileHashCache
    metrics: NodeMetrics
    analytics: AnalyticsRecorder
    _analytics_loop: IntervalService
    samples: Measurements
    timeouts: Timeouts
    kv_slots: SlotKeeper | None  # models.slot_keep_count > 0
    runtimes: Runtimes
    local: LocalInference
    own_work: OwnWork
    settings_applied: SettingsApplied
    records_changed: RecordsChanged
    decisions: DecisionLog
    keys: KeyBook
    local_side: LocalSide
    role_parts: RoleParts
    master: MasterAgent | None
    slave: SlaveAgent | None
    #: What the site API reads (``assembly.roles``): the master's agent, a standalone node's
    #: site of one, None on a slave.
    site: MasterAgent | None
    _public_ids: MemoryPublicIdStore | None
    lending: LendingService
    runtime_models: RuntimeModels
    restorer: Restorer
    own_loads: OwnLoads
    recipes: RecipeRouter | None
    assets: AssetService
    jobs: VideoJobs
    front: InferenceFront
    #: Request traces (``tracing`` section; the no-op when off).
    tracer: Tracer
    _serve_borrowed: ServeBorrowed
    coordinator: Coordinator | None
    admin: ModelAdmin
    bench: BenchRunner
    policy: AuthPolicy
    documents: NodeDocuments
    telemetry: Telemetry
    #: The documents the HTTP edge and the cluster agents read (``assembly.documents`` computes them).
    local_records: Callable[[], list[ModelRecord]]
    records: Callable[[], list[ModelRecord]]
    listing: Callable[[Callable[[Capabilities], bool]], list[ListedModel]]
    image_listing: Callable[[], list[dict[str, Any]]]
    snapshot: Callable[[], dict[str, Any]]
    snapshot_wire: Callable[[], Snapshot]
    state_document: Callable[[], dict[str, Any]]
    runtime_status: Callable[[], RuntimeStatus]
    keepalive: KeepAlive
    ollama_control: OllamaControl
    _refit_loop: CostRefit
    lane_probes: IntervalService | None

    config = Held[Config]()
    catalog = Held[Catalog]()
    store = Held[Store | None]()

    def own_busy(self) -> bool:
        """Own work runs (``assembly.reactions.OwnWork``); borrowed work does not count."""
        return self.own_work.busy()


def auth_policy(config: Config) -> AuthPolicy:
    """The keys, CIDRs and proxies a request is admitted by (rebuilt on a reload)."""
    auth, server = config.auth, config.server
    return AuthPolicy.build(auth.inference_keys, auth.admin_keys, config.cluster.token, server.allowed_cidrs,
                            metrics_keys=auth.metrics_keys, trusted_proxies=server.trusted_proxies,
                            named_keys=auth.named_keys)


def build_tracer(settings: TracingConfig, node_id: str) -> Tracer:
    """The node's tracer: the OpenTelemetry SDK's when ``tracing.enabled``, else the no-op."""
    if not settings.enabled:
        return NO_TRACER
    from routerd.tracing.otel import OtelTracer, otlp_provider

    return OtelTracer(otlp_provider(endpoint=settings.endpoint, service_name=settings.service_name,
                                    node_id=node_id, sampling_ratio=settings.sampling_ratio,
                                    headers=dict(settings.headers)))


def build_common(p: NodeParts, config: Config, reactor: Any, *, clients: NodeClients, launcher: Any,
                 port_allocator: Callable[[], int] | None,
                 open_store: Callable[[str], Awaitable[Store]] | None,
                 run_in_thread: Callable[..., Any]) -> None:
    """What every role has up to local inference: metrics, samples, analytics, runtimes."""
    cluster = config.cluster
    p.reactor, p.role, p.node_id, p.public_url = reactor, cluster.role, cluster.node_id, cluster.public_url
    p.current_config = Current(config)
    p.current_catalog = Current(Catalog.scan(config.models.config_dir, config.backend.mode))
    for bad in p.catalog.invalid:
        log.warn("model config {filename} is invalid: {reason}", filename=bad.filename, reason=bad.reason)
    p.current_store = Current(None)
    p.clients = clients
    p.agent, p.http, p.backend_agent = clients.agent, clients.http, clients.backend_agent
    # Tests inject an in-memory store and a synchronous "thread" (no threads in unit tests).
    p._open_store = open_store or partial(Store.open, reactor=reactor)
    p._run_in_thread = p.run_in_thread = run_in_thread
    p.hash_cache = FileHashCache(os.path.join(cluster.store_dir, "hash-cache.json"))
    p.started_at = reactor.seconds()
    p.phase = "starting"
    p.metrics = NodeMetrics()
    p.tracer = build_tracer(config.tracing, p.node_id)
    p.analytics = AnalyticsRecorder(reactor, config.analytics, p.node_id, p.current_store.get)
    p._analytics_loop = IntervalService("analytics flush", p.analytics.tick, config.analytics.flush_interval,
                                        reactor)
    p.samples = Measurements(reactor, p.metrics, p.current_store.get, p.analytics)
    limits = config.limits
    p.timeouts = Timeouts(reactor, limits.first_byte_timeout, limits.idle_stream_timeout)
    p.kv_slots = kv_slot_keeper(config, p.http, reactor)
    p.runtimes = Runtimes(reactor, config, p.http, launcher=launcher, on_load=p.samples.on_load,
                          port_allocator=port_allocator, kv_slots=p.kv_slots)
    p.local = LocalInference(node_id=p.node_id, clock=reactor, runtimes=p.runtimes, agent=p.backend_agent,
                             samples=p.samples, timeouts=p.timeouts,
                             max_queued_per_model=limits.max_queued_per_model, kv_slots=p.kv_slots)
    if p.kv_slots is not None:
        p.metrics.watch_kv_slots(p.kv_slots.rows)
    p.own_work = OwnWork(p.runtimes, p.local)
    p.decisions = DecisionLog(None, reactor, p.node_id, __version__,
                              cluster.lending.offload_decisions_retention)
    p.settings_applied = SettingsApplied(p.decisions)
    p.keys = KeyBook(config)
    p.local_side = LocalSide(p.runtimes, config)


def build_role(p: NodeParts, *, coordinator: Late[Coordinator],
               on_terminal: Callable[[RegistrationRefused], None]) -> None:
    """What the role adds (``assembly.roles``), and the lending service over its transport."""
    cluster, reactor = p.config.cluster, p.reactor
    peer_http, peer_agent = p.clients.peer_http, p.clients.peer_agent
    if p.role == "master":
        parts = master_parts(cluster, reactor, http=peer_http, agent=peer_agent, timeouts=p.timeouts,
                             on_public_id=p.samples.save_public_id,
                             local_ready=LocalReadiness(p.current_catalog.get, p.runtimes),
                             coordinator=coordinator.get)
    elif p.role == "slave":
        parts = slave_parts(cluster, reactor, http=peer_http, agent=peer_agent, timeouts=p.timeouts,
                            on_terminal=on_terminal)
    else:
        parts = standalone_parts(cluster, reactor, http=peer_http)
    p.role_parts, p.master, p.slave, p.site, p._public_ids = parts, parts.master, parts.slave, parts.site, \
        parts.public_ids
    p.records_changed = RecordsChanged(p.site)
    side, keys = p.local_side, p.keys
    p.lending = LendingService(
        node_id=p.node_id, settings=cluster.lending, clock=reactor, role=p.role, transport=parts.transport,
        decisions=p.decisions, own_busy=p.own_work.busy, active_config=side.active_config,
        on_settings=(p.settings_applied,), waiting_for_runtime=p.local.waiting_for_runtime,
        take_back=p.local.take_back, shared_lanes=p.runtimes.lanes_sharing,
        max_queued=p.config.limits.max_queued_per_model, queued_in_backend=p.local.queued,
        key_weights=keys.weights, aging=p.config.queue.aging, run_local=p.local.serve)
    p.runtime_models = RuntimeModels(p.runtimes, p.lending.queues, p.config)  # the swap-avoiding order's data


def build_services(p: NodeParts, *, on_catalog: Callable[[Catalog], Awaitable[None]],
                   hash_catalog: Callable[[Catalog], Deferred[Catalog]]) -> None:
    """The parts over lending and local inference: restorer, loads, recipes, assets, the front,
    admin, bench, documents, keep-alive and the refit loop."""
    config, cluster, reactor, catalog = p.config, p.config.cluster, p.reactor, p.current_catalog.get
    parts, peers = p.role_parts, Peers(p.master)
    p.restorer = build_restorer(reactor, runtimes=p.runtimes, local=p.local, lending=p.lending,
                                catalog=catalog, own_busy=p.own_work.busy, on_loaded=p.samples.own_work_done)
    # explicit loads (admin, Ollama preload, startup, reload, recipes) are this node's own work
    p.own_loads = OwnLoads(p.runtimes.load, starting=p.own_work.load_starting, done=p.samples.own_work_done)
    p.recipes = None if p.site is None else recipe_router(p.site, cluster.store_dir, reactor, catalog=catalog,
                                                          runtimes=p.own_loads)
    p.assets = build_asset_service(
        config, clock=reactor, agent=p.agent, http=p.http, cache=p.hash_cache, run_in_thread=p.run_in_thread,
        metrics_registry=p.metrics.registry, client=parts.client, catalog=catalog, on_catalog=on_catalog,
        peers=peers.healthy_urls)
    p.jobs = VideoJobs(node_id=p.node_id, clock=reactor, agent=p.backend_agent, forwarder=parts.forwarder,
                       node_url=peers.node_url)
    steering = None if p.master is None else ReplicaSteering(
        master=p.master, settings=lambda: p.config.routing, decisions=p.decisions, metrics=p.metrics,
        context_reserve=lambda: p.lending.settings.scheduling_context_reserve, clock=reactor)
    p.front = InferenceFront(node_id=p.node_id, clock=reactor, catalog=catalog, local=p.local,
                             metrics=p.metrics, master=p.master, forwarder=parts.forwarder,
                             loaded_config=p.runtimes.loaded_config,
                             lending=p.lending, recipes=p.recipes, analytics=p.analytics,
                             limiter=KeyLimiter(p.keys.limits), max_form_parts=p.local_side.max_form_parts,
                             steer=steering.steer if steering is not None else None, tracer=p.tracer)
    p._serve_borrowed = borrowed_server(p.front)
    p.coordinator = None if p.master is None else master_coordinator(
        parts, p.lending, reactor, serve_borrowed=p._serve_borrowed,
        observe_plan=p.metrics.plan_duration.observe)
    p.admin = ModelAdmin(node_id=p.node_id, catalog=catalog, runtimes=p.runtimes, load=p.own_loads.load,
                         blocked=p.assets.blocked,
                         registry=p.master.registry if p.master is not None else None,
                         remote=p.master.client if p.master is not None else None)
    p.bench = BenchRunner(node_id=p.node_id, clock=reactor, catalog=catalog,
                          loaded_config=p.runtimes.loaded_config, load=p.admin.load,
                          handle=partial(p.front.handle, cluster_call=True),
                          book=BenchBook(cluster.store_dir, p.run_in_thread), on_result=p.records_changed)
    p.policy = auth_policy(config)
    p.telemetry = build_telemetry(clock=reactor, slots=p.runtimes.slots, held=p.lending.held_requests,
                                  http=p.http, metrics=p.metrics, observe_loads=p.samples.load_observers)
    p.documents = NodeDocuments(
        node_id=p.node_id, public_url=p.public_url, clock=reactor, started_at=p.started_at,
        config=p.current_config.get, catalog=catalog, runtimes=p.runtimes, assets=p.assets, local=p.local,
        lending=p.lending, samples=p.samples, own_busy=p.own_work.busy, master=p.master, recipes=p.recipes,
        telemetry=p.telemetry, benchmark=p.bench.book.latest, metrics=p.metrics,
        kv_slots=p.kv_slots.rows if p.kv_slots is not None else None)
    docs = p.documents
    p.local_records, p.records, p.listing = docs.local_records, docs.records, docs.listing
    p.image_listing, p.snapshot, p.snapshot_wire = docs.image_listing, docs.snapshot, docs.snapshot_wire
    p.state_document, p.runtime_status = docs.state_document, docs.runtime_status
    p.keepalive = KeepAlive(reactor, config.models.keep_alive, p.runtimes.status,
                            partial(p.admin.unload, target=None))
    p.ollama_control = OllamaControl(p.keepalive, partial(p.admin.load, site=True),
                                     partial(p.admin.unload, target=None, site=True))
    p._refit_loop = CostRefit(reactor, store=p.current_store.get, lending=p.lending,
                              run_in_thread=p.run_in_thread,
                              interval=cluster.lending.scheduling_refresh_interval)
