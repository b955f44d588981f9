"""The backend families as plug-ins: one module per family, and the registry of them all.

Each module (``llama_sdcpp``, ``kobold``, ``vllm``) holds how its family runs (command lines,
readiness probes, runtime slots, KoboldCpp's in-process reload) and exposes one ``PLUGIN``: its
declared facts from :mod:`routerd.families` (name, config sections, kinds, one process or many,
routes, simulators) and the ``build`` that makes its slots for a node.  :data:`FAMILIES` registers
every plug-in; :func:`family` finds one by mode.  The registry must cover every declared family, and
:mod:`tests.unit.test_backend_family_contract` proves each one.
"""

from __future__ import annotations

from collections.abc import Mapping

from routerd.backends.families import kobold, llama_sdcpp, vllm
from routerd.backends.families.base import (
    Family,
    FamilyPlugin,
    FamilyWorld,
    SlotFactory,
    slot_factory,
    text_side,
)
from routerd.families import BACKEND_MODES

__all__ = ["FAMILIES", "Family", "FamilyPlugin", "FamilyWorld", "SlotFactory", "family", "slot_factory",
           "text_side"]

#: Every registered family by mode, in the order :data:`routerd.families.DECLARED` lists them.
FAMILIES: Mapping[str, FamilyPlugin] = {
    plugin.name: plugin for plugin in sorted((llama_sdcpp.PLUGIN, kobold.PLUGIN, vllm.PLUGIN),
                                             key=lambda p: BACKEND_MODES.index(p.name))
}
if tuple(FAMILIES) != BACKEND_MODES:
    raise ImportError(f"backend families declared {BACKEND_MODES} but registered {tuple(FAMILIES)}")


def family(mode: str) -> FamilyPlugin:
    """The plug-in of the ``mode`` family; ``KeyError`` for a mode no family registers."""
    return FAMILIES[mode]
