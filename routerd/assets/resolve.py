"""Binding portable configs to files by hash (cluster reference §8.5).

A config references a weight file portably with ``<field>_hash`` (sha256) and optionally
``<field>_filename`` next to the usual path field (``model``, ``mmproj``, ``embeddingsmodel``,
``sdmodel``, ``whispermodel``, ``ttsmodel``).  Resolution, per field: the configured path when its
sha256 matches; the local index (catalog files, ``file_roots``, ``shared_dir``); then a peer pull.
A bound field points the config at the verified file; the config's ``asset_state`` is ``ready``
when every field is bound, ``unresolved`` when no source holds a file, ``failed`` when every
source failed (with the reason).  Configs without hash fields are ``ready`` as they are.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs
from twisted.logger import Logger

from routerd.assets.index import AssetIndex, is_sha256
from routerd.assets.paths import UnsafePath, safe_filename
from routerd.assets.pull import AssetPuller, PullFailed
from routerd.catalog.catalog import Catalog
from routerd.catalog.hashing import FileHashCache
from routerd.catalog.kcpps import image_id_for
from routerd.catalog.model import MUSIC_FIELDS, ModelConfig

PORTABLE_FIELDS: Mapping[str, str] = {
    "model": "text_model", "mmproj": "mmproj", "embeddingsmodel": "embeddings_model",
    "sdmodel": "sd_model", "whispermodel": "whisper_model", "ttsmodel": "tts_model", **MUSIC_FIELDS,
}

Sources = Callable[[list[str]], Awaitable[dict[str, list[str]]]]
"""Peers holding each hash: ``{sha256: [node_url, ...]}``."""

log = Logger(namespace="routerd.assets.resolve")


@attrs.frozen
class Need:
    field: str
    attr: str
    sha256: str
    filename: str
    path: str | None


@attrs.frozen
class AssetState:
    state: str  # ready | unresolved | failed
    reason: str = ""
    portable: bool = False  # the config references files by hash
    fields: tuple[dict[str, Any], ...] = attrs.field(default=(), eq=False)


def needs_of(model: ModelConfig) -> list[Need]:
    """The portable (hash-referenced) fields of a config."""
    out = []
    for field, attr in PORTABLE_FIELDS.items():
        sha = model.options.get(f"{field}_hash")
        if not is_sha256(sha):
            continue
        path: str | None = getattr(model, attr)
        name = model.options.get(f"{field}_filename")
        filename = name if isinstance(name, str) and name else os.path.basename(path or "") or f"{sha}.bin"
        out.append(Need(field=field, attr=attr, sha256=sha, filename=filename, path=path))
    return out


def _bind(model: ModelConfig, need: Need, path: str) -> ModelConfig:
    changes: dict[str, Any] = {need.attr: path}
    if need.field == "sdmodel" and model.options.get("sdmodel_filename"):
        changes["image_id"] = image_id_for(model.local_id, need.filename)
    return attrs.evolve(model, **changes)


Observe = Callable[[str, str, dict[str, Any]], None]
"""``(local_id, event type, fields)``: what resolution did, for resolution jobs."""


def _quiet(_local_id: str, _kind: str, _fields: dict[str, Any]) -> None:
    pass


class AssetResolver:
    def __init__(self, *, index: AssetIndex, puller: AssetPuller, cache: FileHashCache,
                 run_in_thread: Callable[..., Any], sources: Sources,
                 substitute_for: Callable[[str], str | None] = lambda _sha: None) -> None:
        self.index = index
        self.puller = puller
        self.cache = cache
        self.run_in_thread = run_in_thread
        self.sources = sources
        self.substitute_for = substitute_for

    async def _matches(self, path: str | None, sha256: str) -> bool:
        if not path or not os.path.isfile(path):
            return False
        try:
            digest: str = await self.run_in_thread(self.cache.hash_file, path)
        except OSError:
            return False
        return digest == sha256

    def _wanted(self, need: Need) -> Need:
        """``need`` asking for its confirmed substitute's hash, when one is recorded."""
        replacement = self.substitute_for(need.sha256)
        return attrs.evolve(need, sha256=replacement) if replacement and replacement != need.sha256 else need

    async def resolve(self, catalog: Catalog,
                      observe: Observe = _quiet) -> tuple[Catalog, dict[str, AssetState]]:
        """A catalog with every resolvable portable field bound, and each config's state."""
        states: dict[str, AssetState] = {}
        fields: dict[str, list[dict[str, Any]]] = {}
        pending: dict[str, list[Need]] = {}
        models = {m.local_id: m for m in catalog.models}

        def note(local_id: str, need: Need, state: str, **extra: Any) -> None:
            row = {"field": need.field, "sha256": need.sha256, "filename": need.filename, "state": state,
                   **extra}
            fields.setdefault(local_id, []).append(row)
            observe(local_id, "field", row)

        for model in catalog.models:
            for original in needs_of(model):
                need = self._wanted(original)
                sub = {"substituted_for": original.sha256} if need is not original else {}
                if await self._matches(need.path, need.sha256):
                    note(model.local_id, need, "ready", source="path", **sub)
                    continue
                asset = self.index.get(need.sha256)
                if asset is not None:
                    models[model.local_id] = _bind(models[model.local_id], need, asset.path)
                    note(model.local_id, need, "ready", source=asset.source, **sub)
                    continue
                pending.setdefault(model.local_id, []).append(need)
        wanted = sorted({n.sha256 for needs in pending.values() for n in needs})
        where: dict[str, list[str]] = {}
        if wanted:
            try:
                where = await self.sources(wanted)
            except Exception as exc:  # noqa: BLE001 - a failed lookup leaves the fields unresolved
                log.warn("asset lookup failed: {error}", error=str(exc))
        for local_id, needs in pending.items():
            for need in needs:
                peers = where.get(need.sha256, [])
                if not peers:
                    reason = f"{need.field}: no node holds {need.sha256}"
                    states[local_id] = AssetState("unresolved", reason, True)
                    note(local_id, need, "unresolved", reason=reason)
                    continue
                observe(local_id, "transfer", {"field": need.field, "sha256": need.sha256, "sources": peers})
                try:
                    safe_filename(need.filename)
                    asset = await self.puller.pull(need.sha256, need.filename, peers)
                except (PullFailed, UnsafePath) as exc:
                    reason = f"{need.field}: {exc}"
                    states[local_id] = AssetState("failed", reason, True)
                    note(local_id, need, "failed", reason=reason)
                    continue
                models[local_id] = _bind(models[local_id], need, asset.path)
                note(local_id, need, "ready", source="peer_sha256")
        for model in catalog.models:
            states.setdefault(model.local_id, AssetState("ready", portable=bool(needs_of(model))))
        out = {k: attrs.evolve(v, fields=tuple(fields.get(k, ()))) for k, v in states.items()}
        bound = Catalog([models[m.local_id] for m in catalog.models], catalog.invalid, catalog.config_dir)
        return bound, out
