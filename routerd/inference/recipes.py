"""Serving split recipes on the master (cluster reference §9.3, §9.4).

:class:`RecipeRouter` answers, for a client request, which component record serves it (checked
before the registry's own public IDs) and under which public name the answer goes back; it loads a
recipe's components in order on an explicit load; and it adds the recipes to the listings.
"""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from twisted.logger import Logger

from routerd.catalog.catalog import Catalog
from routerd.catalog.model import Capabilities, ModelConfig, RuntimeKind
from routerd.errors import HTTPError
from routerd.registry.recipes import Recipe, RecipeBook, RecipeLane, load_order, match
from routerd.routing.adapters.ollama import ListedModel
from routerd.wire.records import ModelRecord

log = Logger(namespace="routerd.inference.recipes")

# Music runs on the text side (KoboldCpp's one process; cluster spec "Registration and health").
_RUNTIME: dict[RecipeLane, RuntimeKind] = {"text": "text", "embeddings": "text", "image": "image",
                                           "voice": "stt", "music": "text"}


def _iso(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Loader(Protocol):
    def load(self, model: ModelConfig, kind: RuntimeKind | None = None) -> Awaitable[Any]: ...


class RemoteLoad(Protocol):
    def load(self, url: str, model: str) -> Awaitable[Any]: ...


class RecipeRouter:
    def __init__(self, *, book: RecipeBook, node_id: str, records: Callable[[], Sequence[ModelRecord]],
                 catalog: Callable[[], Catalog], runtimes: Loader, remote: RemoteLoad) -> None:
        self.book = book
        self.node_id = node_id
        self.records = records
        self.catalog = catalog
        self.runtimes = runtimes
        self.remote = remote

    def _record(self, recipe: Recipe, lane: str, node_id: str, model_id: str) -> ModelRecord:
        record = next((r for r in self.records() if r.node_id == node_id and r.local_id == model_id), None)
        if record is None:
            raise HTTPError(503, f"recipe {recipe.id!r}: the {lane} component {node_id}/{model_id} is not "
                                 "registered", "backend_error", "recipe_component_missing")
        if record.disabled:
            raise HTTPError(404, f'recipe "{recipe.id}" uses a disabled model', "not_found",
                            "model_not_found")
        return record

    def route(self, name: str, runtime: str, section: str) -> tuple[str, ModelRecord] | None:
        """``(public name, component record)`` for a request naming a recipe, else None.  A
        disabled component is 404 ``recipe "<id>" uses a disabled model``."""
        found = match(self.book.recipes(), name, runtime, section)
        if found is None:
            return None
        recipe, lane, comp = found
        record = self._record(recipe, lane, comp.node_id, comp.model_id)
        public = recipe.public_image_id if runtime == "image" and recipe.public_image_id else recipe.public_id
        return public, record

    async def load(self, recipe: Recipe) -> dict[str, Any]:
        """Load every component in order (text; embeddings; image; voice; music)."""
        loaded: list[dict[str, str]] = []
        for lane, comp in load_order(recipe):
            record = self._record(recipe, lane, comp.node_id, comp.model_id)
            if record.node_id == self.node_id:
                model = self.catalog().get(record.local_id)
                if model is None:
                    raise HTTPError(404, f"model {record.local_id!r} was not found", "not_found",
                                    "model_not_found")
                await self.runtimes.load(model, _RUNTIME[lane])
            else:
                selector = record.image_id if lane == "image" and record.image_id else record.local_id
                await self.remote.load(record.node_url, selector)
            log.info("recipe {recipe}: loaded the {lane} component {model} on {node}", recipe=recipe.id,
                     lane=lane, model=comp.model_id, node=comp.node_id)
            loaded.append({"lane": lane, "node_id": comp.node_id, "model_id": comp.model_id})
        return {"ok": True, "model": recipe.public_id, "recipe": recipe.id, "loaded": loaded}

    def listed(self, keep: Callable[[Capabilities], bool]) -> list[ListedModel]:
        """Client listing entries for the recipes whose text or embeddings component is kept."""
        records = self.records()
        out = []
        for recipe in self.book.recipes():
            caps: Capabilities | None = None
            words: list[str] = []
            context = 0
            model_hash = ""
            for lane in ("text", "embeddings", "image", "voice"):
                comp = recipe.component(lane)
                record = next((r for r in records if comp is not None and r.node_id == comp.node_id
                               and r.local_id == comp.model_id), None)
                if record is None or record.disabled:
                    continue
                c = record.capabilities
                if lane == "text":
                    caps, context, model_hash = c, c.context, record.model_hash
                    words += [w for w in ("llm", "multimodal") if getattr(c, w)]
                elif lane == "embeddings":
                    caps = caps or c
                    words.append("embeddings")
                elif lane == "image":
                    words.append("image")
                elif lane == "voice":
                    words += [w for w in ("stt", "tts") if getattr(c, w)]
            if caps is None or not keep(caps):
                continue
            out.append(ListedModel(name=recipe.public_id, model_hash=model_hash, size=0,
                                   modified_at=_iso(recipe.created_ms),
                                   capabilities=tuple(dict.fromkeys(words)),
                                   context=context, loaded=False))
        return out

    def image_listed(self) -> list[dict[str, Any]]:
        """``/sdapi/v1/sd-models`` entries for recipes with an image component."""
        out = []
        for recipe in self.book.recipes():
            if recipe.public_image_id and recipe.component("image") is not None:
                out.append({"title": recipe.public_image_id, "model_name": recipe.public_image_id,
                            "filename": "", "hash": ""})
        return out


def merge_listing(recipes: list[Any], models: list[Any], key: Callable[[Any], str]) -> list[Any]:
    """Recipe entries first; a model entry with a recipe's name is shadowed (recipes route first)."""
    names = {key(e) for e in recipes}
    return recipes + [e for e in models if key(e) not in names]
