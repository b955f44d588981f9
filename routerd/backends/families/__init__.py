"""The backend families as plug-ins: one module per family, and the registry of their plug-ins.

Each module here is named after the family it runs (``llama_sdcpp``, ``kobold``, ``vllm``) and holds
the whole family: its declared facts as ``DECLARED`` (a :class:`routerd.families.Declared`: name,
config sections, kinds, one process or many, routes, simulators), which :mod:`routerd.families`
finds by scanning this package, and how the family runs (command lines, readiness probes, runtime
slots, and KoboldCpp's in-process reload) as one ``PLUGIN``: its ``DECLARED`` and the ``build`` that
makes its slots for a node.  :func:`plugins` holds the plug-in of every family found, by mode;
:func:`family` finds one.  Modules without a ``DECLARED`` (``base``) are shared parts, not families.
``tests/unit/test_backend_family_contract.py`` proves each family found.

This module runs nothing at import: :mod:`routerd.families` imports it while it looks for the
families, so the plug-ins are gathered at the first :func:`plugins` call.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from functools import cache

from routerd.backends.families.base import (
    Family,
    FamilyPlugin,
    FamilyWorld,
    SlotFactory,
    slot_factory,
    text_side,
)
from routerd.families import Declared, every_family

__all__ = ["Family", "FamilyPlugin", "FamilyWorld", "SlotFactory", "family", "plugins", "slot_factory",
           "text_side"]


def _plugin(facts: Declared) -> FamilyPlugin:
    """The ``PLUGIN`` of the module declaring ``facts``."""
    module = importlib.import_module(f"{__name__}.{facts.name}")
    plugin = getattr(module, "PLUGIN", None)
    if not isinstance(plugin, FamilyPlugin) or plugin.declared is not facts:
        raise ImportError(f"{module.__name__} must define PLUGIN, a FamilyPlugin of its DECLARED family")
    return plugin


@cache
def plugins() -> Mapping[str, FamilyPlugin]:
    """Every family's plug-in by mode, in the order :func:`routerd.families.every_family` lists them."""
    return {facts.name: _plugin(facts) for facts in every_family()}


def family(mode: str) -> FamilyPlugin:
    """The plug-in of the ``mode`` family; ``KeyError`` for a mode no family declares."""
    return plugins()[mode]
