"""What every backend family module provides, and what they share.

A family module declares its facts as ``DECLARED`` (a :class:`routerd.families.Declared`: name,
sections, kinds, one process or many, routes, simulators), which :mod:`routerd.families` finds, and
one :class:`FamilyPlugin`: those facts and ``build``, which makes the family's :class:`Family` (its
runtime slots, their command lines and readiness probes) for a node.
:func:`slot_factory` builds the slots every family's ``build`` asks for, sharing the node's clock,
process launcher, probes and timeouts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs
from twisted.internet.defer import Deferred

from routerd.backends.kv_slots import SlotKeeper
from routerd.backends.process import ProcessLauncher, Scheduler, resolve_command
from routerd.backends.readiness import HTTPGetter, Probe
from routerd.backends.slot import LoadEvent, RuntimeSlot
from routerd.catalog.model import ModelConfig, RuntimeKind
from routerd.config.schema import BinaryConfig, Config
from routerd.families import Declared

__all__ = ["Family", "FamilyPlugin", "FamilyWorld", "SlotFactory", "command", "slot_factory", "text_side"]

#: ``factory(kind, name, argv_for, probe, **slot_options) -> RuntimeSlot``.
SlotFactory = Callable[..., RuntimeSlot]


def text_side(model: ModelConfig) -> bool:
    """Whether a config has anything the text side serves (text, embeddings, multimodal, speech,
    music)."""
    caps = model.capabilities
    return caps.llm or caps.embeddings or caps.multimodal or caps.tts or caps.music


def command(binary: BinaryConfig, setting: str) -> list[str]:
    """The argv prefix of a family's program (resolved at every load, so a binary installed after
    start-up is found)."""
    return resolve_command(binary.command, setting)


class Family:
    """One family's slots on one node (created up front; no process runs until a load needs one)."""

    name = ""

    def slots(self) -> list[RuntimeSlot]:
        raise NotImplementedError

    def slot_for(self, kind: RuntimeKind, model: ModelConfig) -> RuntimeSlot | None:
        """The slot a ``kind`` request for ``model`` runs in, ``None`` if the family cannot serve it."""
        raise NotImplementedError

    def slots_for_kind(self, kind: RuntimeKind) -> list[RuntimeSlot]:
        """The slots an unload of ``kind`` stops."""
        raise NotImplementedError

    def lane_probe(self, kind: RuntimeKind, model: ModelConfig) -> Probe:
        """The readiness probe of the ``kind`` lane while ``model`` is loaded (reference §4.2)."""
        raise NotImplementedError

    def boot(self) -> None:
        """Anything the family starts with the router (KoboldCpp ``--nomodel``)."""


@attrs.frozen
class FamilyWorld:
    """What a family may need from the node besides its config and the slot factory."""

    clock: Scheduler
    http: Any
    probe_timeout_s: float
    #: The node's kept KV slots (``models.slot_keep_count``), None when it keeps none.
    kv_slots: SlotKeeper | None = None


@attrs.frozen
class FamilyPlugin:
    """One registered backend family: its declared facts and how a node builds it."""

    declared: Declared
    build: Callable[[Config, SlotFactory, FamilyWorld], Family]

    @property
    def name(self) -> str:
        return self.declared.name


def slot_factory(clock: Scheduler, launcher: ProcessLauncher, http: HTTPGetter,
                 port_allocator: Callable[[], int], on_load: Callable[[LoadEvent], None] | None,
                 env: Mapping[str, str] | None, probe_timeout_s: float, **options: Any) -> SlotFactory:
    """A factory building slots that share the node's clock, launcher, probes and timeouts."""

    def make(kind: RuntimeKind, name: str, argv_for: Callable[[ModelConfig, int], list[str]], probe: Probe,
             **more: Any) -> RuntimeSlot:
        def probe_base(base_url: str) -> Deferred[bool]:
            return probe(http, base_url, probe_timeout_s)

        return RuntimeSlot(kind, clock=clock, launcher=launcher, argv_for=argv_for, probe=probe_base,
                           port_allocator=port_allocator, on_load=on_load, name=name, env=env,
                           **options, **more)

    return make
