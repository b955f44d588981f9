"""Portable configs named only by sha256 (reference §8.5): they parse, stay unresolved
until a verified file is bound, and a load of one is refused before any backend starts; export
turns paths back into hashes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.defer import Deferred, ensureDeferred, succeed
from twisted.internet.task import Clock

from routerd.assets.book import AssetBook
from routerd.assets.index import AssetIndex, build_index_blocking
from routerd.assets.portable import portable_config
from routerd.assets.pull import AssetPuller
from routerd.assets.service import AssetService
from routerd.catalog.catalog import Catalog
from routerd.catalog.hashing import FileHashCache
from routerd.catalog.kcpps import parse_kcpps
from routerd.catalog.model import InvalidConfig, ModelConfig
from routerd.errors import HTTPError
from routerd.inference.admin import ModelAdmin

SHA = hashlib.sha256(b"weights").hexdigest()


def _write(tmp_path: Path, name: str, raw: dict[str, Any]) -> str:
    path = tmp_path / f"{name}.kcpps"
    path.write_text(json.dumps(raw))
    return str(path)


def _parse(tmp_path: Path, raw: dict[str, Any]) -> ModelConfig | InvalidConfig:
    return parse_kcpps(_write(tmp_path, "port", raw), "llama_sdcpp")


def test_a_config_naming_its_text_weights_only_by_hash_parses_as_an_unbound_llm(tmp_path: Path) -> None:
    model = _parse(tmp_path, {"model_hash": SHA, "model_filename": "w.gguf", "contextsize": 2048})
    assert isinstance(model, ModelConfig), model
    assert model.capabilities.llm and model.capabilities.context == 2048
    assert model.text_model is None
    assert model.unbound_fields() == ["model"]


def test_a_hash_only_image_config_gets_its_image_id_from_the_portable_file_name(tmp_path: Path) -> None:
    model = _parse(tmp_path, {"sdmodel_hash": SHA, "sdmodel_filename": "juggernautXL.safetensors"})
    assert isinstance(model, ModelConfig)
    assert model.capabilities.image and not model.capabilities.llm
    assert model.image_id == "port-juggernautXL"


@pytest.mark.parametrize(("raw", "reason"), [
    ({"model_hash": "ABC"}, "model_hash must be a sha256"),
    ({"model_hash": SHA.upper()}, "model_hash must be a sha256"),
    ({"model_hash": SHA, "model_filename": "../escape.gguf"}, "model_filename must be a bare file name"),
    ({"model_hash": SHA, "model_filename": ".hidden"}, "model_filename must be a bare file name"),
    ({"contextsize": 10}, "config names no model file"),
])
def test_a_malformed_portable_field_is_an_invalid_config_naming_the_key(
        tmp_path: Path, raw: dict[str, Any], reason: str) -> None:
    result = _parse(tmp_path, raw)
    assert isinstance(result, InvalidConfig) and reason in result.reason


def test_export_replaces_each_path_by_hash_and_file_name_and_adds_a_bound_origin() -> None:
    raw = {"model": "/m/w.gguf", "model_param": "/m/w.gguf", "mmproj": "/m/p.gguf", "contextsize": 8}
    out = portable_config(raw, {"model": (SHA, "w.gguf"), "mmproj": ("b" * 64, "p.gguf")},
                          {SHA: "hf://o/r@" + "c" * 40 + "/w.gguf"})
    assert out == {"contextsize": 8, "model_hash": SHA, "model_filename": "w.gguf",
                   "model_hf": "hf://o/r@" + "c" * 40 + "/w.gguf",
                   "mmproj_hash": "b" * 64, "mmproj_filename": "p.gguf"}


class _Runtimes:
    def __init__(self) -> None:
        self.loads: list[str] = []

    def load(self, model: ModelConfig) -> Deferred[None]:
        self.loads.append(model.local_id)
        return succeed(None)

    def unload(self, kind: Any) -> Deferred[None]:
        return succeed(None)

    def loaded_config(self, kind: Any) -> str | None:
        return None


def _service(tmp_path: Path, catalog: list[Catalog], sources: dict[str, list[str]] | None = None,
             clock: Clock | None = None) -> AssetService:
    clock = clock or Clock()
    index = AssetIndex()
    sync = lambda f, *a: succeed(f(*a))  # noqa: E731
    puller = AssetPuller(agent=None, token="t", clock=clock, shared_dir=str(tmp_path / "shared"),  # type: ignore[arg-type]
                         index=index, slots=1, run_in_thread=sync)
    calls: list[Any] = []

    async def bound(new: Catalog) -> None:
        catalog[0] = new

    def post_json(base: str, path: str, body: Any) -> Deferred[Any]:
        calls.append(body)
        assets = [{"sha256": h, "node_url": u} for h, urls in (sources or {}).items()
                  for u in urls if h in body["hashes"]]
        return succeed({"assets": assets})

    service = AssetService(clock=clock, index=index, puller=puller, cache=FileHashCache(None),
                           run_in_thread=sync, file_roots=(), shared_dir=str(tmp_path / "shared"),
                           own_url="", catalog=lambda: catalog[0], on_catalog=bound, post_json=post_json,
                           peers=lambda: [], master_url="http://master", node_id="n1",
                           book=AssetBook(str(tmp_path / "store" / "model-assets.json")))
    service.lookups = calls  # type: ignore[attr-defined]
    return service


def test_an_explicit_load_of_an_unresolved_config_is_refused_before_the_backend_starts(
        tmp_path: Path) -> None:
    model = _parse(tmp_path, {"model_hash": SHA, "model_filename": "w.gguf"})
    assert isinstance(model, ModelConfig)
    catalog = [Catalog([model])]
    service = _service(tmp_path, catalog)
    ensureDeferred(service.resolve())
    assert service.states["port"].state == "unresolved"
    runtimes = _Runtimes()
    admin = ModelAdmin(node_id="n1", catalog=lambda: catalog[0], runtimes=runtimes, blocked=service.blocked)
    failures: list[Any] = []
    ensureDeferred(admin.load("port")).addErrback(failures.append)
    err = failures[0].value
    assert isinstance(err, HTTPError) and err.status == 503 and err.code == "assets_unresolved"
    assert "no node holds" in err.message
    assert runtimes.loads == []


def test_once_a_file_with_the_hash_is_indexed_the_config_binds_and_loads(tmp_path: Path) -> None:
    model = _parse(tmp_path, {"model_hash": SHA, "model_filename": "w.gguf"})
    assert isinstance(model, ModelConfig)
    catalog = [Catalog([model])]
    service = _service(tmp_path, catalog)
    root = tmp_path / "root"
    root.mkdir()
    (root / "w.gguf").write_bytes(b"weights")
    service.index.replace(build_index_blocking([], [str(root)], "", FileHashCache(None)))
    ensureDeferred(service.resolve())
    assert service.states["port"].state == "ready"
    bound = catalog[0].get("port")
    assert bound is not None and bound.text_model == str(root / "w.gguf") and bound.unbound_fields() == []
    runtimes = _Runtimes()
    admin = ModelAdmin(node_id="n1", catalog=lambda: catalog[0], runtimes=runtimes, blocked=service.blocked)
    ensureDeferred(admin.load("port"))
    assert runtimes.loads == ["port"]


def test_a_hash_only_config_is_blocked_even_before_its_first_resolution(tmp_path: Path) -> None:
    model = _parse(tmp_path, {"model_hash": SHA})
    assert isinstance(model, ModelConfig)
    service = _service(tmp_path, [Catalog([model])])
    assert service.blocked(model) is not None and "named only by sha256" in (service.blocked(model) or "")


def test_peer_lookups_are_reused_for_the_cache_window_then_asked_again(tmp_path: Path) -> None:
    clock = Clock()
    service = _service(tmp_path, [Catalog()], {SHA: ["http://peer"]}, clock)
    first = ensureDeferred(service.find_sources([SHA]))
    assert first.result == {SHA: ["http://peer"]}
    clock.advance(4.9)
    ensureDeferred(service.find_sources([SHA]))
    assert len(service.lookups) == 1  # type: ignore[attr-defined]
    clock.advance(0.2)
    ensureDeferred(service.find_sources([SHA]))
    assert len(service.lookups) == 2  # type: ignore[attr-defined]
