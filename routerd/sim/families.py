"""The programs ``routerd-sim`` can stand in for, found in the simulator's own modules.

Each module of :mod:`routerd.sim` that simulates a program exposes its :class:`Family` as ``PROGRAM``
(its flags and a ``build(runtime, options)``); this registry finds every one the first time it is
asked, so adding a simulator is its module only.  A backend family names the programs standing in
for its own in its declaration (:attr:`routerd.families.Declared.simulators`), and
``tests/unit/test_backend_family_contract.py`` checks each is found here.  A ``PROGRAM`` without
``build`` is accepted but not runnable yet.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from functools import cache

import routerd.sim
from routerd.sim.program import Family

__all__ = ["Family", "get_family", "programs"]

#: Modules of the package that run or drive a program rather than simulate one.
_NOT_PROGRAMS = frozenset({"__main__", "cli", "families", "harness"})


@cache
def programs() -> Mapping[str, Family]:
    """Every simulated program by name, from each module of :mod:`routerd.sim` that has a ``PROGRAM``."""
    found: dict[str, Family] = {}
    for info in pkgutil.iter_modules(routerd.sim.__path__):
        if info.name in _NOT_PROGRAMS:
            continue
        program = getattr(importlib.import_module(f"routerd.sim.{info.name}"), "PROGRAM", None)
        if program is None:
            continue
        if not isinstance(program, Family) or program.name in found:
            raise ImportError(f"routerd.sim.{info.name}.PROGRAM must be a Family of a program of its own")
        found[program.name] = program
    return found


def get_family(name: str) -> Family | None:
    return programs().get(name)
