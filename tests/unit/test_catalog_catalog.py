"""routerd.catalog.catalog: scanning config_dir, lookups, immutability, hashing."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import attrs
import pytest
from twisted.internet.defer import Deferred, succeed

import routerd
from routerd.catalog.catalog import Catalog, CatalogError
from routerd.catalog.hashing import FileHashCache, hash_models
from routerd.catalog.kcpps import bad_backend_mode
from routerd.catalog.model import ModelConfig

T = TypeVar("T")


def sync_thread(f: Callable[[], T]) -> Deferred[T]:
    return succeed(f())


def write(directory: Path, name: str, content: Any) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(content if isinstance(content, str) else json.dumps(content))


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    d = tmp_path / "models"
    write(d, "chat.kcpps", {"model": "../w/chat.gguf", "contextsize": 4096})
    write(d, "sdxl.kcpps", {"sdmodel": "../w/juggernautXL.safetensors"})
    write(d, "ears.kcpps", {"whispermodel": "../w/base.bin"})
    write(d, "embed.kcpps", {"embeddingsmodel": "../w/e.gguf"})
    write(d, "broken.kcpps", "{oops")
    write(d, "wrongmode.kcpps", {"model": "/a.gguf", "backend_mode": "ollama"})
    write(d, "notes.txt", "not a config")
    write(d, ".chat.kcpps", {"model": "/lock.gguf"})
    (d / "dir.kcpps").mkdir()
    return d


def test_scan_lists_valid_models_in_file_name_order(config_dir: Path) -> None:
    catalog = Catalog.scan(str(config_dir), "llama_sdcpp")
    assert [m.local_id for m in catalog.models] == ["chat", "ears", "embed", "sdxl"]
    assert all(m.backend_mode == "llama_sdcpp" for m in catalog.models)
    assert catalog.config_dir == str(config_dir)
    assert len(catalog) == 4 and list(catalog) == list(catalog.models)


def test_scan_lists_bad_files_as_invalid_with_reasons(config_dir: Path) -> None:
    catalog = Catalog.scan(str(config_dir), "llama_sdcpp")
    reasons = {i.filename: i.reason for i in catalog.invalid}
    assert set(reasons) == {"broken.kcpps", "wrongmode.kcpps"}
    assert "JSON" in reasons["broken.kcpps"]
    assert reasons["wrongmode.kcpps"] == bad_backend_mode()
    assert catalog.get("broken") is None


def test_scan_ignores_other_files_hidden_files_and_directories(config_dir: Path) -> None:
    catalog = Catalog.scan(str(config_dir), "kobold")
    names = {m.filename for m in catalog.models} | {i.filename for i in catalog.invalid}
    assert ".chat.kcpps" not in names and "notes.txt" not in names and "dir.kcpps" not in names
    assert catalog.get("chat") is not None and catalog.get("chat").text_model != "/lock.gguf"  # type: ignore[union-attr]


def test_scan_of_a_missing_directory_raises_catalog_error(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="does not exist"):
        Catalog.scan(str(tmp_path / "nope"), "kobold")


def test_scan_of_a_file_instead_of_a_directory_raises_catalog_error(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(CatalogError, match="not a directory"):
        Catalog.scan(str(tmp_path / "f"), "kobold")


def test_empty_directory_gives_an_empty_catalog(tmp_path: Path) -> None:
    catalog = Catalog.scan(str(tmp_path), "kobold")
    assert catalog.models == () and catalog.invalid == ()


def test_get_by_local_id(config_dir: Path) -> None:
    catalog = Catalog.scan(str(config_dir), "kobold")
    chat = catalog.get("chat")
    assert chat is not None and chat.text_model == str(config_dir.parent / "w" / "chat.gguf")
    assert catalog.get("missing") is None


def test_resolve_by_local_id_then_image_id(config_dir: Path) -> None:
    catalog = Catalog.scan(str(config_dir), "kobold")
    sdxl = catalog.get("sdxl")
    assert sdxl is not None and sdxl.image_id == "sdxl-juggernautXL"
    assert catalog.by_image_id("sdxl-juggernautXL") is sdxl
    assert catalog.resolve("sdxl-juggernautXL") is sdxl
    assert catalog.resolve("sdxl") is sdxl
    assert catalog.resolve("chat") is catalog.get("chat")
    assert catalog.resolve("nothing") is None
    assert catalog.by_image_id("chat") is None


def test_resolve_prefers_a_local_id_over_an_equal_image_id(tmp_path: Path) -> None:
    write(tmp_path, "a.kcpps", {"sdmodel": "/w/b.gguf"})  # image id "a-b"
    write(tmp_path, "a-b.kcpps", {"model": "/w/t.gguf"})
    catalog = Catalog.scan(str(tmp_path), "kobold")
    assert catalog.resolve("a-b") is catalog.get("a-b")
    assert catalog.by_image_id("a-b") is catalog.get("a")


def test_serving_filters_by_runtime_kind(config_dir: Path) -> None:
    catalog = Catalog.scan(str(config_dir), "kobold")
    assert [m.local_id for m in catalog.serving("text")] == ["chat", "embed"]
    assert [m.local_id for m in catalog.serving("image")] == ["sdxl"]
    assert [m.local_id for m in catalog.serving("stt")] == ["ears"]


def test_catalog_is_immutable_and_a_rescan_makes_a_new_one(config_dir: Path) -> None:
    first = Catalog.scan(str(config_dir), "kobold")
    with pytest.raises(AttributeError):
        first.models = ()  # type: ignore[misc]
    write(config_dir, "late.kcpps", {"model": "/late.gguf"})
    second = Catalog.scan(str(config_dir), "kobold")
    assert first.get("late") is None and second.get("late") is not None


def test_with_hashes_returns_a_new_catalog_with_hashed_configs(config_dir: Path) -> None:
    catalog = Catalog.scan(str(config_dir), "kobold")
    chat = catalog.get("chat")
    assert chat is not None
    updated = catalog.with_hashes([attrs.evolve(chat, model_hash="a" * 64)])
    assert updated is not catalog
    assert catalog.get("chat").model_hash == ""  # type: ignore[union-attr]
    assert updated.get("chat").model_hash == "a" * 64  # type: ignore[union-attr]
    assert updated.get("sdxl") == catalog.get("sdxl")
    assert updated.invalid == catalog.invalid
    assert [m.local_id for m in updated.models] == [m.local_id for m in catalog.models]
    assert updated.resolve("sdxl-juggernautXL") is updated.get("sdxl")


def test_with_hashes_ignores_a_hash_computed_for_a_different_config(config_dir: Path) -> None:
    catalog = Catalog.scan(str(config_dir), "kobold")
    chat = catalog.get("chat")
    assert chat is not None
    stale = attrs.evolve(chat, context_size=1, model_hash="b" * 64)
    unknown = attrs.evolve(chat, local_id="ghost", model_hash="c" * 64)
    updated = catalog.with_hashes([stale, unknown])
    assert updated.get("chat").model_hash == ""  # type: ignore[union-attr]
    assert updated.get("ghost") is None


def test_hashed_fills_every_model_hash_and_matches_hash_models(config_dir: Path) -> None:
    weights = config_dir.parent / "w"
    weights.mkdir()
    (weights / "chat.gguf").write_bytes(b"chat")
    catalog = Catalog.scan(str(config_dir), "kobold")
    cache = FileHashCache()
    out: list[Catalog] = []
    catalog.hashed(cache, sync_thread).addCallback(out.append)
    [hashed] = out
    assert hashed.fully_hashed and not catalog.fully_hashed
    chat = hashed.get("chat")
    assert chat is not None
    sha = hashlib.sha256(b"chat").hexdigest()
    assert chat.model_hash == hashlib.sha256(f"model={sha}".encode()).hexdigest()
    direct: list[list[ModelConfig]] = []
    hash_models(catalog.models, cache, sync_thread).addCallback(direct.append)
    assert list(hashed.models) == direct[0]


def test_embedded_default_models_all_parse() -> None:
    defaults = Path(routerd.__file__).parent / "defaults" / "models"
    if not any(defaults.glob("*.kcpps")):
        pytest.skip("no embedded default models yet")
    catalog = Catalog.scan(str(defaults), "llama_sdcpp")
    assert catalog.invalid == ()
    assert catalog.serving("text") and catalog.serving("image") and catalog.serving("stt")
