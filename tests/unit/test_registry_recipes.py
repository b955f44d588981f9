"""Split recipes: parsing, validation, request matching, load order and persistence."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.defer import ensureDeferred, succeed

from routerd.catalog.catalog import Catalog
from routerd.catalog.model import Capabilities
from routerd.errors import HTTPError
from routerd.inference.recipes import RecipeRouter
from routerd.registry.recipes import (
    Component,
    Recipe,
    RecipeBook,
    RecipeError,
    RecipeFile,
    load_order,
    match,
    parse_recipe,
)
from routerd.wire.records import ModelRecord

TEXT = Capabilities(llm=True, context=4096)
RECORDS = [
    ModelRecord(local_id="words", public_id="words", node_id="a", node_url="http://a", capabilities=TEXT,
                filename="words.kcpps"),
    ModelRecord(local_id="vec", public_id="vec", node_id="b", node_url="http://b",
                capabilities=Capabilities(embeddings=True), filename="vec.kcpps"),
    ModelRecord(local_id="paint", public_id="paint", image_id="paint-paint", public_image_id="paint-paint",
                node_id="b", node_url="http://b", capabilities=Capabilities(image=True),
                filename="paint.kcpps"),
    ModelRecord(local_id="ears", public_id="ears", node_id="m", node_url="http://m",
                capabilities=Capabilities(stt=True), filename="ears.kcpps"),
    ModelRecord(local_id="off", public_id="off", node_id="a", node_url="http://a", capabilities=TEXT,
                filename="off.kcpps", disabled=True),
]


class MemoryStorage:
    def __init__(self) -> None:
        self.saved: list[tuple[Recipe, ...]] = []
        self.fail = False

    def load(self) -> list[Recipe]:
        return list(self.saved[-1]) if self.saved else []

    def save(self, recipes: Sequence[Recipe]) -> None:
        if self.fail:
            raise OSError("disk full")
        self.saved.append(tuple(recipes))


def _book(storage: MemoryStorage | None = None, routing_only: bool = False) -> RecipeBook:
    return RecipeBook(storage or MemoryStorage(), own_node_id="m", records=lambda: RECORDS,
                      routing_only=lambda: routing_only, now_ms=lambda: 1234)


def test_a_recipe_defaults_public_id_to_id_and_names_its_image_id() -> None:
    recipe = parse_recipe({"id": "duo", "text": {"node_id": "a", "model_id": "words"},
                           "image": {"node_id": "b", "model_id": "paint"}}, now_ms=9)
    assert recipe.public_id == "duo" and recipe.public_image_id == "duo-image" and recipe.created_ms == 9


@pytest.mark.parametrize("body", [
    {"id": "x"},  # no component
    {"id": "../x", "text": {"node_id": "a", "model_id": "words"}},
    {"id": "a/b", "text": {"node_id": "a", "model_id": "words"}},
    {"id": "x", "text": {"node_id": "", "model_id": "words"}},
    {"id": "x", "text": {"node_id": "a", "model_id": "../../etc/passwd"}},
    {"id": "x", "text": "words"},
])
def test_malformed_recipes_are_refused_with_400(body: dict[str, Any]) -> None:
    with pytest.raises(RecipeError) as info:
        parse_recipe(body)
    assert info.value.status == 400


@pytest.mark.parametrize("body, code", [
    ({"id": "x", "text": {"node_id": "b", "model_id": "paint"}}, "capability_mismatch"),
    ({"id": "x", "image": {"node_id": "a", "model_id": "words"}}, "capability_mismatch"),
    ({"id": "x", "music": {"node_id": "a", "model_id": "words"}}, "capability_mismatch"),
    ({"id": "x", "text": {"node_id": "z", "model_id": "words"}}, "component_not_found"),
])
def test_validation_checks_components_exist_and_serve_their_lane(body: dict[str, Any], code: str) -> None:
    with pytest.raises(RecipeError) as info:
        _book().save(body)
    assert info.value.code == code


def test_a_routing_only_master_refuses_components_on_itself() -> None:
    body = {"id": "x", "voice": {"node_id": "m", "model_id": "ears"}}
    with pytest.raises(RecipeError) as info:
        _book(routing_only=True).save(body)
    assert info.value.code == "routing_only_master"
    assert _book(routing_only=False).save(body).id == "x"


def test_save_persists_before_publishing_and_refuses_duplicates_without_overwrite() -> None:
    storage = MemoryStorage()
    book = _book(storage)
    body = {"id": "duo", "text": {"node_id": "a", "model_id": "words"}}
    book.save(body)
    assert [r.id for r in storage.saved[-1]] == ["duo"]
    with pytest.raises(RecipeError):
        book.save(body)
    book.save({**body, "overwrite": True, "public_id": "duet"})
    assert book.get("duo").public_id == "duet"  # type: ignore[union-attr]
    storage.fail = True
    with pytest.raises(OSError):
        book.save({"id": "trio", "text": {"node_id": "a", "model_id": "words"}})
    assert book.get("trio") is None  # a failed write publishes nothing
    with pytest.raises(HTTPError) as info:
        book.delete("missing")
    assert info.value.status == 404


def test_two_recipes_cannot_share_a_public_id() -> None:
    book = _book()
    book.save({"id": "one", "public_id": "shared", "text": {"node_id": "a", "model_id": "words"}})
    with pytest.raises(RecipeError) as info:
        book.save({"id": "two", "public_id": "shared", "text": {"node_id": "a", "model_id": "words"}})
    assert info.value.code == "recipe_conflict"


def test_requests_match_by_public_id_image_id_and_lane_with_embeddings_first() -> None:
    recipe = parse_recipe({"id": "r", "text": {"node_id": "a", "model_id": "words"},
                           "embeddings": {"node_id": "b", "model_id": "vec"},
                           "image": {"node_id": "b", "model_id": "paint"},
                           "voice": {"node_id": "m", "model_id": "ears"}})
    assert match([recipe], "r", "text", "llm")[1] == "text"  # type: ignore[index]
    assert match([recipe], "r", "text", "embeddings")[1] == "embeddings"  # type: ignore[index]
    assert match([recipe], "r-image", "image", "image")[1] == "image"  # type: ignore[index]
    assert match([recipe], "r", "image", "image") is None
    assert match([recipe], "r", "stt", "stt")[1] == "voice"  # type: ignore[index]
    text_only = parse_recipe({"id": "t", "text": {"node_id": "a", "model_id": "words"}})
    assert match([text_only], "t", "text", "embeddings")[1] == "text"  # type: ignore[index]
    assert match([text_only], "t", "stt", "stt") is None


def test_load_order_is_text_embeddings_image_voice_music_without_repeats() -> None:
    same = Component("a", "words")
    recipe = Recipe(id="r", public_id="r", components={
        "music": Component("c", "tune"), "voice": same, "image": Component("b", "paint"),
        "embeddings": same, "text": same})
    assert [lane for lane, _ in load_order(recipe)] == ["text", "image", "music"]
    other = Recipe(id="r", public_id="r", components={"voice": Component("m", "ears"),
                                                      "embeddings": Component("b", "vec"), "text": same})
    assert [lane for lane, _ in load_order(other)] == ["text", "embeddings", "voice"]


def test_the_recipe_file_is_written_atomically_with_mode_0600(tmp_path: Path) -> None:
    file = RecipeFile(str(tmp_path / "store" / "split-recipes.json"))
    recipe = parse_recipe({"id": "duo", "text": {"node_id": "a", "model_id": "words"}}, now_ms=5)
    file.save([recipe])
    assert stat.S_IMODE(os.stat(file.path).st_mode) == 0o600
    assert file.load() == [recipe]
    assert os.listdir(tmp_path / "store") == ["split-recipes.json"]  # no temporary left behind
    (tmp_path / "store" / "split-recipes.json").write_text("{not json")
    assert file.load() == []


class FakeLoads:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def load(self, *args: Any) -> Any:
        first = args[0]
        self.calls.append((getattr(first, "local_id", first), str(args[1])))
        return succeed(None)


def _router(book: RecipeBook, loads: FakeLoads) -> RecipeRouter:
    return RecipeRouter(book=book, node_id="m", records=lambda: RECORDS, catalog=lambda: Catalog(),
                        runtimes=loads, remote=loads)


def test_a_disabled_component_answers_404_naming_the_recipe() -> None:
    storage = MemoryStorage()
    storage.saved.append((Recipe(id="dis", public_id="dis",
                                 components={"text": Component("a", "off")}),))
    book = _book(storage)
    book.load()
    with pytest.raises(HTTPError) as info:
        _router(book, FakeLoads()).route("dis", "text", "llm")
    assert info.value.status == 404 and info.value.message == 'recipe "dis" uses a disabled model'


def test_routing_rewrites_to_the_recipe_public_names_and_loads_remote_components_in_order() -> None:
    book = _book()
    book.save({"id": "duo", "text": {"node_id": "a", "model_id": "words"},
               "image": {"node_id": "b", "model_id": "paint"}})
    loads = FakeLoads()
    router = _router(book, loads)
    name, record = router.route("duo", "text", "llm")  # type: ignore[misc]
    assert (name, record.node_id) == ("duo", "a")
    name, record = router.route("duo-image", "image", "image")  # type: ignore[misc]
    assert (name, record.local_id) == ("duo-image", "paint")
    assert router.route("words", "text", "llm") is None
    result = ensureDeferred(router.load(book.get("duo"))).result  # type: ignore[arg-type]
    assert result["loaded"][0]["lane"] == "text"
    # the image component is loaded by its image ID on its node
    assert loads.calls == [("http://a", "words"), ("http://b", "paint-paint")]
    assert [e.name for e in router.listed(lambda c: c.llm)] == ["duo"]
