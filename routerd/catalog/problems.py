"""What ``routerd check`` says of one model config: its weight files (exist, readable, of the kind
their field takes: :mod:`routerd.catalog.weight_kinds`) and keys that look like a misspelling of a
key routerd reads.  ``routerd.checking`` applies these to every ``.kcpps`` of a folder; Cook's preview
(``routerd.assets.cook``) to the one config it builds.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping
from typing import Any

from routerd.catalog.kcpps import PATH_KEYS
from routerd.catalog.model import ModelConfig
from routerd.catalog.weight_kinds import kind_problem

#: Every ``.kcpps`` key routerd reads (contract §3).  koboldcpp writes many more, so an unknown key is
#: only reported when it is a near miss of one of these.
KCPPS_KEYS: tuple[str, ...] = tuple(sorted(PATH_KEYS | {
    "backend_mode", "contextsize", "parallel", "vllm", "extra_args", "embeddings", "reranking"}))
#: How close an unknown key must be to a read key to count as a misspelling of it.
NEAR_MISS = 0.8


def did_you_mean(key: str, known: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The known name closest to ``key``, if any is close enough."""
    matches = difflib.get_close_matches(key, list(known), n=1, cutoff=cutoff)
    return matches[0] if matches else None


def weight_problems(model: ModelConfig) -> list[str]:
    """One line per weight file of ``model`` that is missing, unreadable or of a kind its field refuses
    (image weights given as the text ``model``)."""
    out = []
    for field, weights in model.weight_files().items():
        if not os.path.isfile(weights):
            out.append(f"{model.filename}: {field} {weights} does not exist")
        elif not os.access(weights, os.R_OK):
            out.append(f"{model.filename}: {field} {weights} is not readable")
        else:
            problem = kind_problem(model.filename, field, weights)
            if problem is not None:
                out.append(problem)
    return out


def near_miss_keys(filename: str, raw: Mapping[str, Any]) -> list[str]:
    """One line per key of ``raw`` that is not read but is close to one that is (and absent)."""
    out = []
    for key in raw:
        if key in KCPPS_KEYS:
            continue
        guess = did_you_mean(key, KCPPS_KEYS, NEAR_MISS)
        if guess is not None and guess not in raw:
            out.append(f"{filename}: unknown key {key!r} (did you mean {guess!r}?)")
    return out


__all__ = ["KCPPS_KEYS", "NEAR_MISS", "did_you_mean", "near_miss_keys", "weight_problems"]
