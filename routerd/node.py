"""One routerd node: builds and wires its object graph (architecture principle 4).

``Node`` owns the catalog, store, backend runtimes, metrics, lending and — by role — the master's
registry, health poller and lending coordinator or the slave's registration loop (built by
``assembly.roles``).  It decides nothing itself: the request path is ``inference.front``, documents are
``assembly.documents`` over ``routerd.documents``, model loads ``inference.admin``, lending
``lending.service`` with its ``lending.transport``.  Everything that
runs on a timer or must be stopped is a child of ``services``, whose order is the stop order.
Several nodes can live in one reactor on different ports; that is how integration tests build
clusters cheaply.  The HTTP edge (``routerd.api``) is built on top of a node, never the reverse.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, cast

from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.threads import deferToThread
from twisted.logger import Logger

from routerd import __version__
from routerd.assembly.clients import NodeClients
from routerd.assembly.documents import NodeDocuments
from routerd.assembly.refit import CostRefit
from routerd.assembly.restore import build_restorer
from routerd.assembly.roles import (
    apply_live_cluster,
    apply_live_lending,
    borrowed_server,
    master_coordinator,
    master_parts,
    recipe_router,
    slave_parts,
    standalone_parts,
    start_site,
)
from routerd.assets.service import build_asset_service
from routerd.backends.runtimes import Runtimes
from routerd.catalog.catalog import Catalog
from routerd.catalog.hashing import FileHashCache
from routerd.catalog.model import ModelConfig, RuntimeKind
from routerd.cluster.auth import AuthPolicy
from routerd.cluster.slave import RegistrationRefused
from routerd.config.keys import KeyLimits
from routerd.config.lending import LendingSettings
from routerd.config.load import reread_config
from routerd.config.schema import Config
from routerd.inference.admin import ModelAdmin
from routerd.inference.analytics import AnalyticsRecorder
from routerd.inference.bench import BenchBook, BenchRunner
from routerd.inference.front import InferenceFront
from routerd.inference.keepalive import KeepAlive, OllamaControl
from routerd.inference.local import LocalInference
from routerd.inference.memory import freeze_start_up
from routerd.inference.own_loads import OwnLoads
from routerd.inference.recipes import RecipeRouter
from routerd.inference.samples import Measurements
from routerd.inference.video import VideoJobs
from routerd.lending.coordinator import Coordinator
from routerd.lending.decisions import DecisionLog
from routerd.lending.service import LendingService
from routerd.metrics import NodeMetrics
from routerd.process.reload import Reloader
from routerd.routing.call import Call
from routerd.routing.key_limits import KeyLimiter
from routerd.routing.relay import Timeouts
from routerd.services import HookService, IntervalService, OrderedServices
from routerd.store.store import Store

#: How often a master probes its own backends' lanes (text, image, stt readiness).
LANE_PROBE_INTERVAL_S = 1.0


class Node:
    log = Logger()

    def __init__(self, config: Config, reactor: Any, *, launcher: Any = None, http: Any = None,
                 agent: Any = None, port_allocator: Callable[[], int] | None = None,
                 open_store: Callable[[str], Any] | None = None,
                 run_in_thread: Callable[..., Any] = deferToThread,
                 read_config: Callable[[], Config] | None = None) -> None:
        cluster = config.cluster
        self.config = config
        self.reactor = reactor
        self.role = cluster.role
        self.node_id = cluster.node_id
        self.public_url = cluster.public_url
        self.metrics = NodeMetrics()
        self.catalog = Catalog.scan(config.models.config_dir, config.backend.mode)
        for bad in self.catalog.invalid:
            self.log.warn("model config {filename} is invalid: {reason}", filename=bad.filename,
                          reason=bad.reason)
        self.store: Store | None = None
        self.clients = NodeClients(reactor, agent=agent, http=http)
        self.agent, self.http = self.clients.agent, self.clients.http
        self.backend_agent = self.clients.backend_agent
        # Tests inject an in-memory store and a synchronous "thread" (no threads in unit tests).
        self._open_store = open_store or (lambda path: Store.open(path, reactor))
        self._run_in_thread = run_in_thread
        self.run_in_thread = run_in_thread
        self.hash_cache = FileHashCache(os.path.join(cluster.store_dir, "hash-cache.json"))
        self.started_at = reactor.seconds()
        #: ``starting`` until start() has loaded the startup model, ``ready``, then ``draining``
        #: from a stop on (what ``/health`` answers).
        self.phase = "starting"
        self.analytics = AnalyticsRecorder(reactor, config.analytics, self.node_id, lambda: self.store)
        self._analytics_loop = IntervalService("analytics flush", self.analytics.tick,
                                               config.analytics.flush_interval, reactor)
        self.samples = Measurements(reactor, self.metrics, lambda: self.store, self.analytics)
        limits = config.limits
        self.timeouts = Timeouts(reactor, limits.first_byte_timeout, limits.idle_stream_timeout)
        self.runtimes = Runtimes(reactor, config, self.http, launcher=launcher, on_load=self.samples.on_load,
                                 port_allocator=port_allocator)
        self.local = LocalInference(node_id=self.node_id, clock=reactor, runtimes=self.runtimes,
                                    agent=self.backend_agent, samples=self.samples,
                                    on_acquire=self._acquiring,
                                    on_claimed=lambda call, claimed: self.lending.own_claimed(call, claimed),
                                    timeouts=self.timeouts, max_queued_per_model=limits.max_queued_per_model,
                                    blocked=lambda model: self.assets.blocked(model))
        self.restorer = build_restorer(reactor, runtimes=self.runtimes, local=self.local,
                                       lending=lambda: self.lending, catalog=lambda: self.catalog,
                                       on_loaded=self.samples.own_work_done)
        self.decisions = DecisionLog(None, reactor, self.node_id, __version__,
                                     cluster.lending.offload_decisions_retention)
        self.on_fatal: Callable[[BaseException], None] = lambda _exc: None
        if self.role == "master":
            parts = master_parts(cluster, reactor, http=self.clients.peer_http, agent=self.clients.peer_agent,
                                 timeouts=self.timeouts,
                                 on_public_id=self.samples.save_public_id,
                                 local_ready=lambda kind, record: self.documents.local_ready(kind, record),
                                 local_status=lambda: self.runtime_status(),
                                 coordinator=lambda: cast(Coordinator, self.coordinator))
        elif self.role == "slave":
            parts = slave_parts(cluster, reactor, http=self.clients.peer_http, agent=self.clients.peer_agent,
                                timeouts=self.timeouts,
                                snapshot=lambda: self.snapshot_wire(), on_terminal=self._fatal)
        else:
            parts = standalone_parts(cluster, reactor, http=self.clients.peer_http)
        self.master, self.slave = parts.master, parts.slave
        #: What the site API reads (``assembly.roles``): the master's agent, a standalone node's
        #: site of one, None on a slave.
        self.site = parts.site
        self._public_ids = parts.public_ids
        self.lending = LendingService(
            node_id=self.node_id, settings=cluster.lending, clock=reactor, role=self.role,
            transport=parts.transport, decisions=self.decisions, own_busy=self.own_busy,
            active_config=lambda lane: self.runtimes.loaded_config(lane) or "",
            on_settings=(self._settings_applied,), waiting_for_runtime=self.local.waiting_for_runtime,
            take_back=self.local.take_back, shared_lanes=self.runtimes.lanes_sharing,
            max_queued=lambda: self.local.max_queued_per_model,
            queued_in_backend=lambda model: self.local.queued.get(model.local_id, 0),
            key_weight=self._key_weight, aging=lambda: self.config.queue.aging, run_local=self.local.serve)
        # explicit loads (admin, Ollama preload, startup, reload, recipes) are this node's own work
        self.own_loads = OwnLoads(self.runtimes.load, starting=self._own_load_starting,
                                  done=self.samples.own_work_done)
        self.coordinator: Coordinator | None = None
        self._serve_borrowed = borrowed_server(lambda: self.front)
        self.recipes: RecipeRouter | None = None
        if self.master is not None:
            self.coordinator = master_coordinator(parts, self.lending, reactor,
                                                  serve_borrowed=self._serve_borrowed,
                                                  observe_plan=self.metrics.plan_duration.observe)
        if self.site is not None:
            self.recipes = recipe_router(self.site, cluster.store_dir, reactor,
                                         catalog=lambda: self.catalog, runtimes=self.own_loads)
        self.assets = build_asset_service(
            config, clock=reactor, agent=self.agent, http=self.http, cache=self.hash_cache,
            run_in_thread=run_in_thread, metrics_registry=self.metrics.registry, client=parts.client,
            catalog=lambda: self.catalog, on_catalog=self._assets_bound,
            peers=lambda: [] if self.master is None else [
                n.node_url for n in self.master.registry.nodes() if n.healthy])
        self.jobs = VideoJobs(node_id=self.node_id, clock=reactor, agent=self.backend_agent,
                              forwarder=parts.forwarder, node_url=self._node_url)
        self.local.jobs = self.jobs
        self.front = InferenceFront(node_id=self.node_id, clock=reactor, catalog=lambda: self.catalog,
                                    local=self.local, metrics=self.metrics, master=self.master,
                                    forwarder=parts.forwarder, loaded_config=self.runtimes.loaded_config,
                                    lending=self.lending, recipes=self.recipes, analytics=self.analytics,
                                    limiter=KeyLimiter(self._key_limits),
                                    max_form_parts=lambda: self.config.limits.max_form_parts)
        self.admin = ModelAdmin(node_id=self.node_id, catalog=lambda: self.catalog, runtimes=self.runtimes,
                                load=self.own_loads.load,
                                blocked=self.assets.blocked,
                                registry=self.master.registry if self.master is not None else None,
                                remote=self.master.client if self.master is not None else None)
        self.bench = BenchRunner(node_id=self.node_id, clock=reactor, catalog=lambda: self.catalog,
                                 loaded_config=self.runtimes.loaded_config, load=self.admin.load,
                                 handle=lambda incoming, reply, route: self.front.handle(
                                     incoming, reply, route, cluster_call=True),
                                 book=BenchBook(cluster.store_dir, run_in_thread),
                                 on_result=lambda _result: self._records_changed())
        self.policy = AuthPolicy.build(config.auth.inference_keys, config.auth.admin_keys,
                                       cluster.token, config.server.allowed_cidrs,
                                       metrics_keys=config.auth.metrics_keys,
                                       trusted_proxies=config.server.trusted_proxies,
                                       named_keys=config.auth.named_keys)
        self.decisions.observe(self.metrics.count_decision)
        self.documents = NodeDocuments(
            node_id=self.node_id, public_url=self.public_url, clock=reactor, started_at=self.started_at,
            backend_mode=lambda: self.config.backend.mode, catalog=lambda: self.catalog,
            runtimes=self.runtimes, assets=self.assets, local=self.local, lending=self.lending,
            samples=self.samples, own_busy=self.own_busy, master=self.master, recipes=self.recipes,
            benchmark=lambda model_id: self.bench.book.latest(model_id))
        self.documents.watch(self.metrics, self.coordinator)
        # the documents the HTTP edge and the cluster agents read (assembly.documents computes them)
        docs = self.documents
        self.local_records, self.records, self.listing = docs.local_records, docs.records, docs.listing
        self.image_listing, self.snapshot = docs.image_listing, docs.snapshot
        self.state_document = docs.state_document
        self.snapshot_wire, self.runtime_status = docs.snapshot_wire, docs.runtime_status
        self.keepalive = KeepAlive(reactor, config.models.keep_alive, self.runtimes.status,
                                   lambda model: self.admin.unload(model, None))
        self.ollama_control = OllamaControl(self.keepalive, lambda model: self.admin.load(model, site=True),
                                            lambda model: self.admin.unload(model, None, site=True))
        self.reloader = Reloader(self, read_config=read_config or (lambda: reread_config(self.config)),
                                 hash_catalog=self._hash_catalog, own_loads=self.own_loads)
        self._refit_loop = CostRefit(reactor, store=lambda: self.store, lending=self.lending,
                                     run_in_thread=run_in_thread,
                                     interval=cluster.lending.scheduling_refresh_interval)
        self._refit = self._refit_loop.refit
        # A master picks a local replica only when its lane is ready (spec "Registration and health").
        self.lane_probes = None if self.master is None else IntervalService(
            "lane readiness", self.runtimes.refresh_readiness, LANE_PROBE_INTERVAL_S, reactor)
        # Start order top to bottom; stop order bottom to top, each after the one below it.
        self.services = OrderedServices()  # type: ignore[no-untyped-call]
        for child in (HookService("connection pool", on_stop=self.clients.close),
                      HookService("router database", on_stop=self._close_store),
                      # analytics' buffered rows are written before the store closes
                      HookService("analytics", on_stop=self.analytics.flush),
                      self._analytics_loop,
                      HookService("backends", on_start=self.runtimes.boot, on_stop=self.runtimes.stop),
                      # stopped before the backends: running video jobs end and give their runtime back
                      HookService("video jobs", on_stop=self.jobs.stop),
                      HookService("restore after borrow", on_stop=self.restorer.stop),
                      HookService("decision log", on_start=lambda: self.decisions.start(self.store),
                                  on_stop=self.decisions.stop),
                      self._refit_loop, IntervalService("keep-alive", self.keepalive.tick, 1.0, reactor),
                      self.assets.retry, self.lane_probes, self.master, self.coordinator):
            if child is not None:
                child.setServiceParent(self.services)  # type: ignore[no-untyped-call]

    # -- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        """Open the store, hash the catalog, poll slaves (master), start the service tree and
        preload the startup model."""
        store_dir = self.config.cluster.store_dir
        self.store = await self._open_store(os.path.join(store_dir, "routerd.sqlite"))
        hashing_started = self.reactor.seconds()
        self.log.info("hashing the weight files of {count} model configs", count=len(self.catalog.models))
        self.catalog = await self._hash_catalog(self.catalog)
        self.log.info("weight files hashed in {seconds:.1f} s",
                      seconds=self.reactor.seconds() - hashing_started)
        self.assets.book.load()
        await self.assets.rebuild_index()
        if self.recipes is not None:
            self.recipes.book.load()
        self.bench.book.load()
        if self.site is not None:
            await start_site(self.site, self._public_ids, self.store, self.lending,
                             self.config.cluster.lending, self.local_records(), links=self.master is not None)
        # The first cost fit runs now but is not awaited (the refit service's first call).
        self.services.startService()  # type: ignore[no-untyped-call]
        startup = self.config.models.startup_model
        if startup:
            await self.admin.load(startup)
        self.phase = "ready"
        freeze_start_up()  # start-up's objects out of full collections (routerd.inference.memory)

    async def after_listening(self) -> None:
        """Steps that need the listener open: portable configs are resolved (in the background;
        peers may pull from this node meanwhile) and a slave registers with its master."""
        ensureDeferred(self.assets.resolve()).addErrback(
            lambda f: self.log.failure("resolving model assets failed", failure=f))
        if self.slave is not None:
            await self.slave.start()
            self.slave.setServiceParent(self.services)  # type: ignore[no-untyped-call]

    async def drain(self, timeout: float) -> None:
        """Stop taking work and let in-flight requests finish, for up to ``timeout`` seconds
        (``/health`` answers 503 ``draining`` from now on; see ``InferenceFront.drain``)."""
        self.phase = "draining"
        await self.front.drain(timeout)

    async def stop(self) -> None:
        self.phase = "draining"
        if self.services.running:
            await self.services.stopService()

    async def _close_store(self) -> None:
        if self.store is not None:
            await self.store.close()

    def _hash_catalog(self, catalog: Catalog) -> Deferred[Catalog]:
        return catalog.hashed(self.hash_cache, self._run_in_thread)

    def _key_limits(self, key_name: str) -> KeyLimits | None:
        """The limits of the inference key named ``key_name`` (None for an unknown name)."""
        for key in self.config.auth.inference_entries():
            if key.name == key_name:
                return key.limits
        return None

    def _key_weight(self, key_name: str) -> float:
        """The fair-share weight of the inference key named ``key_name`` (1 for unknown names)."""
        limits = self._key_limits(key_name)
        return limits.weight if limits is not None else 1.0

    # -- reload (process.reload decides; these apply) ---------------------------

    async def apply_live_config(self, old: Config, new: Config) -> None:
        cluster = new.cluster
        self.policy = AuthPolicy.build(new.auth.inference_keys, new.auth.admin_keys, cluster.token,
                                       new.server.allowed_cidrs, metrics_keys=new.auth.metrics_keys,
                                       trusted_proxies=new.server.trusted_proxies,
                                       named_keys=new.auth.named_keys)
        self.keepalive.default_ttl = new.models.keep_alive
        self.timeouts.first_byte = new.limits.first_byte_timeout
        self.timeouts.idle = new.limits.idle_stream_timeout
        self.local.max_queued_per_model = new.limits.max_queued_per_model
        self.analytics.config = new.analytics  # on or off, retentions, buffer bound: from now on
        self._analytics_loop.set_interval(new.analytics.flush_interval)
        apply_live_cluster(cluster, self.master, self.slave)
        if cluster.lending != old.cluster.lending:
            await apply_live_lending(cluster.lending, self.lending, self.store,
                                     site=self.site is not None)

    async def announce(self) -> None:
        """After a reload: the asset index follows the new models (portable configs bound again);
        a master refreshes its own records and re-polls; a slave re-registers."""
        await self.assets.rebuild_index()
        ensureDeferred(self.assets.resolve()).addErrback(  # may pull from peers: not awaited
            lambda f: self.log.failure("resolving model assets failed", failure=f))
        if self.site is not None:
            self.site.registry.update_local(self.local_records())
            await self.site.poll_all()
        if self.slave is not None and self.slave.running:
            await self.slave.register_once()

    def _records_changed(self) -> None:
        """This node's records changed (a benchmark result): the site's registry reads them again;
        a slave's master sees them at its next poll."""
        if self.site is not None:
            self.site.registry.update_local(self.local_records())

    def _node_url(self, node_id: str) -> str | None:
        """Where a master reaches node ``node_id`` (a video job's polls go there)."""
        info = self.master.registry.node(node_id) if self.master is not None else None
        return info.node_url if info is not None else None

    def _fatal(self, exc: RegistrationRefused) -> None:
        self.log.critical("{reason}; stopping", reason=str(exc))
        self.on_fatal(exc)

    # -- assets (assets.service decides) ----------------------------------------

    async def _assets_bound(self, catalog: Catalog) -> None:
        current = self.catalog
        hashed = await catalog.hashed(self.hash_cache, self._run_in_thread)
        if self.catalog is not current:  # replaced while hashing: the newer one stands
            return
        self.catalog = hashed
        if self.site is not None:
            self.site.registry.update_local(self.local_records())

    # -- lending ----------------------------------------------------------------

    def _settings_applied(self, settings: LendingSettings) -> None:
        self.decisions.set_retention(settings.offload_decisions_retention)
        self._refit_loop.set_interval(settings.scheduling_refresh_interval)
        if self.coordinator is not None:
            self.coordinator.restart_tick()

    # -- restore after borrow or after a same-node guardian (assembly.restore, lending.restore) --

    def own_busy(self) -> bool:
        """Own work runs: an own request in a backend, a restore load (reference §7) or an explicit
        load (admin, Ollama preload, startup, reload, recipe; issue 21 §2)."""
        return self.local.own_busy() or self.restorer.loading > 0 or self.own_loads.running > 0

    def _own_load_starting(self, model: ModelConfig, kind: RuntimeKind | None) -> None:
        self.lending.own_work_arrived(self.runtimes.lanes_sharing(kind, model))

    def _acquiring(self, call: Call, model: ModelConfig) -> None:
        self.lending.own_acquiring(call, model)  # own work first (spec "A helper's own work")
        self.restorer.acquired(call.route.runtime, model.filename, borrowed=call.borrowed,
                               restore=call.restore_after_borrow or call.guardian_restore)
