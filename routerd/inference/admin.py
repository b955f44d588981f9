"""Explicit model loads and unloads (``/router/v1/node/load|unload`` and the site's
``/router/v1/load|unload``): on this node's runtimes, or on the owning node through the master."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import attrs

from routerd.assets.service import assets_unresolved
from routerd.backends.errors import BackendMissing, LoadFailed
from routerd.catalog.catalog import Catalog
from routerd.catalog.model import RUNTIME_KINDS, ModelConfig, RuntimeKind
from routerd.errors import HTTPError
from routerd.wire.records import ModelRecord

UNLOAD_TARGETS = ("text", "image", "stt", "embeddings", "all")


class ModelNotFound(HTTPError):
    def __init__(self, name: str) -> None:
        super().__init__(404, f"model {name!r} was not found", "not_found", "model_not_found")


class Runtimes(Protocol):
    def load(self, model: ModelConfig) -> Awaitable[Any]: ...

    def unload(self, kind: RuntimeKind) -> Awaitable[Any]: ...

    def loaded_config(self, kind: RuntimeKind) -> str | None: ...


class Records(Protocol):
    def records(self) -> list[ModelRecord]: ...


class RemoteControl(Protocol):
    def load(self, base: str, model: str) -> Awaitable[Any]: ...

    def unload(self, base: str, model: str | None, target: str | None) -> Awaitable[Any]: ...


@attrs.define(kw_only=True, eq=False)
class ModelAdmin:
    """Loads and unloads; ``registry``/``remote`` are the master's (None elsewhere)."""

    node_id: str
    catalog: Callable[[], Catalog]
    runtimes: Runtimes
    registry: Records | None = None
    remote: RemoteControl | None = None
    #: Why a config may not load yet (unresolved portable assets), or None.
    blocked: Callable[[ModelConfig], str | None] = lambda _model: None
    #: How a load runs: the node's own work (inference.own_loads) in a node; the runtimes' own here.
    _load: Callable[[ModelConfig], Awaitable[Any]] = attrs.field(
        alias="load", default=attrs.Factory(lambda self: self.runtimes.load, takes_self=True))

    def _model(self, name: str) -> ModelConfig:
        model = self.catalog().resolve(name)
        if model is None:
            raise ModelNotFound(name)
        return model

    def _remote_record(self, name: str) -> ModelRecord | None:
        """The record a master forwards a site call for, or None when the model is its own."""
        if self.registry is None:
            return None
        records = [r for r in self.registry.records()
                   if name in (r.public_id, r.public_image_id) and not r.disabled]
        if not records:
            raise ModelNotFound(name)
        if any(r.node_id == self.node_id for r in records):
            return None
        available = [r for r in records if r.available]
        if not available:
            raise HTTPError(502, f"model {name!r} has no available replicas", "backend_error",
                            "backend_error")
        return available[0]

    def _local_name(self, name: str) -> str:
        for r in self.registry.records() if self.registry is not None else ():
            if r.node_id == self.node_id and name in (r.public_id, r.public_image_id):
                return r.local_id
        return name

    async def load(self, name: str, *, site: bool = False) -> dict[str, Any]:
        remote = self._remote_record(name) if site else None
        if remote is not None and self.remote is not None:
            await self.remote.load(remote.node_url, remote.local_id)
            return {"ok": True, "model": name, "node_id": remote.node_id}
        model = self._model(self._local_name(name) if site else name)
        reason = self.blocked(model)
        if reason is not None:  # before the backend starts (reference §8.5)
            raise assets_unresolved(model.local_id, reason)
        try:
            await self._load(model)
        except LoadFailed as exc:
            raise HTTPError(502, f"model {model.local_id!r} failed to load: {exc}",
                            "backend_error", "load_failed") from None
        except BackendMissing as exc:
            raise HTTPError(502, str(exc), "backend_error", "backend_missing") from None
        return {"ok": True, "model": name, "node_id": self.node_id}

    async def unload(self, name: Any, target: Any, *, site: bool = False) -> dict[str, Any]:
        if name is not None and not isinstance(name, str):
            raise HTTPError(400, "model must be a string")
        if target is not None and target not in UNLOAD_TARGETS:
            raise HTTPError(400, "target must be one of text, image, stt, embeddings, all")
        if name and site:
            remote = self._remote_record(name)
            if remote is not None and self.remote is not None:
                await self.remote.unload(remote.node_url, remote.local_id, target)
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
