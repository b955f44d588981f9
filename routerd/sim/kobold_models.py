"""What a simulated KoboldCpp config loads: the weights per lane read from a ``.kcpps`` config or
from the per-lane flags, as one :class:`ModelSet`.

Music weights are ``music`` simulator weights (``musicllm``: the planner, ``musicdiffusion``: the
generator); ``musicembeddings`` and ``musicvae`` must name existing files but are not read.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from pathlib import Path

import attrs

from routerd.sim.weights import TIMING_DEFAULTS, Weights, WeightsError, WeightsKind, load_weights

__all__ = ["ModelSet", "model_set_from_args", "model_set_from_config"]

#: ``.kcpps`` key -> (lane, weights kind).
_LANES: tuple[tuple[str, str, WeightsKind], ...] = (
    ("model", "text", "text"),
    ("sdmodel", "image", "image"),
    ("whispermodel", "stt", "stt"),
    ("ttsmodel", "tts", "tts"),
    ("embeddingsmodel", "embeddings", "text"),
    ("musicllm", "music_planner", "music"),
    ("musicdiffusion", "music", "music"),
)
#: Music files KoboldCpp loads besides the two weights (must exist; the simulator does not read them).
_MUSIC_FILES = ("musicembeddings", "musicvae")

@attrs.frozen
class ModelSet:
    """What one config loads: weights per lane (``text``, ``image``, ``stt``, ``tts``,
    ``embeddings``) and their paths."""

    name: str = ""
    weights: Mapping[str, Weights] = attrs.field(factory=dict)
    paths: Mapping[str, str] = attrs.field(factory=dict)
    context: int = 0
    mmproj: str | None = None

    @property
    def combined(self) -> Weights:
        """One Weights standing for the whole set: the labels joined, load times summed."""
        parts = [self.weights[lane] for lane in sorted(self.weights)]
        values: dict[str, float | int] = dict(TIMING_DEFAULTS)
        values["load_ms"] = sum(w.load_ms for w in parts)
        label = "+".join(w.label for w in parts) or "nomodel"
        return Weights.from_dict({"kind": "text", "weights": label, **values})

    def has(self, lane: str) -> bool:
        return lane in self.weights

    @property
    def has_music(self) -> bool:
        return self.has("music") or self.has("music_planner")


def _path_of(value: object, key: str) -> str | None:
    if value is None or value == "":
        return None
    if isinstance(value, list):
        found = [v for v in value if isinstance(v, str) and v]
        return found[0] if found else None
    if not isinstance(value, str):
        raise WeightsError(f"{key} must be a file path")
    return value


def _build_set(name: str, values: Mapping[str, object], base_dir: str) -> ModelSet:
    weights: dict[str, Weights] = {}
    paths: dict[str, str] = {}
    for key, lane, kind in _LANES:
        raw = values.get(key)
        if key == "model" and not raw:
            raw = values.get("model_param")
        path = _path_of(raw, key)
        if path is None:
            continue
        if not os.path.isabs(path):
            path = os.path.join(base_dir, path)
        weights[lane] = load_weights(path, kind)
        paths[lane] = path
    for key in _MUSIC_FILES:
        path = _path_of(values.get(key), key)
        if path is None:
            continue
        if not os.path.isabs(path):
            path = os.path.join(base_dir, path)
        if not os.path.isfile(path):
            raise WeightsError(f"failed to open {key} file '{path}': no such file")
    context = values.get("contextsize")
    mmproj = _path_of(values.get("mmproj"), "mmproj")
    return ModelSet(name, weights, paths, context if isinstance(context, int) else 0, mmproj)


def model_set_from_config(path: str) -> ModelSet:
    """Read a ``.kcpps`` config; ``WeightsError`` when it or its weights cannot be used."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise WeightsError(f"config file '{path}' not found") from None
    except (OSError, ValueError) as exc:
        raise WeightsError(f"config file '{path}' cannot be read: {exc}") from None
    if not isinstance(raw, dict):
        raise WeightsError(f"config file '{path}' is not a JSON object")
    stem = os.path.basename(path).removesuffix(".kcpps")
    if raw.get("nomodel") is True:
        return ModelSet(stem)
    return _build_set(stem, raw, os.path.dirname(os.path.abspath(path)))


def model_set_from_args(ns: argparse.Namespace) -> ModelSet:
    if ns.nomodel:
        return ModelSet()
    if ns.config:
        return model_set_from_config(ns.config)
    values = {key: getattr(ns, key) for key, _lane, _kind in _LANES}
    values.update({key: getattr(ns, key) for key in _MUSIC_FILES})
    values["contextsize"] = ns.contextsize
    values["mmproj"] = ns.mmproj
    found = _build_set(os.path.basename(ns.model or "").removesuffix(".sim.json"), values, os.getcwd())
    if not found.weights:
        raise WeightsError("no model given (use --config, --model or --nomodel)")
    return found
