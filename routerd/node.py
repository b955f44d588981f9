"""One routerd node: builds and wires its object graph (architecture principle 4).

``Node`` owns the catalog, store, backend runtimes, metrics, lending and — by role — the master's
registry, health poller and lending coordinator or the slave's registration loop.  It decides
nothing itself: the request path is ``serve.front``, documents are ``serve.documents``, model
loads ``serve.admin``, lending ``lending.service`` with its ``lending.transport``.  Everything that
runs on a timer or must be stopped is a child of ``services``, whose order is the stop order.
Several nodes can live in one reactor on different ports; that is how integration tests build
clusters cheaply.  The HTTP edge (``routerd.api``) is built on top of a node, never the reverse.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, cast

from treq.client import HTTPClient
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.threads import deferToThread
from twisted.logger import Logger
from twisted.web.client import Agent, HTTPConnectionPool

from routerd import __version__
from routerd.backends.errors import LoadFailed
from routerd.backends.runtimes import Runtimes
from routerd.backends.slot import SlotState
from routerd.catalog.catalog import Catalog
from routerd.catalog.hashing import FileHashCache
from routerd.catalog.model import RUNTIME_KINDS, Capabilities, ModelConfig
from routerd.cluster.auth import AuthPolicy
from routerd.cluster.client import NodeClient
from routerd.cluster.master import MasterAgent
from routerd.cluster.slave import RegistrationRefused, SlaveAgent
from routerd.config.lending import LendingSettings
from routerd.config.load import reread_config
from routerd.config.schema import Config
from routerd.lending.admin import SettingsEditor, stored_guardians
from routerd.lending.bootstrap import load_lending_state
from routerd.lending.coordinator import Coordinator
from routerd.lending.decisions import DecisionLog
from routerd.lending.offload import Borrowed, offload_returned
from routerd.lending.pricing import fit_node
from routerd.lending.restore import Restorer
from routerd.lending.service import LendingService
from routerd.lending.transport import InProcess, LendingTransport, NoMaster, ViaMaster
from routerd.metrics import NodeMetrics
from routerd.registry.identity import MemoryPublicIdStore
from routerd.registry.recipes import FILE_NAME as RECIPES_FILE
from routerd.registry.recipes import RecipeBook, RecipeFile
from routerd.registry.registry import Registry
from routerd.routing.adapters.ollama import ListedModel
from routerd.routing.call import Call, Incoming, Reply
from routerd.routing.classify import classify
from routerd.routing.forward import Forwarder
from routerd.routing.relay import Timeouts
from routerd.serve import documents
from routerd.serve.admin import ModelAdmin
from routerd.serve.assets import build_asset_service
from routerd.serve.front import InferenceFront
from routerd.serve.keepalive import KeepAlive, OllamaControl
from routerd.serve.local import LocalInference
from routerd.serve.recipes import RecipeRouter, merge_listing
from routerd.serve.reload import Reloader
from routerd.serve.samples import Measurements
from routerd.services import HookService, IntervalService, OrderedServices
from routerd.store.store import Store
from routerd.urls import AllowList
from routerd.wire.records import ModelRecord, Snapshot, snapshot_to_json
from routerd.wire.status import RuntimeStatus

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
        self._pool = HTTPConnectionPool(reactor, persistent=True)
        self._pool.maxPersistentPerHost = 64
        self._pool.retryAutomatically = False
        self.agent = agent if agent is not None else Agent(reactor, pool=self._pool, connectTimeout=10)
        # treq for node-to-node calls and readiness probes (cookies/redirects handled by NodeClient)
        self.http = cast(Any, http if http is not None else HTTPClient(self.agent))
        # Tests inject an in-memory store and a synchronous "thread" (no threads in unit tests).
        self._open_store = open_store or (lambda path: Store.open(path, reactor))
        self._run_in_thread = run_in_thread
        self.run_in_thread = run_in_thread
        self.hash_cache = FileHashCache(os.path.join(cluster.store_dir, "hash-cache.json"))
        self.started_at = reactor.seconds()
        #: ``starting`` until start() has loaded the startup model, ``ready``, then ``draining``
        #: from a stop on (what ``/health`` answers).
        self.phase = "starting"
        self.samples = Measurements(reactor, self.metrics, lambda: self.store)
        limits = config.limits
        self.timeouts = Timeouts(reactor, limits.first_byte_timeout, limits.idle_stream_timeout)
        self.runtimes = Runtimes(reactor, config, self.http, launcher=launcher, on_load=self.samples.on_load,
                                 port_allocator=port_allocator)
        self.local = LocalInference(node_id=self.node_id, clock=reactor, runtimes=self.runtimes,
                                    agent=self.agent, samples=self.samples, on_acquire=self._acquiring,
                                    timeouts=self.timeouts, max_queued_per_model=limits.max_queued_per_model,
                                    blocked=lambda model: self.assets.blocked(model))
        self.restorer = Restorer(clock=reactor, delay=lambda: self.lending.settings.offload_restore_delay,
                                 loaded_config=self._loaded_config,
                                 borrowed_in_flight=self._borrowed_in_flight,
                                 own_busy=self.local.own_busy, load=self._restore_load,
                                 on_loaded=self.samples.own_work_done)
        self.decisions = DecisionLog(None, reactor, self.node_id, __version__,
                                     cluster.lending.offload_decisions_retention)
        self.master: MasterAgent | None = None
        self.slave: SlaveAgent | None = None
        self.coordinator: Coordinator | None = None
        self.on_fatal: Callable[[BaseException], None] = lambda _exc: None
        forwarder: Forwarder | None = None
        transport: LendingTransport = NoMaster()
        asset_client: NodeClient | None = None
        if self.role == "master":
            routing_allowed = AllowList()
            client = NodeClient(self.http, cluster.token, AllowList(cluster.slave_urls),
                                cluster.control_timeout, reactor)
            self._public_ids = MemoryPublicIdStore(on_assign=self.samples.save_public_id)
            registry = Registry(self.node_id, cluster.public_url, self._public_ids,
                                local_ready=self._local_ready)
            self.master = MasterAgent(node_id=self.node_id, slave_urls=cluster.slave_urls,
                                      registry=registry, client=client, routing_allowed=routing_allowed,
                                      clock=reactor, health_interval=cluster.health_interval,
                                      local_status=self.runtime_status)
            forwarder = Forwarder(self.agent, cluster.token, routing_allowed, self.timeouts)
            asset_client = client
            transport = InProcess(self.node_id, lambda: cast(Coordinator, self.coordinator))
        elif self.role == "slave":
            client = NodeClient(self.http, cluster.token, AllowList([cluster.master_url, cluster.public_url]),
                                cluster.control_timeout, reactor)
            self.slave = SlaveAgent(master_url=cluster.master_url, client=client,
                                    snapshot=self.snapshot_wire, clock=reactor,
                                    sync_interval=cluster.sync_interval, on_terminal=self._fatal)
            asset_client = client
            transport = ViaMaster(self.node_id, cluster.master_url, client,
                                  Forwarder(self.agent, cluster.token, AllowList([cluster.master_url]),
                                            self.timeouts))
        self.lending = LendingService(
            node_id=self.node_id, settings=cluster.lending, clock=reactor, role=self.role,
            transport=transport, decisions=self.decisions, own_busy=self.own_busy,
            active_config=lambda lane: self.runtimes.loaded_config(lane) or "",
            on_settings=(self._settings_applied,), waiting_for_runtime=self.local.waiting_for_runtime,
            take_back=self.local.take_back)
        if self.master is not None:
            assert forwarder is not None
            self.coordinator = Coordinator(node_id=self.node_id, master=self.master, service=self.lending,
                                           clock=reactor, forwarder=forwarder,
                                           serve_borrowed=self._serve_borrowed,
                                           observe_plan=self.metrics.plan_duration.observe)
            self.master.when_registered(self._slave_registered)
        self.assets = build_asset_service(
            config, clock=reactor, agent=self.agent, http=self.http, cache=self.hash_cache,
            run_in_thread=run_in_thread, metrics_registry=self.metrics.registry, client=asset_client,
            catalog=lambda: self.catalog, on_catalog=self._assets_bound,
            peers=lambda: [] if self.master is None else [
                n.node_url for n in self.master.registry.nodes() if n.healthy])
        self.recipes: RecipeRouter | None = None
        if self.master is not None:
            book = RecipeBook(RecipeFile(os.path.join(cluster.store_dir, RECIPES_FILE)),
                              own_node_id=self.node_id, records=self.master.registry.records,
                              routing_only=lambda: len(self.catalog) == 0,
                              now_ms=lambda: int(reactor.seconds() * 1000))
            self.recipes = RecipeRouter(book=book, node_id=self.node_id, records=self.master.registry.records,
                                        catalog=lambda: self.catalog, runtimes=self.runtimes,
                                        remote=self.master.client)
        self.front = InferenceFront(node_id=self.node_id, clock=reactor, catalog=lambda: self.catalog,
                                    local=self.local, metrics=self.metrics, master=self.master,
                                    forwarder=forwarder, loaded_config=self.runtimes.loaded_config,
                                    lending=self.lending, recipes=self.recipes)
        self.admin = ModelAdmin(node_id=self.node_id, catalog=lambda: self.catalog, runtimes=self.runtimes,
                                blocked=self.assets.blocked,
                                registry=self.master.registry if self.master is not None else None,
                                remote=self.master.client if self.master is not None else None)
        self.policy = AuthPolicy.build(config.auth.inference_keys, config.auth.admin_keys,
                                       cluster.token, config.server.allowed_cidrs,
                                       metrics_keys=config.auth.metrics_keys,
                                       trusted_proxies=config.server.trusted_proxies)
        self.decisions.observe(self.metrics.count_decision)
        self.metrics.watch_queues(lambda: self.local.queued)
        self.metrics.watch_lending(
            lambda: documents.lease_sides(self.lending.live_lease_lanes(), self.coordinator),
            lambda: [(h["lane"], h["state"]) for h in self.lending.held_requests()])
        self.metrics.watch_node(lambda: documents.runtime_views(self.runtimes.slots()),
                                tuple(s.value for s in SlotState),
                                lambda: documents.node_health(self.node_id, self.master))
        self.keepalive = KeepAlive(reactor, config.models.keep_alive, self.runtimes.status,
                                   lambda model: self.admin.unload(model, None))
        self.ollama_control = OllamaControl(self.keepalive, lambda model: self.admin.load(model, site=True),
                                            lambda model: self.admin.unload(model, None, site=True))
        self.reloader = Reloader(self, read_config=read_config or (lambda: reread_config(self.config)),
                                 hash_catalog=self._hash_catalog)
        self._refit_loop = IntervalService("cost refit", self._refit,
                                           cluster.lending.scheduling_refresh_interval, reactor, now=True)
        # A master picks a local replica only when its lane is ready (spec "Registration and health").
        self.lane_probes = None if self.master is None else IntervalService(
            "lane readiness", self.runtimes.refresh_readiness, LANE_PROBE_INTERVAL_S, reactor)
        # Start order top to bottom; stop order bottom to top, each after the one below it.
        self.services = OrderedServices()  # type: ignore[no-untyped-call]
        for child in (HookService("connection pool", on_stop=self._pool.closeCachedConnections),
                      HookService("router database", on_stop=self._close_store),
                      HookService("backends", on_start=self.runtimes.boot, on_stop=self.runtimes.stop),
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
        if self.master is not None:
            self._public_ids.seed(await self.store.public_ids())
            image, text, settings = await load_lending_state(self.store, self.config.cluster.lending)
            self.lending.install_links(image, text)
            self.lending.apply_settings(settings)
            self.lending.install_guardians(await stored_guardians(self.store))
            self.master.registry.update_local(self.local_records())
            await self.master.poll_all()
        # The first cost fit runs now but is not awaited (the refit service's first call).
        self.services.startService()  # type: ignore[no-untyped-call]
        startup = self.config.models.startup_model
        if startup:
            await self.admin.load(startup)
        self.phase = "ready"

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

    # -- reload (serve.reload decides; these apply) ---------------------------

    async def apply_live_config(self, old: Config, new: Config) -> None:
        cluster = new.cluster
        self.policy = AuthPolicy.build(new.auth.inference_keys, new.auth.admin_keys, cluster.token,
                                       new.server.allowed_cidrs, metrics_keys=new.auth.metrics_keys,
                                       trusted_proxies=new.server.trusted_proxies)
        self.keepalive.default_ttl = new.models.keep_alive
        self.timeouts.first_byte = new.limits.first_byte_timeout
        self.timeouts.idle = new.limits.idle_stream_timeout
        self.local.max_queued_per_model = new.limits.max_queued_per_model
        if self.master is not None:
            self.master.health_interval = cluster.health_interval
            self.master.getServiceNamed("health poll").set_interval(cluster.health_interval)  # type: ignore[no-untyped-call]
            self.master.client.control_timeout = cluster.control_timeout
        if self.slave is not None:
            self.slave.sync_interval = cluster.sync_interval
            self.slave.getServiceNamed("registration").set_interval(cluster.sync_interval)  # type: ignore[no-untyped-call]
            self.slave.client.control_timeout = cluster.control_timeout
        if cluster.lending != old.cluster.lending:
            self.lending.config_settings = cluster.lending
            if self.master is not None:  # default < config < stored override, pushed to the slaves
                await SettingsEditor(self.store, self.lending).document(apply=True)
            else:
                self.lending.apply_settings(cluster.lending)

    async def announce(self) -> None:
        """After a reload: the asset index follows the new models (portable configs bound again);
        a master refreshes its own records and re-polls; a slave re-registers."""
        await self.assets.rebuild_index()
        ensureDeferred(self.assets.resolve()).addErrback(  # may pull from peers: not awaited
            lambda f: self.log.failure("resolving model assets failed", failure=f))
        if self.master is not None:
            self.master.registry.update_local(self.local_records())
            await self.master.poll_all()
        if self.slave is not None and self.slave.running:
            await self.slave.register_once()

    def _fatal(self, exc: RegistrationRefused) -> None:
        self.log.critical("{reason}; stopping", reason=str(exc))
        self.on_fatal(exc)

    # -- assets (serve.assets decides) ----------------------------------------

    async def _assets_bound(self, catalog: Catalog) -> None:
        self.catalog = await catalog.hashed(self.hash_cache, self._run_in_thread)
        if self.master is not None:
            self.master.registry.update_local(self.local_records())

    # -- lending ----------------------------------------------------------------

    async def _refit(self) -> None:
        """Fit this node's own cost coefficients from its own samples (off the reactor thread)."""
        if self.store is None:
            return
        settings = self.lending.settings
        now_ms = int(self.reactor.seconds() * 1000)
        since = now_ms - int(settings.scheduling_sample_window * 1000)
        samples = []
        for section in ("image", "llm"):
            samples.extend(await self.store.request_samples(None, section, since))
        loads = await self.store.load_samples(since)
        self.lending.update_costs(await self._run_in_thread(fit_node, samples, loads, settings, now_ms))

    def _settings_applied(self, settings: LendingSettings) -> None:
        self.decisions.set_retention(settings.offload_decisions_retention)
        self._refit_loop.set_interval(settings.scheduling_refresh_interval)
        if self.coordinator is not None:
            self.coordinator.restart_tick()

    # -- restore after borrow or after a same-node guardian (lending.restore decides) ----------

    def own_busy(self) -> bool:
        """Own work runs: an own request in a backend, or a restore load (reference §7)."""
        return self.local.own_busy() or self.restorer.loading > 0

    def _acquiring(self, call: Call, model: ModelConfig) -> None:
        self.restorer.acquired(call.route.runtime, model.filename, borrowed=call.borrowed,
                               restore=call.restore_after_borrow or call.guardian_restore)

    def _loaded_config(self, kind: str) -> str | None:
        for known in RUNTIME_KINDS:
            if known == kind:
                return self.runtimes.loaded_config(known)
        return None

    def _borrowed_in_flight(self) -> bool:
        return any(a.borrowed for a in self.local.active.values()) or bool(self.lending.borrowed_requests())

    async def _restore_load(self, kind: str, config: str) -> None:
        model = next((m for m in self.catalog.models if m.filename == config), None)
        runtime = next((k for k in RUNTIME_KINDS if k == kind), None)
        if model is None or runtime is None:
            raise LoadFailed(f"{config} is no longer in the catalog")
        await self.runtimes.load(model, runtime)

    def _slave_registered(self, node_id: str) -> None:
        self.lending.push_soon(node_id)

    def _serve_borrowed(self, reply: Reply, incoming: Incoming, borrowed: Borrowed) -> Deferred[bytes]:
        from twisted.internet.defer import ensureDeferred

        route = classify("POST", incoming.path)
        if route is None:
            raise offload_returned(f"{incoming.path} is not an inference path")
        return ensureDeferred(self.front.handle(incoming, reply, route, cluster_call=True, borrowed=borrowed))

    # -- records and documents (serve.documents, fed this node's state) -------------------------

    def _local_ready(self, kind: Any, record: ModelRecord) -> bool:
        model = self.catalog.get(record.local_id)
        return model is not None and self.runtimes.ready(kind, model)

    def local_records(self) -> list[ModelRecord]:
        return self.assets.annotate(documents.local_records(self.catalog, self.node_id, self.public_url,
                                                            self.runtimes.loaded_config))

    def records(self) -> list[ModelRecord]:
        """The models this node lists: the merged registry on a master, else its own."""
        if self.master is not None:
            return documents.with_local_loaded(self.master.registry.records(), self.node_id, self.catalog,
                                               self.runtimes.loaded_config)
        return self.local_records()

    def listing(self, keep: Callable[[Capabilities], bool]) -> list[ListedModel]:
        listed = documents.listing(self.records(), keep, self.catalog, self.node_id, self.started_at)
        if self.recipes is None:
            return listed
        return merge_listing(self.recipes.listed(keep), listed, lambda e: e.name)

    def image_listing(self) -> list[dict[str, Any]]:
        listed = documents.image_listing(self.records())
        if self.recipes is None:
            return listed
        return merge_listing(self.recipes.image_listed(), listed, lambda e: e["model_name"])

    def snapshot_wire(self) -> Snapshot:
        return documents.snapshot(self.node_id, self.public_url, self.local_records())

    def snapshot(self) -> dict[str, Any]:
        return snapshot_to_json(self.snapshot_wire())

    def state_document(self) -> dict[str, Any]:
        return documents.state(self.node_id, int(self.reactor.seconds() * 1000), self.runtimes.status(),
                               self.local.active.values(), self.lending.held_requests())

    def runtime_status(self) -> RuntimeStatus:
        # borrowed work does not count as busy (spec "Probes")
        idle_s = 0.0 if self.own_busy() else max(0.0, self.reactor.seconds() - self.samples.own_work_at)
        return documents.runtime_status(
            self.node_id, self.config.backend.mode, self.runtimes.status(),
            self.runtimes.loaded_config("stt") or "", int(idle_s * 1000),
            self.lending.sync_fingerprint(), self.lending.lane_statuses(), self.lending.costs)
