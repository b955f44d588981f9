"""Split recipes (cluster reference §9): one public model made of components on several nodes.

A recipe ``{id, public_id, public_image_id?, created_ms, text?, embeddings?, image?, voice?,
music?}`` names, per lane, one component ``{node_id, model_id}`` (a local model ID on that node).
This module is pure: parsing and validation of a recipe against the registry's records, which
recipe and component a request names, and the order an explicit load prepares the components in.
Persistence is :class:`RecipeFile` (``<store_dir>/split-recipes.json``, mode 0600, written
atomically); :class:`RecipeBook` keeps the published set and persists before it publishes.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol

import attrs
from twisted.logger import Logger

from routerd.catalog.model import Capabilities
from routerd.errors import HTTPError
from routerd.files import write_json_atomically
from routerd.wire.records import ModelRecord

RecipeLane = Literal["text", "embeddings", "image", "voice", "music"]
RECIPE_LANES: tuple[RecipeLane, ...] = ("text", "embeddings", "image", "voice", "music")
FILE_NAME = "split-recipes.json"
FILE_VERSION = 1

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_log = Logger(namespace="routerd.registry.recipes")


class RecipeError(HTTPError):
    """400: a recipe that cannot be saved; the message says why."""

    def __init__(self, message: str, code: str = "invalid_recipe") -> None:
        super().__init__(400, message, "invalid_request_error", code)


@attrs.frozen
class Component:
    node_id: str
    model_id: str

    def to_json(self) -> dict[str, str]:
        return {"node_id": self.node_id, "model_id": self.model_id}


@attrs.frozen(kw_only=True)
class Recipe:
    id: str
    public_id: str
    public_image_id: str | None = None
    created_ms: int = 0
    components: Mapping[RecipeLane, Component] = attrs.field(factory=dict)

    def component(self, lane: RecipeLane) -> Component | None:
        return self.components.get(lane)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "public_id": self.public_id,
                               "public_image_id": self.public_image_id, "created_ms": self.created_ms}
        for lane in RECIPE_LANES:
            comp = self.components.get(lane)
            if comp is not None:
                out[lane] = comp.to_json()
        return out


def _bare_id(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _ID.fullmatch(value) or ".." in value:
        raise RecipeError(f"{what} must be a bare name (letters, digits, '.', '_', ':', '-'; "
                          "at most 128 characters)")
    return value


def parse_recipe(body: Mapping[str, Any], now_ms: int = 0) -> Recipe:
    """A recipe from its JSON form; :class:`RecipeError` (400) names the first problem."""
    recipe_id = _bare_id(body.get("id"), "id")
    public_id = body.get("public_id")
    public_id = recipe_id if public_id in (None, "") else _bare_id(public_id, "public_id")
    public_image_id = body.get("public_image_id")
    if public_image_id in (None, ""):
        public_image_id = None
    else:
        public_image_id = _bare_id(public_image_id, "public_image_id")
    components: dict[RecipeLane, Component] = {}
    for lane in RECIPE_LANES:
        raw = body.get(lane)
        if raw is None:
            continue
        if not isinstance(raw, dict):
            raise RecipeError(f"{lane} must be an object {{node_id, model_id}}")
        node_id = raw.get("node_id")
        model_id = raw.get("model_id")
        if not isinstance(node_id, str) or not node_id:
            raise RecipeError(f"{lane}.node_id is required")
        components[lane] = Component(node_id=node_id, model_id=_bare_id(model_id, f"{lane}.model_id"))
    if not components:
        raise RecipeError("a recipe needs at least one component (text, embeddings, image, voice, music)")
    if "image" in components and public_image_id is None:
        public_image_id = f"{public_id}-image"
    created = body.get("created_ms")
    if not isinstance(created, int) or isinstance(created, bool) or created <= 0:
        created = now_ms
    return Recipe(id=recipe_id, public_id=public_id, public_image_id=public_image_id,
                  created_ms=created, components=components)


def _serves(lane: RecipeLane, caps: Capabilities, record: ModelRecord) -> bool:
    if lane == "text":
        return caps.llm
    if lane == "embeddings":
        return caps.embeddings
    if lane == "image":
        return caps.image and bool(record.image_id)
    if lane == "voice":
        return caps.stt or caps.tts
    return caps.music  # music: KoboldCpp's music weights (served on its text side)


def validate(recipe: Recipe, records: Sequence[ModelRecord], *, own_node_id: str,
             routing_only: bool, taken_ids: Iterable[str] = ()) -> None:
    """Refuse (400) a recipe whose components do not exist, do not serve their lane, or sit on
    a routing-only master; or whose public IDs clash with another recipe's."""
    taken = set(taken_ids)
    for name in (recipe.public_id, recipe.public_image_id):
        if name is not None and name in taken:
            raise RecipeError(f"public ID {name!r} is already used by another recipe", "recipe_conflict")
    for lane, comp in recipe.components.items():
        if comp.node_id == own_node_id and routing_only:
            raise RecipeError(f"{lane}: this master is routing-only (no local models); recipe "
                              "components cannot be assigned to it", "routing_only_master")
        record = next((r for r in records if r.node_id == comp.node_id and r.local_id == comp.model_id),
                      None)
        if record is None:
            raise RecipeError(f"{lane}: model {comp.model_id!r} is not known on node {comp.node_id!r}",
                              "component_not_found")
        if not _serves(lane, record.capabilities, record):
            raise RecipeError(f"{lane}: model {comp.model_id!r} on node {comp.node_id!r} does not "
                              f"serve the {lane} lane", "capability_mismatch")


def load_order(recipe: Recipe) -> list[tuple[RecipeLane, Component]]:
    """Components in explicit-load order (reference §9.4): text; embeddings unless the same as
    text; image; voice unless the same as text or embeddings; music unless the same as any."""
    out: list[tuple[RecipeLane, Component]] = []
    seen: list[Component] = []
    for lane in RECIPE_LANES:
        comp = recipe.components.get(lane)
        if comp is None:
            continue
        if lane != "image" and comp in seen:
            continue
        out.append((lane, comp))
        if lane != "image":
            seen.append(comp)
    return out


def request_lanes(runtime: str, section: str) -> tuple[RecipeLane, ...]:
    """Which recipe components may answer a request of this runtime and capability section, in
    the order tried (embedding paths: the embeddings component first, then text)."""
    if runtime == "image":
        return ("image",)
    if runtime == "stt" or section in ("stt", "tts"):
        return ("voice",)
    if section == "music":
        return ("music",)
    if section == "embeddings":
        return ("embeddings", "text")
    return ("text",)


def match(recipes: Iterable[Recipe], name: str, runtime: str,
          section: str) -> tuple[Recipe, RecipeLane, Component] | None:
    """The recipe and component a request naming ``name`` uses, or None when no recipe is named
    so.  Image paths match ``public_image_id``; the other lanes match ``public_id``."""
    for recipe in recipes:
        key = recipe.public_image_id if runtime == "image" else recipe.public_id
        if key != name:
            continue
        for lane in request_lanes(runtime, section):
            comp = recipe.components.get(lane)
            if comp is not None:
                return recipe, lane, comp
        return None
    return None


class RecipeFile:
    """``split-recipes.json``: ``{"version": 1, "recipes": [recipe]}``, mode 0600, replaced
    atomically (temporary file in the same folder, fsync, rename)."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)

    def load(self) -> list[Recipe]:
        try:
            with open(self.path, encoding="utf-8") as handle:
                data = json.load(handle)
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            _log.warn("ignoring unreadable recipe file {path}: {error}", path=self.path, error=str(exc))
            return []
        out: list[Recipe] = []
        raw = data.get("recipes") if isinstance(data, dict) else None
        for item in raw if isinstance(raw, list) else []:
            try:
                out.append(parse_recipe(item if isinstance(item, dict) else {}))
            except RecipeError as exc:
                _log.warn("skipping a bad recipe in {path}: {error}", path=self.path, error=exc.message)
        return out

    def save(self, recipes: Sequence[Recipe]) -> None:
        write_json_atomically(self.path, {"version": FILE_VERSION, "recipes": [r.to_json() for r in recipes]})


class RecipeStorage(Protocol):
    """What :class:`RecipeBook` persists through (``RecipeFile`` in production)."""

    def load(self) -> list[Recipe]: ...

    def save(self, recipes: Sequence[Recipe]) -> None: ...


class RecipeBook:
    """The master's published recipes.  ``records`` gives the registry's records for validation;
    ``routing_only`` says whether this master holds no models of its own."""

    def __init__(self, storage: RecipeStorage, *, own_node_id: str,
                 records: Callable[[], Sequence[ModelRecord]], routing_only: Callable[[], bool],
                 now_ms: Callable[[], int]) -> None:
        self.storage = storage
        self.own_node_id = own_node_id
        self.records = records
        self.routing_only = routing_only
        self.now_ms = now_ms
        self._recipes: tuple[Recipe, ...] = ()

    def load(self) -> None:
        self._recipes = tuple(self.storage.load())

    def recipes(self) -> tuple[Recipe, ...]:
        return self._recipes

    def get(self, recipe_id: str) -> Recipe | None:
        return next((r for r in self._recipes if r.id == recipe_id), None)

    def by_public_id(self, name: str) -> Recipe | None:
        return next((r for r in self._recipes if name in (r.public_id, r.public_image_id)), None)

    def check(self, body: Mapping[str, Any]) -> Recipe:
        """The recipe ``body`` describes, validated as :meth:`save` would, without saving it
        (Cook's preview); :class:`RecipeError` naming what is wrong."""
        recipe = parse_recipe(body, self.now_ms())
        existing = self.get(recipe.id)
        if existing is not None and body.get("overwrite") is not True:
            raise RecipeError(f"recipe {recipe.id!r} already exists (set overwrite to replace it)",
                              "recipe_exists")
        others = [r for r in self._recipes if r.id != recipe.id]
        validate(recipe, self.records(), own_node_id=self.own_node_id, routing_only=self.routing_only(),
                 taken_ids=[n for r in others for n in (r.public_id, r.public_image_id) if n])
        return recipe

    def save(self, body: Mapping[str, Any]) -> Recipe:
        """Validate, persist, then publish; an existing id needs ``overwrite: true``."""
        recipe = self.check(body)
        others = [r for r in self._recipes if r.id != recipe.id]
        updated = (*others, recipe)
        self.storage.save(updated)
        self._recipes = updated
        return recipe

    def delete(self, recipe_id: str) -> Recipe:
        existing = self.get(recipe_id)
        if existing is None:
            raise HTTPError(404, f"recipe {recipe_id!r} was not found", "not_found", "recipe_not_found")
        updated = tuple(r for r in self._recipes if r.id != recipe_id)
        self.storage.save(updated)
        self._recipes = updated
        return existing


__all__ = [
    "FILE_NAME",
    "RECIPE_LANES",
    "Component",
    "Recipe",
    "RecipeBook",
    "RecipeError",
    "RecipeFile",
    "RecipeLane",
    "RecipeStorage",
    "load_order",
    "match",
    "parse_recipe",
    "request_lanes",
    "validate",
]
