"""``--check``: everything a node would refuse at start, found before it starts.

The YAML is validated by :func:`routerd.config.load.load_config` (unknown keys come with a
did-you-mean); then every ``.kcpps`` of ``models.config_dir`` is parsed and validated (JSON, types,
a likely misspelt key, weight files that exist), and every backend program a model needs is looked up
(exists, executable).  Each problem is one line naming the file or key, so an operator fixes them all
at once.
"""

from __future__ import annotations

import difflib
import json
import os
import sys
from collections.abc import Iterable

from routerd.backends.check import check_families
from routerd.catalog.catalog import Catalog, CatalogError
from routerd.catalog.kcpps import PATH_KEYS
from routerd.catalog.model import ModelConfig
from routerd.config.load import ConfigError, load_config

#: Every ``.kcpps`` key routerd reads (contract §3).  koboldcpp writes many more, so an unknown key is
#: only reported when it is a near miss of one of these.
KCPPS_KEYS: tuple[str, ...] = tuple(sorted(PATH_KEYS | {
    "backend_mode", "contextsize", "parallel", "vllm", "extra_args", "embeddings"}))
#: How close an unknown key must be to a read key to count as a misspelling of it.
NEAR_MISS = 0.8


def did_you_mean(key: str, known: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The known name closest to ``key``, if any is close enough."""
    matches = difflib.get_close_matches(key, list(known), n=1, cutoff=cutoff)
    return matches[0] if matches else None


def check_config(path: str | None) -> tuple[bool, list[str]]:
    """``(ok, errors)`` for the config at ``path`` (the embedded default when ``None``)."""
    try:
        config = load_config(path)
    except ConfigError as exc:
        return False, list(exc.errors)
    errors: list[str] = []
    try:
        catalog = Catalog.scan(config.models.config_dir, config.backend.mode)
    except CatalogError as exc:
        return False, [f"models.config_dir: {exc}"]
    for bad in catalog.invalid:
        errors.append(f"{bad.filename}: {bad.reason}")
    for model in catalog.models:
        errors.extend(_model_errors(model))
    errors.extend(_near_misses(catalog.config_dir))
    family_errors, notes = check_families(config, catalog.models)
    errors.extend(family_errors)
    for note in notes:  # which binary each family would run (stdout stays "ok" or the errors)
        print(note, file=sys.stderr)
    if config.models.startup_model and config.models.startup_model not in {
            m.local_id for m in catalog.models}:
        errors.append(f"models.startup_model: no valid config {config.models.startup_model}.kcpps "
                      f"in {catalog.config_dir}")
    return not errors, sorted(set(errors), key=errors.index)


def _model_errors(model: ModelConfig) -> list[str]:
    out = []
    for field, weights in model.weight_files().items():
        if not os.path.isfile(weights):
            out.append(f"{model.filename}: {field} {weights} does not exist")
        elif not os.access(weights, os.R_OK):
            out.append(f"{model.filename}: {field} {weights} is not readable")
    return out


def _near_misses(config_dir: str) -> list[str]:
    out = []
    for name in sorted(os.listdir(config_dir)):
        if not name.endswith(".kcpps"):
            continue
        try:
            with open(os.path.join(config_dir, name), encoding="utf-8-sig") as handle:
                raw = json.load(handle)
        except (OSError, ValueError):
            continue  # reported by the catalog
        if not isinstance(raw, dict):
            continue
        for key in raw:
            if key in KCPPS_KEYS:
                continue
            guess = did_you_mean(key, KCPPS_KEYS, NEAR_MISS)
            if guess is not None and guess not in raw:
                out.append(f"{name}: unknown key {key!r} (did you mean {guess!r}?)")
    return out


