"""Simulator weight files (``*.sim.json``): reading, validating and writing them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal, cast

import attrs

__all__ = [
    "KINDS",
    "TIMING_DEFAULTS",
    "Weights",
    "WeightsError",
    "WeightsKind",
    "load_weights",
    "weights_display_name",
    "write_weights",
]

WeightsKind = Literal["text", "image", "stt", "tts", "music"]
KINDS: tuple[WeightsKind, ...] = ("text", "image", "stt", "tts", "music")

#: Timing and shape fields of a weights file and the values used when a file leaves them out.
TIMING_DEFAULTS: dict[str, float | int] = {
    "load_ms": 0,
    "prompt_tokens_per_s": 1000.0,
    "gen_tokens_per_s": 100.0,
    "ms_per_step_megapixel": 100.0,
    "realtime_factor": 0.1,
    "context": 4096,
    "embedding_dim": 8,
}
_INT_FIELDS = frozenset({"context", "embedding_dim"})
_POSITIVE_FIELDS = frozenset({"prompt_tokens_per_s", "gen_tokens_per_s", "context", "embedding_dim"})

SIM_SUFFIX = ".sim.json"


class WeightsError(Exception):
    """A weights file is missing, unreadable, malformed or of the wrong kind."""


@attrs.frozen
class Weights:
    """The parsed content of a ``*.sim.json`` file."""

    kind: WeightsKind
    label: str
    load_ms: float
    prompt_tokens_per_s: float
    gen_tokens_per_s: float
    ms_per_step_megapixel: float
    realtime_factor: float
    context: int
    embedding_dim: int

    @classmethod
    def from_dict(cls, data: object, *, origin: str = "weights") -> Weights:
        if not isinstance(data, dict):
            raise WeightsError(f"{origin}: expected a JSON object")
        kind = data.get("kind")
        if kind not in KINDS:
            raise WeightsError(f"{origin}: 'kind' must be one of {', '.join(KINDS)}, got {kind!r}")
        label = data.get("weights")
        if not isinstance(label, str) or not label:
            raise WeightsError(f"{origin}: 'weights' must be a non-empty string label")
        values: dict[str, Any] = {}
        for name, default in TIMING_DEFAULTS.items():
            raw = data.get(name, default)
            values[name] = _number(raw, name, origin)
        return cls(kind=cast(WeightsKind, kind), label=label, **values)

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"kind": self.kind, "weights": self.label}
        for name in TIMING_DEFAULTS:
            out[name] = getattr(self, name)
        return out


def _number(raw: object, name: str, origin: str) -> float | int:
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise WeightsError(f"{origin}: {name!r} must be a number, got {raw!r}")
    if name in _INT_FIELDS:
        if raw != int(raw):
            raise WeightsError(f"{origin}: {name!r} must be an integer, got {raw!r}")
        raw = int(raw)
    if raw < 0 or (name in _POSITIVE_FIELDS and raw <= 0):
        raise WeightsError(f"{origin}: {name!r} out of range: {raw!r}")
    return raw


def load_weights(path: str | os.PathLike[str], expected_kind: WeightsKind | None = None) -> Weights:
    """Read and validate a weights file; ``WeightsError`` explains any problem."""
    where = os.fspath(path)
    try:
        text = Path(where).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise WeightsError(f"failed to open model file '{where}': no such file") from None
    except OSError as exc:
        raise WeightsError(f"failed to read model file '{where}': {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise WeightsError(f"model file '{where}' is not a simulator weights file (not UTF-8 JSON)") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise WeightsError(f"model file '{where}' is not a simulator weights file: {exc}") from None
    weights = Weights.from_dict(data, origin=f"model file '{where}'")
    if expected_kind is not None and weights.kind != expected_kind:
        raise WeightsError(
            f"model file '{where}' holds {weights.kind} weights, this backend needs {expected_kind} weights"
        )
    return weights


def write_weights(
    path: str | os.PathLike[str],
    kind: WeightsKind,
    label: str,
    **timing: float | int,
) -> Path:
    """Write a ``.sim.json`` weights file (missing timing fields get defaults) and return its path.

    ``timing`` takes any of: load_ms, prompt_tokens_per_s, gen_tokens_per_s, ms_per_step_megapixel,
    realtime_factor, context, embedding_dim.
    """
    unknown = sorted(set(timing) - set(TIMING_DEFAULTS))
    if unknown:
        raise TypeError(f"unknown weights fields: {', '.join(unknown)}")
    data: dict[str, object] = {"kind": kind, "weights": label, **TIMING_DEFAULTS, **timing}
    weights = Weights.from_dict(data)  # validate before writing
    target = Path(path)
    target.write_text(json.dumps(weights.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return target


def weights_display_name(path: str) -> str:
    """The file name without directories or its weights ending (``.sim.json``, ``.gguf``, ...)."""
    name = os.path.basename(path.rstrip("/")) or path
    for suffix in (SIM_SUFFIX, ".gguf", ".safetensors", ".ckpt", ".bin"):
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name
