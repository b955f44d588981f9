"""The backend families as plug-ins: one module per family, and the registry of them all.

Each module here is named after the family it runs (``llama_sdcpp``, ``kobold``, ``vllm``) and holds
how that family runs: command lines, readiness probes, runtime slots (and KoboldCpp's in-process
reload).  It exposes one ``PLUGIN``: the family's declared facts from :mod:`routerd.families` (name,
config sections, kinds, one process or many, routes, simulators) and the ``build`` that makes its
slots for a node.  :data:`FAMILIES` holds the plug-in of every declared family, found by the
family's name, so the declarations stay the one list of families; :func:`family` finds one by
mode.  ``tests/unit/test_backend_family_contract.py`` proves each registered family.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from routerd.backends.families.base import (
    Family,
    FamilyPlugin,
    FamilyWorld,
    SlotFactory,
    slot_factory,
    text_side,
)
from routerd.families import DECLARED, Declared

__all__ = ["FAMILIES", "Family", "FamilyPlugin", "FamilyWorld", "SlotFactory", "family", "slot_factory",
           "text_side"]


def _plugin(facts: Declared) -> FamilyPlugin:
    """The ``PLUGIN`` of the module named after a declared family."""
    module = importlib.import_module(f"{__name__}.{facts.name}")
    plugin = getattr(module, "PLUGIN", None)
    if not isinstance(plugin, FamilyPlugin) or plugin.declared is not facts:
        raise ImportError(f"{module.__name__} must define PLUGIN, a FamilyPlugin of the {facts.name} family")
    return plugin


#: Every declared family's plug-in by mode, in the order :data:`routerd.families.DECLARED` lists them.
FAMILIES: Mapping[str, FamilyPlugin] = {facts.name: _plugin(facts) for facts in DECLARED}


def family(mode: str) -> FamilyPlugin:
    """The plug-in of the ``mode`` family; ``KeyError`` for a mode no family declares."""
    return FAMILIES[mode]
