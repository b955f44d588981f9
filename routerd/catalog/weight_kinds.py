"""What kind of weights a file holds, read from the file itself: the slot of a model config it fits.

* a GGUF (magic ``GGUF``): its ``general.architecture`` (the header walked with the ``gguf`` package's
  value types, no further than that key): ``clip`` is a vision projector, a diffusion architecture
  (``flux``, ``sdxl`` …) or stable-diffusion.cpp's tensor names (``model.diffusion_model.*``, no
  architecture) an image model, ``wavtokenizer-dec`` a TTS vocoder, a BERT-like encoder an embeddings
  model, any other architecture a text model;
* whisper.cpp's legacy ggml file (magic ``0x67676d6c``): a speech-to-text model;
* a simulator weights file (``*.sim.json``): its JSON ``kind``.

Anything else (safetensors, a file that does not parse) is of no known kind: it is offered in every
slot and never refused, since routerd cannot tell.  :func:`kind_problem` is the rule ``routerd check``
and Cook's preview apply to a config's files; :data:`SLOT_KINDS` is what each slot accepts.

A file is read once per (path, size, modification time): Cook's listing and ``routerd check`` ask again
and again for the same files.
"""

from __future__ import annotations

import functools
import json
import os
import struct
from typing import Any, BinaryIO, Literal

import attrs

WeightKind = Literal["text", "embeddings", "mmproj", "image", "stt", "tts", "music"]

#: The kinds each weight field of a ``.kcpps`` accepts; a field not named here (music) is not checked.
SLOT_KINDS: dict[str, frozenset[WeightKind]] = {
    "model": frozenset({"text", "embeddings"}),
    "mmproj": frozenset({"mmproj"}),
    "embeddingsmodel": frozenset({"embeddings", "text"}),
    "sdmodel": frozenset({"image"}),
    "whispermodel": frozenset({"stt"}),
    "ttsmodel": frozenset({"tts", "text"}),  # OuteTTS is a text architecture with a vocoder beside it
}

#: What an operator calls each kind (the slot it belongs in).
KIND_WORDS: dict[WeightKind, str] = {
    "text": "a text model", "embeddings": "an embeddings model", "mmproj": "a vision projector (mmproj)",
    "image": "image weights", "stt": "a speech-to-text (whisper) model", "tts": "a text-to-speech model",
    "music": "a music model",
}

#: The field a file of each kind belongs in (what a refusal suggests).
HOME_FIELD: dict[WeightKind, str] = {
    "text": "model", "embeddings": "embeddingsmodel", "mmproj": "mmproj", "image": "sdmodel",
    "stt": "whispermodel", "tts": "ttsmodel", "music": "musicllm",
}

GGUF_MAGIC = b"GGUF"
#: whisper.cpp's ggml magic 0x67676d6c as it is written (little-endian).
GGML_MAGIC = struct.pack("<I", 0x67676D6C)
SIM_SUFFIX = ".sim.json"
#: A simulator weights file is a few hundred bytes; anything far larger is not one.
SIM_MAX_BYTES = 64 * 1024
#: Bounds of what a header walk reads: a key or tensor name, and the tensor names of a GGUF without an
#: architecture (stable-diffusion.cpp's name their diffusion model among the first).
MAX_NAME_BYTES = 65_536
MAX_TENSOR_NAMES = 64

#: Diffusion architectures (image and video generators) as GGUF conversions of them name themselves.
IMAGE_ARCHITECTURES = frozenset({"flux", "sd1", "sd2", "sdxl", "sd3", "aura", "ltxv", "hyvid", "wan",
                                 "cosmos", "lumina2", "hidream", "chroma", "qwen_image", "stable-diffusion"})
EMBEDDING_ARCHITECTURES = frozenset({"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3",
                                     "neo-bert", "modern-bert", "t5encoder"})
TTS_ARCHITECTURES = frozenset({"wavtokenizer-dec"})
#: Tensor name prefixes of stable-diffusion.cpp's GGUF conversions, which carry no architecture.
IMAGE_TENSOR_PREFIXES = ("model.diffusion_model.", "first_stage_model.", "cond_stage_model.",
                         "double_blocks.", "joint_blocks.")
#: The simulator's kinds (``routerd.sim.weights.KINDS``) as weight kinds.
SIM_KINDS: dict[str, WeightKind] = {"text": "text", "image": "image", "stt": "stt", "tts": "tts",
                                    "music": "music"}


@attrs.frozen
class FileKind:
    """A file's kind (None: unknown) and how it was told (``"GGUF llama"``, ``"simulator image"``)."""

    kind: WeightKind | None
    detail: str


UNKNOWN = FileKind(None, "")


class _Header:
    """Reads a GGUF's header in order (little-endian, as llama.cpp writes it), no further than asked."""

    def __init__(self, handle: BinaryIO) -> None:
        self.handle = handle

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize("<" + fmt)
        data = self.handle.read(size)
        if len(data) != size:
            raise ValueError("the GGUF header ends early")
        return struct.unpack("<" + fmt, data)[0]

    def text(self) -> str:
        length = self.unpack("Q")
        if length > MAX_NAME_BYTES:
            raise ValueError("a GGUF string is implausibly long")
        return str(self.handle.read(length).decode("utf-8"))

    def skip(self, value_type: int, sizes: dict[int, int], string: int, array: int) -> None:
        """Pass over one value of ``value_type`` (an array element by element only for strings)."""
        if value_type == string:
            self.handle.seek(self.unpack("Q"), os.SEEK_CUR)
        elif value_type == array:
            item, count = self.unpack("I"), self.unpack("Q")
            if item in sizes:
                self.handle.seek(sizes[item] * count, os.SEEK_CUR)
            else:
                for _ in range(count):
                    self.skip(item, sizes, string, array)
        elif value_type in sizes:
            self.handle.seek(sizes[value_type], os.SEEK_CUR)
        else:
            raise ValueError(f"unknown GGUF value type {value_type}")


def gguf_architecture(path: str) -> tuple[str, list[str]]:
    """A GGUF's ``general.architecture`` ("" when it names none) and, only when it names none, its
    tensor names.  The header is walked with the ``gguf`` package's value types and sizes and left at
    the architecture (the first key llama.cpp's writers put there): ``gguf.GGUFReader`` would parse
    every key and tensor first, seconds for a real model's 150,000-token vocabulary."""
    import numpy as np
    from gguf import GGUFReader, GGUFValueType  # imports numpy: only once a GGUF is read

    sizes = {int(t): np.dtype(d).itemsize for t, d in GGUFReader.gguf_scalar_to_np.items()}
    string, array = int(GGUFValueType.STRING), int(GGUFValueType.ARRAY)
    with open(path, "rb") as handle:
        header = _Header(handle)
        if handle.read(4) != GGUF_MAGIC:
            raise ValueError("not a GGUF")
        header.unpack("I")  # version
        tensors, keys = header.unpack("Q"), header.unpack("Q")
        for _ in range(keys):
            key, value_type = header.text(), header.unpack("I")
            if key == "general.architecture" and value_type == string:
                return header.text(), []
            header.skip(value_type, sizes, string, array)
        names = []
        for _ in range(min(tensors, MAX_TENSOR_NAMES)):
            names.append(header.text())
            dims = header.unpack("I")
            handle.seek(8 * dims + 4 + 8, os.SEEK_CUR)  # the dimensions, the type, the offset
        return "", names


def _gguf_kind(path: str) -> FileKind:
    try:
        architecture, names = gguf_architecture(path)
    except (ValueError, OSError, struct.error, UnicodeDecodeError):
        return FileKind(None, "GGUF (unreadable)")
    if not architecture:
        if any(n.startswith(IMAGE_TENSOR_PREFIXES) for n in names):
            return FileKind("image", "GGUF diffusion tensors")
        return FileKind(None, "GGUF")
    detail = "GGUF " + architecture
    if architecture == "clip":
        return FileKind("mmproj", detail)
    if architecture in IMAGE_ARCHITECTURES:
        return FileKind("image", detail)
    if architecture in EMBEDDING_ARCHITECTURES:
        return FileKind("embeddings", detail)
    if architecture in TTS_ARCHITECTURES:
        return FileKind("tts", detail)
    if architecture == "whisper":
        return FileKind("stt", detail)
    return FileKind("text", detail)


def _sim_kind(path: str, size: int) -> FileKind:
    if size > SIM_MAX_BYTES:
        return UNKNOWN
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return UNKNOWN
    named = data.get("kind") if isinstance(data, dict) else None
    kind = SIM_KINDS.get(named) if isinstance(named, str) else None
    return FileKind(kind, f"simulator {kind}") if kind is not None else UNKNOWN


@functools.lru_cache(maxsize=4096)
def _kind_of(path: str, size: int, mtime_ns: int) -> FileKind:
    if path.endswith(SIM_SUFFIX):
        return _sim_kind(path, size)
    try:
        with open(path, "rb") as handle:
            magic = handle.read(4)
    except OSError:
        return UNKNOWN
    if magic == GGUF_MAGIC:
        return _gguf_kind(path)
    if magic == GGML_MAGIC:
        return FileKind("stt", "whisper.cpp ggml")
    return UNKNOWN


def file_kind(path: str) -> FileKind:
    """The kind of the weights at ``path`` (:data:`UNKNOWN` when it cannot be told or read)."""
    try:
        stat = os.stat(path)
    except OSError:
        return UNKNOWN
    return _kind_of(os.path.realpath(path), stat.st_size, stat.st_mtime_ns)


def fits(field: str, kind: WeightKind | None) -> bool:
    """Whether a file of ``kind`` may be given as ``field`` (an unknown kind always may)."""
    accepted = SLOT_KINDS.get(field)
    return kind is None or accepted is None or kind in accepted


def kind_problem(filename: str, field: str, path: str) -> str | None:
    """The line ``routerd check`` reports when the file at ``path`` is of a kind ``field`` refuses."""
    found = file_kind(path)
    if found.kind is None or fits(field, found.kind):
        return None
    wanted = " or ".join(word for k, word in KIND_WORDS.items() if k in SLOT_KINDS[field])
    return (f"{filename}: {field} {path} is {KIND_WORDS[found.kind]} ({found.detail}), not {wanted}; "
            f"give it as {HOME_FIELD[found.kind]}")


__all__ = ["HOME_FIELD", "KIND_WORDS", "SLOT_KINDS", "UNKNOWN", "FileKind", "WeightKind", "file_kind", "fits",
           "kind_problem"]
