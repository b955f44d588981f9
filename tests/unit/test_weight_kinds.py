"""Weights of each kind told from the file itself (``routerd.catalog.weight_kinds``): Cook offers a file
only in the slots of its kind, and ``routerd check`` refuses a file given in a slot of another kind.

Every file is generated here: GGUFs with the ``gguf`` package (one tiny tensor and the architecture
under test), whisper.cpp's ggml file with the real-backend tier's generator, simulator JSON by hand.
"""

from __future__ import annotations

import json
import stat
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from routerd.assets.cook import CookOrder, cook, model_files
from routerd.checking import check_config
from routerd.config.load import load_config
from tests.support_models import write_tiny_whisper


def write_gguf(path: Path, architecture: str) -> Path:
    """A valid GGUF naming ``architecture``, holding one four-float tensor."""
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_tensor("t.weight", np.zeros((4,), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_sim(path: Path, kind: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"kind": kind, "weights": path.stem}))
    return path


def shelf(root: Path) -> dict[str, Path]:
    """One file of every kind under ``root`` (and one routerd cannot tell)."""
    (root / "stt").mkdir(parents=True, exist_ok=True)
    return {
        "llama": write_gguf(root / "llm" / "chat.gguf", "llama"),
        "clip": write_gguf(root / "llm" / "chat-mmproj.gguf", "clip"),
        "flux": write_gguf(root / "img" / "flux.gguf", "flux"),
        "bert": write_gguf(root / "emb" / "bert.gguf", "bert"),
        "whisper": write_tiny_whisper(root / "stt" / "ggml-tiny.bin"),
        "sim-image": write_sim(root / "sim" / "dream.sim.json", "image"),
        "sim-stt": write_sim(root / "sim" / "whisper.sim.json", "stt"),
        "sim-text": write_sim(root / "sim" / "chat.sim.json", "text"),
        "opaque": _opaque(root / "misc" / "model.safetensors"),
    }


def _opaque(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    return path


def test_each_file_is_told_by_its_header_or_its_json(tmp_path: Path) -> None:
    from routerd.catalog.weight_kinds import file_kind  # new in issue 32: the other tests run on older trees

    files = shelf(tmp_path)
    kinds = {name: (file_kind(str(p)).kind, file_kind(str(p)).detail) for name, p in files.items()}
    assert kinds == {
        "llama": ("text", "GGUF llama"), "clip": ("mmproj", "GGUF clip"), "flux": ("image", "GGUF flux"),
        "bert": ("embeddings", "GGUF bert"), "whisper": ("stt", "whisper.cpp ggml"),
        "sim-image": ("image", "simulator image"), "sim-stt": ("stt", "simulator stt"),
        "sim-text": ("text", "simulator text"), "opaque": (None, ""),
    }


def test_a_file_that_only_looks_like_a_gguf_is_of_no_known_kind(tmp_path: Path) -> None:
    from routerd.catalog.weight_kinds import file_kind

    cut = tmp_path / "cut.gguf"
    cut.write_bytes(b"GGUF\x03\x00\x00\x00")  # the magic, then nothing a reader can parse
    named = tmp_path / "projector.gguf"
    named.write_bytes(b"demo projector")
    assert file_kind(str(cut)).kind is None
    assert file_kind(str(named)).kind is None


def _text(value: str) -> bytes:
    return struct.pack("<Q", len(value)) + value.encode()


def test_a_gguf_without_an_architecture_is_told_by_stable_diffusion_cpps_tensor_names(tmp_path: Path) -> None:
    """stable-diffusion.cpp's GGUFs name no architecture: a key of another kind is passed over, then
    the tensor names say it is a diffusion model; with other names it stays of no known kind."""
    from routerd.catalog.weight_kinds import file_kind

    def sd_gguf(path: Path, tensor: str) -> Path:
        key = _text("general.name") + struct.pack("<I", 8) + _text("sd")  # one string key (type 8)
        info = _text(tensor) + struct.pack("<I", 1) + struct.pack("<Q", 4) + struct.pack("<IQ", 0, 0)
        path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1, 1) + key + info)
        return path

    assert file_kind(str(sd_gguf(tmp_path / "sd.gguf", "model.diffusion_model.input_blocks.0.weight"))) \
        .kind == "image"
    assert file_kind(str(sd_gguf(tmp_path / "other.gguf", "weird.weight"))).kind is None


def test_cook_offers_each_slot_only_the_files_of_its_kind(tmp_path: Path) -> None:
    files = shelf(tmp_path)
    offered = {f["path"]: f for f in model_files([str(tmp_path)])}

    def slots(name: str) -> list[str]:
        return list(offered[str(files[name].relative_to(tmp_path))]["fields"])

    assert slots("llama") == ["model", "embeddingsmodel", "ttsmodel"]
    assert slots("clip") == ["mmproj"]
    assert slots("flux") == ["sdmodel"]
    assert slots("whisper") == ["whispermodel"]
    assert slots("sim-image") == ["sdmodel"]
    assert slots("sim-stt") == ["whispermodel"]
    assert slots("opaque") == ["model", "mmproj", "embeddingsmodel", "sdmodel", "whispermodel", "ttsmodel"]
    assert offered["img/flux.gguf"]["kind"] == "image"
    assert offered["img/flux.gguf"]["detail"] == "GGUF flux"


def test_cooks_preview_says_a_whisper_file_is_not_a_text_model(tmp_path: Path) -> None:
    files = shelf(tmp_path / "roots")
    (tmp_path / "models").mkdir()
    order = CookOrder(model_id="chat", files={"model": str(files["whisper"].relative_to(tmp_path / "roots"))})
    cooked = cook(order, [str(tmp_path / "roots")], str(tmp_path / "models"), load_config(None))
    assert any("is a speech-to-text (whisper) model (whisper.cpp ggml), not a text model" in p
               and "give it as whispermodel" in p for p in cooked.problems), cooked.problems


def _node(tmp_path: Path, kcpps: dict[str, dict[str, object]]) -> Path:
    models = tmp_path / "models"
    models.mkdir()
    for name, body in kcpps.items():
        (models / name).write_text(json.dumps(body))
    prog = tmp_path / "llama-server"
    prog.write_text("#!/bin/sh\n")
    prog.chmod(prog.stat().st_mode | stat.S_IXUSR)
    path = tmp_path / "node.yaml"
    path.write_text(json.dumps({"models": {"config_dir": "models"}, "cluster": {"store_dir": "store"},
                                "llama": {"binary_path": str(prog)}}))
    return path


@pytest.mark.parametrize(("name", "words"), [
    ("flux", "is image weights (GGUF flux), not a text model or an embeddings model; give it as sdmodel"),
    ("sim-image", "is image weights (simulator image), not a text model or an embeddings model; "
                  "give it as sdmodel"),
    ("whisper", "is a speech-to-text (whisper) model (whisper.cpp ggml), not a text model or an embeddings "
                "model; give it as whispermodel"),
])
def test_routerd_check_refuses_weights_of_another_kind_given_as_the_text_model(
        tmp_path: Path, name: str, words: str) -> None:
    files = shelf(tmp_path / "w")
    path = _node(tmp_path, {"chat.kcpps": {"model": str(files[name])}})
    ok, errors = check_config(str(path))
    assert not ok
    assert errors == [f"chat.kcpps: model {files[name]} {words}"]


def test_routerd_check_accepts_each_file_in_its_own_slot(tmp_path: Path) -> None:
    files = shelf(tmp_path / "w")
    path = _node(tmp_path, {
        "chat.kcpps": {"model": str(files["llama"]), "mmproj": str(files["clip"])},
        "unknown.kcpps": {"model": str(files["opaque"])},
        "embed.kcpps": {"embeddingsmodel": str(files["bert"])},
    })
    assert check_config(str(path)) == (True, [])
