"""Kobold music: the ``music`` capability from a ``.kcpps``, in records and runtime
configs, the music routes' classification and per-family plan, recipes' music lane and the
KoboldCpp music readiness probe."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest
from cattrs.preconf.json import make_converter
from twisted.internet.defer import ensureDeferred

from routerd.backends.families import kobold, text_side
from routerd.catalog.catalog import Catalog
from routerd.catalog.kcpps import NO_MODEL_FILE, config_hash, parse_kcpps
from routerd.catalog.model import Capabilities, InvalidConfig, ModelConfig
from routerd.errors import HTTPError
from routerd.inference.recipes import RecipeRouter
from routerd.registry.recipes import RecipeBook, RecipeError, request_lanes
from routerd.routing.classify import allowed_methods, classify
from routerd.routing.plan import NEEDS, SECTIONS, plan_backend_call
from routerd.wire.records import (
    ModelRecord,
    WireError,
    parse_record,
    parse_snapshot,
    record_to_json,
    snapshot_to_json,
)

from .test_backends_families import World, model
from .test_backends_slot import result_of
from .test_registry_recipes import RECORDS, FakeLoads, MemoryStorage

MUSIC_PATHS = ("/api/extra/music/prepare", "/api/extra/music/generate")


def parse(tmp_path: Path, content: dict[str, Any], mode: str = "kobold") -> ModelConfig | InvalidConfig:
    path = tmp_path / "models" / "song.kcpps"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(content))
    return parse_kcpps(str(path), mode)


# -- catalog ------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["musicllm", "musicdiffusion"])
def test_a_music_lm_or_diffusion_model_gives_the_music_capability(tmp_path: Path, key: str) -> None:
    cfg = parse(tmp_path, {key: "m.gguf"})
    assert isinstance(cfg, ModelConfig)
    assert cfg.capabilities == Capabilities(music=True)
    assert text_side(cfg)  # music runs on KoboldCpp's text side


def test_the_four_music_keys_are_weight_paths_resolved_against_the_config(tmp_path: Path) -> None:
    cfg = parse(tmp_path, {"model": "t.gguf", "musicllm": "lm.gguf", "musicembeddings": "../e.gguf",
                           "musicdiffusion": "/abs/dit.gguf", "musicvae": ["", "vae.gguf"]})
    assert isinstance(cfg, ModelConfig)
    models = tmp_path / "models"
    assert cfg.music_llm == str(models / "lm.gguf")
    assert cfg.music_embeddings == str(tmp_path / "e.gguf")
    assert cfg.music_diffusion == "/abs/dit.gguf"
    assert cfg.music_vae == str(models / "vae.gguf")
    assert cfg.capabilities.llm and cfg.capabilities.music
    assert {"musicllm", "musicembeddings", "musicdiffusion", "musicvae"} <= set(cfg.weight_files())


def test_music_embeddings_or_vae_alone_is_no_model_file(tmp_path: Path) -> None:
    result = parse(tmp_path, {"musicembeddings": "e.gguf", "musicvae": "v.gguf"})
    assert isinstance(result, InvalidConfig) and result.reason == NO_MODEL_FILE


def test_a_music_key_that_is_not_a_path_is_invalid_naming_it(tmp_path: Path) -> None:
    result = parse(tmp_path, {"musicdiffusion": 3})
    assert isinstance(result, InvalidConfig) and "musicdiffusion" in result.reason


def test_music_paths_hash_as_paths_so_two_machines_agree() -> None:
    assert config_hash({"musicllm": "/a/lm.gguf"}) == config_hash({"musicllm": "/elsewhere/other-name"})


def test_a_portable_music_hash_gives_music_and_blocks_until_bound(tmp_path: Path) -> None:
    cfg = parse(tmp_path, {"musicdiffusion_hash": "a" * 64, "musicdiffusion_filename": "dit.gguf"})
    assert isinstance(cfg, ModelConfig)
    assert cfg.capabilities.music and cfg.unbound_fields() == ["musicdiffusion"]


def test_kobold_runtime_config_carries_absolute_music_paths(tmp_path: Path) -> None:
    cfg = parse(tmp_path, {"musicllm": "lm.gguf", "musicdiffusion": "dit.gguf", "musicvae": "",
                           "backend_mode": "kobold"})
    assert isinstance(cfg, ModelConfig)
    written = kobold.runtime_config(cfg)
    assert written["musicllm"] == str(tmp_path / "models" / "lm.gguf")
    assert written["musicdiffusion"] == str(tmp_path / "models" / "dit.gguf")
    assert "musicvae" not in written and "backend_mode" not in written


# -- wire records -------------------------------------------------------------------------------

def test_music_is_sent_only_when_true_and_round_trips() -> None:
    plain = record_to_json(ModelRecord(local_id="t", capabilities=Capabilities(llm=True)))
    assert "music" not in plain["capabilities"]  # exactly the contract's record
    doc = record_to_json(ModelRecord(local_id="song", capabilities=Capabilities(music=True)))
    assert doc["capabilities"]["music"] is True
    assert parse_record(doc).capabilities == Capabilities(music=True)
    snapshot = parse_snapshot({"node_id": "kob", "models": [doc]})
    assert parse_snapshot(snapshot_to_json(snapshot)) == snapshot


def test_an_older_peers_record_parses_without_music_and_an_older_peer_parses_ours() -> None:
    old = {"local_id": "t", "capabilities": {"llm": True, "image": False, "embeddings": False,
                                             "multimodal": False, "stt": False, "tts": False,
                                             "context": 0}}
    assert parse_record(old).capabilities.music is False

    @attrs.frozen
    class OldCapabilities:  # the capabilities a peer built before music knew
        llm: bool = False
        image: bool = False
        embeddings: bool = False
        multimodal: bool = False
        stt: bool = False
        tts: bool = False
        context: int = 0

    ours = record_to_json(ModelRecord(local_id="song", capabilities=Capabilities(music=True, context=5)))
    assert make_converter().structure(ours["capabilities"], OldCapabilities) == OldCapabilities(context=5)


def test_music_must_be_a_boolean_on_the_wire() -> None:
    with pytest.raises(WireError, match="capabilities.music"):
        parse_record({"local_id": "x", "capabilities": {"music": "true"}})


# -- classification and plan --------------------------------------------------------------------

@pytest.mark.parametrize("path", MUSIC_PATHS)
def test_music_routes_are_their_own_kind_on_the_text_side_and_never_lent(path: str) -> None:
    route = classify("POST", path + "/")
    assert route is not None
    assert (route.kind, route.runtime, route.lane, route.family) == ("kobold_music", "text", None, "kobold")
    assert route.error_style == "openai" and not route.model_required
    assert NEEDS[SECTIONS[route.kind]] == "music"
    assert classify("GET", path) is None and allowed_methods(path) == ("POST",)


def _plan(path: str, body: dict[str, Any], family: str) -> Any:
    route = classify("POST", path)
    assert route is not None
    return plan_backend_call(route, path, body, json.dumps(body).encode(), "application/json", "local-id",
                             False, family)


@pytest.mark.parametrize("path", MUSIC_PATHS)
def test_music_passes_through_unchanged_on_kobold(path: str) -> None:
    body = {"caption": "calm piano", "duration": 4}
    planned = _plan(path, body, "kobold")
    assert planned.path == path and json.loads(planned.body) == body
    assert json.loads(_plan(path, {**body, "model": "public"}, "kobold").body)["model"] == "local-id"


@pytest.mark.parametrize("path", MUSIC_PATHS)
def test_music_is_unsupported_under_llama_sdcpp_like_speech(path: str) -> None:
    with pytest.raises(HTTPError) as info:
        _plan(path, {"caption": "x"}, "llama_sdcpp")
    assert info.value.status == 501 and info.value.type == "unsupported_backend"
    assert info.value.message == "music route is not supported by the selected split backend config"


@pytest.mark.parametrize("path", MUSIC_PATHS)
def test_music_is_unsupported_under_vllm(path: str) -> None:
    with pytest.raises(HTTPError) as info:
        _plan(path, {"caption": "x"}, "vllm")
    assert info.value.status == 501 and info.value.type == "unsupported_backend"
    assert info.value.message == f"{path} is not supported by the vllm backend family"


# -- readiness ----------------------------------------------------------------------------------

def test_a_kobold_music_config_is_ready_only_when_the_version_reports_music(tmp_path: Path) -> None:
    song = model("song", Capabilities(music=True), music_diffusion="/w/dit.gguf")
    w = World(tmp_path)
    lease = w.runtimes.acquire("text", song)
    w.ready()
    result_of(lease).release()
    port = w.launcher.spawned[0].port
    w.http.versions[port] = {"music": False, "tts": True}
    result_of(w.runtimes.refresh_readiness())
    assert not w.runtimes.ready("text", song)
    w.http.versions[port] = {"music": True}
    result_of(w.runtimes.refresh_readiness())
    assert w.runtimes.ready("text", song)


# -- recipes ------------------------------------------------------------------------------------

SONG = ModelRecord(local_id="song", public_id="song", node_id="m", node_url="http://m",
                   capabilities=Capabilities(music=True), filename="song.kcpps", backend_mode="kobold")


def _book() -> RecipeBook:
    return RecipeBook(MemoryStorage(), own_node_id="m", records=lambda: [*RECORDS, SONG],
                      routing_only=lambda: False, now_ms=lambda: 1)


def test_a_recipe_music_component_needs_the_music_capability_and_answers_music_requests() -> None:
    book = _book()
    with pytest.raises(RecipeError) as info:
        book.save({"id": "x", "music": {"node_id": "m", "model_id": "ears"}})  # speech-to-text only
    assert info.value.code == "capability_mismatch"
    book.save({"id": "band", "text": {"node_id": "a", "model_id": "words"},
               "music": {"node_id": "m", "model_id": "song"}})
    assert request_lanes("text", "music") == ("music",)
    router = RecipeRouter(book=book, node_id="m", records=lambda: [*RECORDS, SONG],
                          catalog=lambda: Catalog(), runtimes=FakeLoads(), remote=FakeLoads())
    routed = router.route("band", "text", "music")
    assert routed is not None and routed[1].local_id == "song"
    assert router.route("band", "text", "llm")[1].local_id == "words"  # type: ignore[index]


def test_a_local_recipe_music_component_loads_on_the_text_runtime() -> None:
    book = _book()
    book.save({"id": "band", "music": {"node_id": "m", "model_id": "song"}})
    song = model("song", Capabilities(music=True), music_diffusion="/w/dit.gguf")
    loads = FakeLoads()
    router = RecipeRouter(book=book, node_id="m", records=lambda: [*RECORDS, SONG],
                          catalog=lambda: Catalog([song]), runtimes=loads, remote=FakeLoads())
    recipe = book.get("band")
    assert recipe is not None
    ensureDeferred(router.load(recipe))
    assert loads.calls == [("song", "text")]
