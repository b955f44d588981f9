"""What a simulated program declares: the one :class:`Family` (a ``routerd-sim`` program) its module
exposes as ``PROGRAM``, which :mod:`routerd.sim.families` finds."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import attrs
from klein import Klein

from routerd.sim.flags import Flag
from routerd.sim.runtime import SimRuntime
from routerd.sim.weights import Weights, WeightsKind

__all__ = ["Builder", "Family", "Initial", "Prepare", "Validator", "one_slot"]

Builder = Callable[[SimRuntime, argparse.Namespace], Klein]
Validator = Callable[[argparse.Namespace], "str | None"]
#: Reads the startup weights from the parsed flags: (weights, what they are called).
Initial = Callable[[argparse.Namespace], "tuple[Weights, str]"]
#: Rewrites the argument list before parsing (``vllm serve MODEL`` -> ``--model MODEL``).
Prepare = Callable[[Sequence[str]], list[str]]


def one_slot(ns: argparse.Namespace) -> int:
    return 1


@attrs.frozen
class Family:
    """One simulated program; ``flags`` must define the ``host``, ``port`` and ``model`` destinations."""

    name: str
    kind: WeightsKind | None = None
    flags: tuple[Flag, ...] = ()
    build: Builder | None = None
    slots: Callable[[argparse.Namespace], int] = one_slot
    validate: Validator | None = None
    #: Families whose weights are not one ``-m`` file of ``kind`` read them themselves.
    initial: Initial | None = None
    prepare: Prepare | None = None
    #: The program binds its port only once its startup model is in (whisper-server); the others listen at
    #: once and answer "loading" meanwhile.
    listens_when_loaded: bool = False

    @property
    def implemented(self) -> bool:
        return self.build is not None
