"""Exporting a config in portable form (cluster reference §8.5): each weight path field becomes
``<field>_hash`` + ``<field>_filename`` (+ ``<field>_hf`` when an origin is bound), so the file can
be loaded on any node that holds — or can pull — a file with that sha256."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from routerd.catalog.model import MUSIC_FIELDS

PATH_FIELDS: tuple[str, ...] = ("model", "mmproj", "embeddingsmodel", "sdmodel", "whispermodel", "ttsmodel",
                                *MUSIC_FIELDS)


def portable_config(raw: Mapping[str, Any], files: Mapping[str, tuple[str, str]],
                    origins: Mapping[str, str]) -> dict[str, Any]:
    """``raw`` with the fields of ``files`` (``field -> (sha256, filename)``) replaced by their
    portable keys; ``model_param`` goes with ``model``.  Other keys are kept as they are."""
    out = {k: v for k, v in raw.items() if k not in files and not (k == "model_param" and "model" in files)}
    for field in PATH_FIELDS:
        if field not in files:
            continue
        sha, filename = files[field]
        out[f"{field}_hash"] = sha
        out[f"{field}_filename"] = filename
        origin = origins.get(sha)
        if origin:
            out[f"{field}_hf"] = origin
        else:
            out.pop(f"{field}_hf", None)
    return out
