"""``--check``: everything a node would refuse at start, found before it starts.

The YAML is validated by :func:`routerd.config.load.load_config` (unknown keys come with a
did-you-mean); then every ``.kcpps`` of ``models.config_dir`` is parsed and validated (JSON, types,
a likely misspelt key, weight files that exist), and every backend program a model needs is looked up
(exists, executable).  Each problem is one line naming the file or key, so an operator fixes them all
at once.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable

import attrs

from routerd.backends.check import check_families
from routerd.catalog.backend_args import unsafe_arg
from routerd.catalog.catalog import Catalog, CatalogError
from routerd.catalog.model import ModelConfig
from routerd.catalog.problems import KCPPS_KEYS, NEAR_MISS, did_you_mean, near_miss_keys, weight_problems
from routerd.config.load import ConfigError, load_config
from routerd.config.schema import BinaryConfig, Config


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
        errors.extend(weight_problems(model))
    errors.extend(_near_misses(catalog.config_dir))
    family_errors, notes = check_families(config, catalog.models)
    errors.extend(family_errors)
    for note in notes + _arg_warnings(config, catalog.models):  # stdout stays "ok" or the errors
        print(note, file=sys.stderr)
    if config.models.startup_model and config.models.startup_model not in {
            m.local_id for m in catalog.models}:
        errors.append(f"models.startup_model: no valid config {config.models.startup_model}.kcpps "
                      f"in {catalog.config_dir}")
    return not errors, sorted(set(errors), key=errors.index)


def _arg_warnings(config: Config, models: Iterable[ModelConfig]) -> list[str]:
    """A warning per hand-written ``extra_args`` that Cook would refuse over HTTP (a flag routerd
    sets itself, a path): the operator may mean it, but it can undo routerd's own settings."""
    out = []
    for field in attrs.fields(type(config)):  # every backend family's binary section
        section = getattr(config, field.name)
        problem = unsafe_arg(section.extra_args) if isinstance(section, BinaryConfig) else None
        if problem is not None:
            out.append(f"warning: {field.name}.extra_args: {problem}")
    for model in models:
        problem = unsafe_arg(model.extra_args)
        if problem is not None:
            out.append(f"warning: {model.filename}: {problem}")
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
        if isinstance(raw, dict):
            out.extend(near_miss_keys(name, raw))
    return out


__all__ = ["KCPPS_KEYS", "NEAR_MISS", "check_config", "did_you_mean"]
