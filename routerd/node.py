"""One routerd node: builds and wires its object graph (architecture principle 4).

``Node`` owns the catalog, store, backend runtimes, metrics, HTTP app and —
by role — the master's registry and health poller or the slave's registration
loop.  Several nodes can live in one reactor on different ports; that is how
integration tests build clusters cheaply.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from typing import Any, cast
from urllib.parse import urlencode

from treq.client import HTTPClient
from twisted.internet import task
from twisted.internet.defer import Deferred, ensureDeferred, succeed
from twisted.internet.threads import deferToThread
from twisted.logger import Logger
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.iweb import IRequest

from routerd import __version__
from routerd.api.app import build_app
from routerd.api.front import InferenceFront
from routerd.api.inference import LocalInference
from routerd.api.site import GuardResource, NodeSite
from routerd.backends.errors import BackendMissing, LoadFailed
from routerd.backends.runtimes import LoadEvent, Runtimes
from routerd.catalog.catalog import Catalog
from routerd.catalog.hashing import FileHashCache
from routerd.catalog.model import RUNTIME_KINDS, Capabilities, ModelConfig, RuntimeKind
from routerd.cluster.auth import AuthPolicy
from routerd.cluster.client import AllowList, NodeClient
from routerd.cluster.master import MasterAgent
from routerd.cluster.slave import RegistrationRefused, SlaveAgent
from routerd.config.lending import LendingSettings
from routerd.config.schema import Config
from routerd.errors import HTTPError
from routerd.lending.bootstrap import load_lending_state
from routerd.lending.coordinator import Coordinator, RelayRequest
from routerd.lending.decisions import DecisionLog
from routerd.lending.pricing import fit_node
from routerd.lending.service import Borrowed, LendingService, Returned, lease_from_json, offload_returned
from routerd.metrics import NodeMetrics
from routerd.registry.identity import MemoryPublicIdStore
from routerd.registry.registry import Registry
from routerd.routing.adapters.ollama import ListedModel
from routerd.routing.call import Call
from routerd.routing.classify import classify
from routerd.routing.forward import CameBack, Forwarder, Outbound, Unreachable
from routerd.routing.relay import query_args
from routerd.store.samples import LoadSample, RequestSample
from routerd.store.store import Store
from routerd.wire.lending import Lane, Lease, Trigger
from routerd.wire.lending import to_json as lending_json
from routerd.wire.records import (
    PROTOCOL_VERSION,
    ModelRecord,
    Snapshot,
    record_from_config,
    record_to_json,
)


class Node:
    log = Logger()

    def __init__(self, config: Config, reactor: Any, *, launcher: Any = None, http: Any = None,
                 agent: Any = None, port_allocator: Callable[[], int] | None = None,
                 open_store: Callable[[str], Any] | None = None,
                 run_in_thread: Callable[..., Any] = deferToThread) -> None:
        self.config = config
        self.reactor = reactor
        self.role = config.cluster.role
        self.node_id = config.cluster.node_id
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
        # Tests inject an in-memory store and a synchronous "thread" (no threads in unit tests).
        self._open_store = open_store or (lambda path: Store.open(path, reactor))
        self._run_in_thread = run_in_thread
        # treq for node-to-node calls and readiness probes (cookies/redirects handled by NodeClient)
        self.http = cast(Any, http if http is not None else HTTPClient(self.agent))
        self.runtimes = Runtimes(reactor, config, self.http, launcher=launcher, on_load=self._on_load,
                                 port_allocator=port_allocator)
        self.local = LocalInference(node_id=self.node_id, clock=reactor, runtimes=self.runtimes,
                                    agent=self.agent, samples=self)
        self.lending = LendingService(node_id=self.node_id, settings=config.cluster.lending, clock=reactor,
                                      role=self.role)
        self.lending.own_busy = self.local.own_busy
        self.lending.active_config = lambda lane: self.runtimes.loaded_config(lane) or ""
        self.coordinator: Coordinator | None = None
        self._refit_loop: task.LoopingCall | None = None
        self.master: MasterAgent | None = None
        self.slave: SlaveAgent | None = None
        self.on_fatal: Callable[[BaseException], None] = lambda _exc: None
        cluster = config.cluster
        forwarder = None
        if self.role == "master":
            routing_allowed = AllowList()
            probe_allowed = AllowList(cluster.slave_urls)
            client = NodeClient(self.http, cluster.token, probe_allowed, cluster.control_timeout, reactor)
            self._public_ids = MemoryPublicIdStore(on_assign=self._save_public_id)
            registry = Registry(self.node_id, cluster.public_url, self._public_ids,
                                local_ready=self._local_ready)
            self.master = MasterAgent(node_id=self.node_id, slave_urls=cluster.slave_urls,
                                      registry=registry, client=client, routing_allowed=routing_allowed,
                                      clock=reactor, health_interval=cluster.health_interval,
                                      local_status=self.runtime_status)
            forwarder = Forwarder(self.agent, cluster.token, routing_allowed)
            self.coordinator = Coordinator(node_id=self.node_id, master=self.master, service=self.lending,
                                           clock=reactor, forwarder=forwarder,
                                           serve_borrowed=self._serve_borrowed)
            self.lending.send_event = self._event_in_process
            self.lending.send_lent = self._lend_in_process
            self.lending.pusher = self.coordinator.push
            self.master.on_registered = self._slave_registered
        elif self.role == "slave":
            allowed = AllowList([cluster.master_url, cluster.public_url])
            client = NodeClient(self.http, cluster.token, allowed, cluster.control_timeout, reactor)
            self.slave = SlaveAgent(master_url=cluster.master_url, client=client,
                                    snapshot=self.snapshot_wire, clock=reactor,
                                    sync_interval=cluster.sync_interval, on_terminal=self._fatal)
            self._master_client = client
            self._master_forwarder = Forwarder(self.agent, cluster.token, AllowList([cluster.master_url]))
            self.lending.send_event = self._event_to_master
            self.lending.send_lent = self._lend_via_master
        self.front = InferenceFront(node_id=self.node_id, clock=reactor, catalog=lambda: self.catalog,
                                    local=self.local, metrics=self.metrics, master=self.master,
                                    forwarder=forwarder, loaded_config=self.runtimes.loaded_config,
                                    lending=self.lending)
        self.app = build_app(self)
        self.policy = AuthPolicy.build(config.auth.inference_keys, config.auth.admin_keys,
                                       cluster.token, config.server.allowed_cidrs)
        self.started_at = reactor.seconds()
        self.own_work_at = reactor.seconds()

    # -- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        """Open the store, hash the catalog, poll slaves (master), preload the startup model."""
        store_dir = self.config.cluster.store_dir
        self.store = await self._open_store(os.path.join(store_dir, "routerd.sqlite"))
        cache = FileHashCache(os.path.join(store_dir, "hash-cache.json"))
        self.catalog = await self.catalog.hashed(cache, self._run_in_thread)
        self.lending.decisions = DecisionLog(
            self.store, self.reactor, self.node_id, __version__,
            self.lending.settings.offload_decisions_retention)
        self.lending.decisions.start()
        self.lending.on_settings.append(self._settings_applied)
        if self.master is not None:
            self._public_ids.seed(await self.store.public_ids())
            image, text, settings = await load_lending_state(self.store, self.config.cluster.lending)
            self.lending.install_links(image, text)
            self.lending.apply_settings(settings)
            self.master.registry.update_local(self.local_records())
            await self.master.start()
        # The first fit runs now but is not awaited: a large sample window must not
        # hold the listener back (until it lands, this node's models are unpriced).
        self._refit_loop = task.LoopingCall(self._refit_tick)
        self._refit_loop.clock = self.reactor
        self._refit_loop.start(self.lending.settings.scheduling_refresh_interval, now=True)
        if self.coordinator is not None:
            self.coordinator.start()
        startup = self.config.models.startup_model
        if startup:
            await self.load_model(startup)

    async def after_listening(self) -> None:
        """Steps that need the listener open: a slave registers with its master."""
        if self.slave is not None:
            await self.slave.start()

    async def stop(self) -> None:
        if self._refit_loop is not None and self._refit_loop.running:
            self._refit_loop.stop()
        if self.coordinator is not None:
            self.coordinator.stop()
        if self.lending.decisions is not None:
            await self.lending.decisions.stop()
        if self.master is not None:
            self.master.stop()
        if self.slave is not None:
            self.slave.stop()
        await self.runtimes.stop()
        if self.store is not None:
            await self.store.close()
        await self._pool.closeCachedConnections()

    def _fatal(self, exc: RegistrationRefused) -> None:
        self.log.critical("{reason}; stopping", reason=str(exc))
        self.on_fatal(exc)

    def site(self) -> NodeSite:
        limit = self.config.limits.max_body_bytes
        return NodeSite(GuardResource(self.app.resource(), self.policy, limit), limit)

    # -- samples and public IDs -----------------------------------------------

    def finished(self, call: Call) -> None:
        """A request left the backend; own work (not borrowed) resets the idle clock."""
        if not call.borrowed:
            self.own_work_at = self.reactor.seconds()

    def record_request_sample(self, sample: RequestSample) -> Deferred[None]:
        if self.store is None:
            return succeed(None)
        return self.store.record_request_sample(sample)

    def _save_public_id(self, identity: str, base: str, public_id: str) -> None:
        if self.store is not None:
            self.store.save_public_id(identity, base, public_id)

    def _on_load(self, event: LoadEvent) -> None:
        status = "ok" if event.ok else "failed"
        self.metrics.loads.labels(event.model_id, event.kind, status).inc()
        if event.ok:
            self.metrics.load_duration.labels(event.model_id, event.kind).observe(event.duration_ms / 1000)
            self.log.info("loaded {model} on the {runtime} runtime in {duration_ms} ms",
                          model=event.model_id, runtime=event.kind, duration_ms=event.duration_ms)
        else:
            self.log.warn("loading {model} on the {runtime} runtime failed: {reason}",
                          model=event.model_id, runtime=event.kind, reason=event.reason)
        if self.store is not None:
            self.store.record_load_sample(LoadSample(
                config_filename=event.config_filename, model_id=event.model_id, runtime=event.kind,
                duration_ms=event.duration_ms, status=status,
                finished_at_ms=int(self.reactor.seconds() * 1000), reason=event.reason))

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
        self.lending.costs = await self._run_in_thread(fit_node, samples, loads, settings, now_ms)

    def _refit_tick(self) -> Deferred[None]:
        d = ensureDeferred(self._refit())
        return d.addErrback(lambda f: self.log.failure("cost refit failed", failure=f))

    def _settings_applied(self, settings: LendingSettings) -> None:
        if self.lending.decisions is not None:
            self.lending.decisions.set_retention(settings.offload_decisions_retention)
        if self._refit_loop is not None and self._refit_loop.running \
                and self._refit_loop.interval != settings.scheduling_refresh_interval:
            self._refit_loop.stop()
            self._refit_loop.start(settings.scheduling_refresh_interval, now=False)
        if self.coordinator is not None:
            self.coordinator.restart_tick()

    def _slave_registered(self, node_id: str) -> None:
        if self.coordinator is not None:
            ensureDeferred(self.coordinator.push()).addErrback(
                lambda f: self.log.failure("push to {node_id} failed", failure=f, node_id=node_id))

    async def _event_in_process(self, lane: Lane, model_id: str, trigger: Trigger) -> Lease | None:
        assert self.coordinator is not None
        return await self.coordinator.event(lane, self.node_id, model_id, trigger)

    async def _event_to_master(self, lane: Lane, model_id: str, trigger: Trigger) -> Lease | None:
        body = {"lane": lane, "owner_node_id": self.node_id, "model_id": model_id, "trigger": trigger}
        answer = await self._master_client.post_json(self.config.cluster.master_url,
                                                     "/router/v1/node/offload/event", body)
        return lease_from_json(answer.get("lease") if isinstance(answer, dict) else None)

    async def _lend_in_process(self, call: Call, lease: Lease, model_id: str) -> bytes:
        assert self.coordinator is not None
        relay = RelayRequest(lease.lane, self.node_id, model_id, call.path)
        try:
            return await self.coordinator.relay(call.request, relay, call,
                                                rewrite_to=call.selector or model_id, returns_raise=True)
        except CameBack as exc:
            raise Returned(str(exc)) from None

    async def _lend_via_master(self, call: Call, lease: Lease, model_id: str) -> bytes:
        query = urlencode([(k, v) for k, vs in query_args(call.request).items() for v in vs])
        url = self.config.cluster.master_url.rstrip("/") + "/router/v1/node/offload/request"
        out = Outbound(url=url + (f"?{query}" if query else ""), body=call.body,
                       content_type=call.content_type, request_id=call.request_id,
                       headers=((b"x-routerd-offload-owner", self.node_id.encode()),
                                (b"x-routerd-offload-owner-model", model_id.encode()),
                                (b"x-routerd-offload-lane", lease.lane.encode()),
                                (b"x-routerd-offload-path", call.path.encode())),
                       rewrite_to=call.selector or model_id, returns_raise=True)
        try:
            _code, result = await self._master_forwarder.send(call.request, out)
        except (CameBack, Unreachable) as exc:
            raise Returned(str(exc)) from None
        return result

    def _serve_borrowed(self, request: IRequest, path: str, body: bytes, content_type: str,
                        borrowed: Borrowed) -> Deferred[bytes]:
        route = classify("POST", path)
        if route is None:
            raise offload_returned(f"{path} is not an inference path")
        return ensureDeferred(self.front.handle(request, route, path, body, cluster_call=True,
                                                borrowed=borrowed))

    # -- management -----------------------------------------------------------

    def _model(self, name: str) -> ModelConfig:
        model = self.catalog.resolve(name)
        if model is None:
            raise HTTPError(404, f"model {name!r} was not found", "not_found", "model_not_found")
        return model

    def _remote_record(self, name: str) -> ModelRecord | None:
        """The record a master would forward a management call for, or None for local."""
        if self.master is None:
            return None
        records = [r for r in self.master.registry.records()
                   if name in (r.public_id, r.public_image_id) and not r.disabled]
        if not records:
            raise HTTPError(404, f"model {name!r} was not found", "not_found", "model_not_found")
        local = [r for r in records if r.node_id == self.node_id]
        if local:
            return None
        available = [r for r in records if r.available]
        if not available:
            raise HTTPError(502, f"model {name!r} has no available replicas", "backend_error",
                            "backend_error")
        return available[0]

    async def load_model(self, name: str, *, site: bool = False) -> dict[str, Any]:
        remote = self._remote_record(name) if site else None
        if remote is not None:
            assert self.master is not None
            await self.master.client.load(remote.node_url, remote.local_id)
            return {"ok": True, "model": name, "node_id": remote.node_id}
        local_name = name
        if site and self.master is not None:
            for r in self.master.registry.records():
                if r.node_id == self.node_id and name in (r.public_id, r.public_image_id):
                    local_name = r.local_id
        model = self._model(local_name)
        try:
            await self.runtimes.load(model)
        except LoadFailed as exc:
            raise HTTPError(502, f"model {model.local_id!r} failed to load: {exc}",
                            "backend_error", "load_failed") from None
        except BackendMissing as exc:
            raise HTTPError(502, str(exc), "backend_error", "backend_missing") from None
        return {"ok": True, "model": name, "node_id": self.node_id}

    async def unload_model(self, name: Any, target: Any, *, site: bool = False) -> dict[str, Any]:
        if name is not None and not isinstance(name, str):
            raise HTTPError(400, "model must be a string")
        if target is not None and target not in ("text", "image", "stt", "all", "embeddings"):
            raise HTTPError(400, "target must be one of text, image, stt, embeddings, all")
        if name and site:
            remote = self._remote_record(name)
            if remote is not None:
                assert self.master is not None
                await self.master.client.unload(remote.node_url, remote.local_id, target)
                return {"ok": True, "model": name, "node_id": remote.node_id}
        kinds: list[RuntimeKind]
        if name:
            model = self._model(name)
            kinds = [k for k in RUNTIME_KINDS if self.runtimes.loaded_config(k) == model.filename]
        elif target in (None, "all"):
            kinds = list(RUNTIME_KINDS)
        else:
            kinds = ["text" if target == "embeddings" else target]
        for kind in kinds:
            await self.runtimes.unload(kind)
        return {"ok": True, "unloaded": kinds, "node_id": self.node_id}

    # -- records and documents -----------------------------------------------

    def _local_ready(self, kind: RuntimeKind, record: ModelRecord) -> bool:
        model = self.catalog.get(record.local_id)
        return model is not None and self.runtimes.ready(kind, model)

    def _loaded(self, model: ModelConfig) -> bool:
        return any(self.runtimes.loaded_config(k) == model.filename for k in RUNTIME_KINDS
                   if model.capabilities.serves(k))

    def local_records(self) -> list[ModelRecord]:
        url = self.config.cluster.public_url
        return [record_from_config(m, node_id=self.node_id, node_url=url, loaded=self._loaded(m))
                for m in self.catalog.models]

    def records(self) -> list[ModelRecord]:
        """The models this node lists: the merged registry on a master, else its own."""
        if self.master is not None:
            return [self._with_loaded(r) for r in self.master.registry.records()]
        return self.local_records()

    def _with_loaded(self, record: ModelRecord) -> ModelRecord:
        if record.node_id != self.node_id:
            return record
        model = self.catalog.get(record.local_id)
        loaded = model is not None and self._loaded(model)
        return record if record.loaded == loaded else _evolve(record, loaded=loaded)

    def listing(self, keep: Callable[[Capabilities], bool]) -> list[ListedModel]:
        out = []
        seen: set[str] = set()
        loaded_ids = {r.public_id for r in self.records() if r.loaded and r.available}
        for record in self.records():
            caps = record.capabilities
            if not keep(caps) or record.disabled or not record.available or record.public_id in seen:
                continue
            seen.add(record.public_id)
            words = tuple(w for w in ("llm", "multimodal", "embeddings", "image", "stt", "tts")
                          if getattr(caps, w))
            out.append(ListedModel(
                name=record.public_id, model_hash=record.model_hash, size=self._size(record),
                modified_at=self._modified(record), capabilities=words, context=caps.context,
                loaded=record.public_id in loaded_ids))
        return out

    def image_listing(self) -> list[dict[str, Any]]:
        out = []
        seen: set[str] = set()
        for record in self.records():
            image_id = record.public_image_id
            if not record.capabilities.image or not image_id or image_id in seen or record.disabled:
                continue
            seen.add(image_id)
            out.append({"title": image_id, "model_name": image_id, "filename": record.filename,
                        "hash": record.model_hash[:10]})
        return out

    def _size(self, record: ModelRecord) -> int:
        model = self.catalog.get(record.local_id) if record.node_id == self.node_id else None
        total = 0
        for path in (model.weight_files().values() if model is not None else ()):
            try:
                total += os.path.getsize(path)
            except OSError:
                pass
        return total

    def _modified(self, record: ModelRecord) -> str:
        model = self.catalog.get(record.local_id) if record.node_id == self.node_id else None
        try:
            mtime = os.path.getmtime(model.path) if model is not None else self.started_at
        except OSError:
            mtime = 0.0
        return datetime.datetime.fromtimestamp(mtime, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def models_document(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "models": [record_to_json(r) for r in self.records()],
            "invalid": [{"filename": b.filename, "reason": b.reason} for b in self.catalog.invalid],
        }

    def snapshot_wire(self) -> Snapshot:
        return Snapshot(node_id=self.node_id, node_url=self.config.cluster.public_url,
                        build_version=__version__, protocol_version=PROTOCOL_VERSION,
                        models=tuple(self.local_records()))

    def snapshot(self) -> dict[str, Any]:
        from routerd.wire.records import snapshot_to_json

        return snapshot_to_json(self.snapshot_wire())

    def state_document(self) -> dict[str, Any]:
        now_ms = int(self.reactor.seconds() * 1000)
        return {
            "node_id": self.node_id,
            "runtimes": [s.to_json() for s in self.runtimes.status()],
            "active_requests": [a.to_json(now_ms) for a in self.local.active.values()],
            "held_requests": self.lending.held_requests(),
        }

    def runtime_status(self) -> dict[str, Any]:
        statuses = self.runtimes.status()
        stt = self.runtimes.loaded_config("stt")
        now = self.reactor.seconds()
        return {
            "node_id": self.node_id,
            "build_version": __version__,
            "backend_mode": self.config.backend.mode,
            "active_requests": sum(s.users for s in statuses),
            "queued_requests": sum(s.waiters for s in statuses),
            "active_stt_config": stt or "",
            # borrowed work does not count as busy (spec "Probes")
            "idle_for_ms": int(max(0.0, now - self.own_work_at) * 1000) if not self.local.own_busy() else 0,
            "settings_fingerprint": self.lending.settings.fingerprint(),
            "lanes": self.lending.lane_statuses(),
            "costs": lending_json(self.lending.costs),
        }

    def inventory(self) -> dict[str, Any]:
        assert self.master is not None
        nodes = [{"node_id": self.node_id, "node_url": self.config.cluster.public_url, "role": "master",
                  "healthy": True, "build_version": __version__}]
        for info in self.master.registry.nodes():
            nodes.append({"node_id": info.node_id, "node_url": info.node_url, "role": "slave",
                          "healthy": info.healthy, "build_version": info.build_version})
        return {"nodes": nodes, "models": [record_to_json(r) for r in self.records()], "recipes": []}


def _evolve(record: ModelRecord, **changes: Any) -> ModelRecord:
    import attrs

    return attrs.evolve(record, **changes)
