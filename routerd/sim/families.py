"""The backend families ``routerd-sim`` can stand in for.

Adding one means writing a module with its flags and a ``build_app(runtime, options)`` and
registering a :class:`Family` here; families without ``build`` are accepted but not runnable yet.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import attrs
from klein import Klein

from routerd.sim import kobold, llama, sd, vllm, whisper
from routerd.sim.flags import Flag
from routerd.sim.runtime import SimRuntime
from routerd.sim.weights import Weights, WeightsKind

__all__ = ["FAMILIES", "Family", "get_family"]

Builder = Callable[[SimRuntime, argparse.Namespace], Klein]
Validator = Callable[[argparse.Namespace], "str | None"]
#: Reads the startup weights from the parsed flags: (weights, what they are called).
Initial = Callable[[argparse.Namespace], "tuple[Weights, str]"]
#: Rewrites the argument list before parsing (``vllm serve MODEL`` -> ``--model MODEL``).
Prepare = Callable[[Sequence[str]], list[str]]


def _one_slot(ns: argparse.Namespace) -> int:
    return 1


@attrs.frozen
class Family:
    """``flags`` must define the ``host``, ``port`` and ``model`` destinations."""

    name: str
    kind: WeightsKind | None = None
    flags: tuple[Flag, ...] = ()
    build: Builder | None = None
    slots: Callable[[argparse.Namespace], int] = _one_slot
    validate: Validator | None = None
    #: Families whose weights are not one ``-m`` file of ``kind`` read them themselves.
    initial: Initial | None = None
    prepare: Prepare | None = None

    @property
    def implemented(self) -> bool:
        return self.build is not None


def _llama(runtime: SimRuntime, ns: argparse.Namespace) -> Klein:
    return llama.build_app(runtime, llama.options_from_args(ns))


def _sd(runtime: SimRuntime, ns: argparse.Namespace) -> Klein:
    return sd.build_app(runtime, sd.options_from_args(ns))


def _whisper(runtime: SimRuntime, ns: argparse.Namespace) -> Klein:
    return whisper.build_app(runtime, whisper.options_from_args(ns))


def _kobold(runtime: SimRuntime, ns: argparse.Namespace) -> Klein:
    return kobold.build_app(runtime, ns)


def _vllm(runtime: SimRuntime, ns: argparse.Namespace) -> Klein:
    return vllm.build_app(runtime, ns)


def _llama_slots(ns: argparse.Namespace) -> int:
    return int(ns.parallel)


FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (
        Family("llama-server", "text", llama.FLAGS, _llama, _llama_slots, llama.validate_args),
        Family("sd-server", "image", sd.FLAGS, _sd, _one_slot, sd.validate_args),
        Family("whisper-server", "stt", whisper.FLAGS, _whisper),
        Family("koboldcpp", "text", kobold.FLAGS, _kobold, _one_slot, kobold.validate_args,
               kobold.initial_weights),
        Family("vllm", "text", vllm.FLAGS, _vllm, vllm.slots, vllm.validate_args, vllm.initial_weights,
               vllm.prepare_argv),
    )
}


def get_family(name: str) -> Family | None:
    return FAMILIES.get(name)
