"""One routerd node: builds and wires its object graph (architecture principle 4).

``Node`` owns the catalog, store, backend runtimes, metrics and HTTP app.
Several nodes can live in one reactor on different ports; that is how
integration tests build clusters cheaply.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from treq.client import HTTPClient
from twisted.internet.defer import Deferred, succeed
from twisted.internet.threads import deferToThread
from twisted.logger import Logger
from twisted.web.client import Agent, HTTPConnectionPool

from routerd import __version__
from routerd.api.app import PROTOCOL_VERSION, build_app
from routerd.api.errors import HTTPError
from routerd.api.inference import LocalInference
from routerd.api.site import GuardResource, NodeSite
from routerd.backends.errors import BackendMissing, LoadFailed
from routerd.backends.runtimes import LoadEvent, Runtimes
from routerd.catalog.catalog import Catalog
from routerd.catalog.hashing import FileHashCache
from routerd.catalog.model import RUNTIME_KINDS, Capabilities, ModelConfig, RuntimeKind
from routerd.cluster.auth import AuthPolicy
from routerd.config.schema import Config
from routerd.metrics import NodeMetrics
from routerd.routing.adapters.ollama import ListedModel
from routerd.store.samples import LoadSample, RequestSample
from routerd.store.store import Store


class Node:
    log = Logger()

    def __init__(self, config: Config, reactor: Any, *, launcher: Any = None, http: Any = None,
                 port_allocator: Callable[[], int] | None = None) -> None:
        self.config = config
        self.reactor = reactor
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
        self.agent = Agent(reactor, pool=self._pool, connectTimeout=10)
        self.http = http if http is not None else HTTPClient(self.agent)
        self.runtimes = Runtimes(reactor, config, self.http, launcher=launcher, on_load=self._on_load,
                                 port_allocator=port_allocator)
        self.inference = LocalInference(node_id=self.node_id, clock=reactor, catalog=lambda: self.catalog,
                                        runtimes=self.runtimes, agent=self.agent, samples=self,
                                        metrics=self.metrics)
        self.app = build_app(self)
        self.policy = AuthPolicy.build(config.auth.inference_keys, config.auth.admin_keys,
                                       config.cluster.token, config.server.allowed_cidrs)
        self.started_at = reactor.seconds()

    # -- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        """Open the store, hash the catalog, preload the startup model."""
        store_dir = self.config.cluster.store_dir
        self.store = await Store.open(os.path.join(store_dir, "routerd.sqlite"), self.reactor)
        cache = FileHashCache(os.path.join(store_dir, "hash-cache.json"))
        self.catalog = await self.catalog.hashed(cache, deferToThread)
        startup = self.config.models.startup_model
        if startup:
            await self.load_model(startup)

    async def stop(self) -> None:
        await self.runtimes.stop()
        if self.store is not None:
            await self.store.close()
        await self._pool.closeCachedConnections()

    def site(self) -> NodeSite:
        limit = self.config.limits.max_body_bytes
        return NodeSite(GuardResource(self.app.resource(), self.policy, limit), limit)

    # -- samples --------------------------------------------------------------

    def record_request_sample(self, sample: RequestSample) -> Deferred[None]:
        if self.store is None:
            return succeed(None)
        return self.store.record_request_sample(sample)

    def _on_load(self, event: LoadEvent) -> None:
        status = "ok" if event.ok else "failed"
        self.metrics.loads.labels(event.model_id, event.kind, status).inc()
        if event.ok:
            self.metrics.load_duration.labels(event.model_id, event.kind).observe(event.duration_ms / 1000)
            self.log.info("loaded {model} on the {runtime} runtime in {duration_ms:.0f} ms",
                          model=event.model_id, runtime=event.kind, duration_ms=event.duration_ms)
        else:
            self.log.warn("loading {model} on the {runtime} runtime failed: {reason}",
                          model=event.model_id, runtime=event.kind, reason=event.reason)
        if self.store is not None:
            self.store.record_load_sample(LoadSample(
                config_filename=event.config_filename, model_id=event.model_id, runtime=event.kind,
                duration_ms=event.duration_ms, status=status,
                finished_at_ms=int(self.reactor.seconds() * 1000), reason=event.reason))

    # -- management -----------------------------------------------------------

    def _model(self, name: str) -> ModelConfig:
        model = self.catalog.resolve(name)
        if model is None:
            raise HTTPError(404, f"model {name!r} was not found", "not_found", "model_not_found")
        return model

    async def load_model(self, name: str) -> dict[str, Any]:
        model = self._model(name)
        try:
            await self.runtimes.load(model)
        except LoadFailed as exc:
            raise HTTPError(502, f"model {model.local_id!r} failed to load: {exc}",
                            "backend_error", "load_failed") from None
        except BackendMissing as exc:
            raise HTTPError(502, str(exc), "backend_error", "backend_missing") from None
        return {"ok": True, "model": model.local_id, "node_id": self.node_id}

    async def unload_model(self, name: Any, target: Any) -> dict[str, Any]:
        if name is not None and not isinstance(name, str):
            raise HTTPError(400, "model must be a string")
        if target is not None and target not in ("text", "image", "stt", "all", "embeddings"):
            raise HTTPError(400, "target must be one of text, image, stt, embeddings, all")
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

    # -- documents ------------------------------------------------------------

    def _loaded(self, model: ModelConfig) -> bool:
        return any(self.runtimes.loaded_config(k) == model.filename for k in RUNTIME_KINDS
                   if model.capabilities.serves(k))

    def listing(self, keep: Callable[[Capabilities], bool]) -> list[ListedModel]:
        out = []
        for model in self.catalog.models:
            caps = model.capabilities
            if not keep(caps):
                continue
            words = tuple(w for w in ("llm", "multimodal", "embeddings", "image", "stt", "tts")
                          if getattr(caps, w))
            try:
                mtime = os.path.getmtime(model.path)
            except OSError:
                mtime = 0.0
            out.append(ListedModel(
                name=model.local_id, model_hash=model.model_hash, size=_size(model),
                modified_at=_iso(mtime), capabilities=words, context=caps.context,
                loaded=self._loaded(model)))
        return out

    def record(self, model: ModelConfig) -> dict[str, Any]:
        caps = model.capabilities
        return {
            "public_id": model.local_id, "local_id": model.local_id, "image_id": model.image_id,
            "public_image_id": model.image_id, "filename": model.filename,
            "node_id": self.node_id, "node_url": self.config.cluster.public_url,
            "source": "local", "backend_mode": model.backend_mode,
            "config_hash": model.config_hash, "model_hash": model.model_hash,
            "capabilities": {"llm": caps.llm, "image": caps.image, "embeddings": caps.embeddings,
                             "multimodal": caps.multimodal, "stt": caps.stt, "tts": caps.tts,
                             "context": caps.context},
            "available": True, "loaded": self._loaded(model), "disabled": False,
        }

    def models_document(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "models": [self.record(m) for m in self.catalog.models],
            "invalid": [{"filename": b.filename, "reason": b.reason} for b in self.catalog.invalid],
        }

    def snapshot(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "node_url": self.config.cluster.public_url,
                "build_version": __version__, "protocol_version": PROTOCOL_VERSION,
                "models": [self.record(m) for m in self.catalog.models]}

    def state_document(self) -> dict[str, Any]:
        now_ms = int(self.reactor.seconds() * 1000)
        return {
            "node_id": self.node_id,
            "runtimes": [s.to_json() for s in self.runtimes.status()],
            "active_requests": [a.to_json(now_ms) for a in self.inference.active.values()],
            "held_requests": [],
        }


def _size(model: ModelConfig) -> int:
    total = 0
    for path in model.weight_files().values():
        try:
            total += os.path.getsize(path)
        except OSError:
            pass
    return total


def _iso(ts: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
