"""``--check`` for the backend families: every family the node will run (its ``backend.mode`` and
any ``.kcpps`` ``backend_mode`` override) needs its binary configured, found and executable.

Pure over the config and the catalog's models, except the ``PATH`` look-up of each binary.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from routerd.backends.errors import BackendMissing
from routerd.backends.families import text_side
from routerd.backends.process import resolve_command
from routerd.catalog.model import ModelConfig
from routerd.config.schema import BinaryConfig, Config
from routerd.families import declared

__all__ = ["check_families", "sections_needed"]


def sections_needed(mode: str, models: Iterable[ModelConfig]) -> list[str]:
    """The binary sections the ``mode`` family runs for ``models``: a family with one program runs
    it for any model; one with a program per kind runs those of the kinds its models serve (all of
    them when no model uses it yet but it is the node's own mode)."""
    facts = declared(mode)
    sections = list(facts.binary_sections)
    chosen = list(models)
    if len(sections) == 1 or not chosen:
        return sections
    serving = {"text": any(text_side(m) for m in chosen), "image": any(m.capabilities.image for m in chosen),
               "stt": any(m.capabilities.stt for m in chosen)}
    return list(dict.fromkeys(facts.sections[kind] for kind in facts.kinds if serving[kind]))


def check_families(config: Config, models: Iterable[ModelConfig]) -> tuple[list[str], list[str]]:
    """(errors, notes): an error per family binary that is unset, missing or not executable (naming
    the configs that need it); a note per binary saying what it would run."""
    by_mode: dict[str, list[ModelConfig]] = {config.backend.mode: []}
    for m in models:
        by_mode.setdefault(m.backend_mode, []).append(m)
    modes = [config.backend.mode, *sorted(set(by_mode) - {config.backend.mode})]
    errors: list[str] = []
    notes: list[str] = []
    for mode in modes:
        using = by_mode[mode]
        for section in sections_needed(mode, using):
            binary: BinaryConfig = getattr(config, section)
            setting = f"{section}.binary_path"
            files = [m.filename for m in using if section in sections_needed(mode, [m])]
            needed = ""
            if files:
                needed = " (needed by " + ", ".join(files[:3]) + (
                    f" and {len(files) - 3} more" if len(files) > 3 else "") + ")"
            if not binary.command:
                errors.append(f"{setting}: required by the {mode} backend family{needed}")
                continue
            first = binary.command[0]
            if os.path.isfile(first) and not os.access(first, os.X_OK):
                errors.append(f"{setting}: {first} is not executable{needed}")
                continue
            try:
                argv = resolve_command(binary.command, setting)
            except BackendMissing as exc:
                errors.append(f"{setting}: {exc}{needed}")
                continue
            notes.append(f"{mode}: {section} would run {' '.join(argv)}")
    return errors, notes
