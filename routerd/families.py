"""The registry of backend families: what every layer may know about one without running it.

A backend family is a way of running the inference programs (the node's ``backend.mode``, or a
``.kcpps`` file's ``backend_mode``).  Each family is one module of :data:`FAMILY_PACKAGE`
(``routerd/backends/families/<name>.py``) and declares there, in its ``DECLARED``, its facts as a
:class:`Declared`: its name, the config section naming the program of each runtime kind it serves,
whether one process serves every lane, the keys its section holds besides ``binary_path`` and
``extra_args``, the routes its programs serve as the client sent them, the routes routerd translates
for them and the routes they cannot serve, and the simulator (a ``routerd-sim`` program) standing in
for each program.  The same module holds how the family runs (command lines, readiness probes, runtime
slots) as its ``PLUGIN``.

Why the registry finds the families instead of listing them: adding a family is then its module
(plus its simulator) and nothing else; no list here, in the config, the catalog or the API
description names the families.  The config, the catalog, routing and the lending core ask their
questions here (every list of modes and every choice that depends on a mode is derived from what is
found), and they all sit below the backends, so this module stays on the ground floor: it imports
nothing of routerd by an ``import`` statement.  The families are found at the first question asked,
by :mod:`pkgutil` over :data:`FAMILY_PACKAGE` and :func:`importlib.import_module` of each module,
never at import time, so no import circle forms (a lower layer asks, at run time, what a higher one
declares).  That is the layering cost: the first question imports the family modules, and with them
the backends (Twisted, the slots); a process that only parses a config pays that once.  No module may
ask at import time (a constant computed from :func:`backend_modes` in a module a family imports
would be asked while the families are being found: :func:`_found` refuses that).

Python entry points (``[project.entry-points."routerd.families"]``) were weighed: they would let a
third party ship a family, but each family would then touch ``pyproject.toml`` too (and an editable
install would need reinstalling to see it), and loading one imports its module all the same; a
package scan keeps the one-module rule and can take entry points beside it when a family ships
outside the tree.
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from collections.abc import Mapping
from typing import Literal, TypeGuard

import attrs

__all__ = [
    "DEFAULT_MODE",
    "FAMILY_PACKAGE",
    "RUNTIME_KINDS",
    "Declared",
    "RuntimeKind",
    "backend_modes",
    "binary_sections",
    "declared",
    "every_family",
    "is_declared",
    "keeps_kv_slots",
    "modes_phrase",
    "single_process",
]

# Which backend runtime serves a request: the text side (text, embeddings, multimodal, speech,
# music), image, or speech-to-text.
RuntimeKind = Literal["text", "image", "stt"]
RUNTIME_KINDS: tuple[RuntimeKind, ...] = ("text", "image", "stt")


@attrs.frozen
class Declared:
    """One backend family's facts."""

    #: The ``backend.mode`` / ``backend_mode`` value naming it.
    name: str
    #: The config section (a :class:`~routerd.config.schema.BinaryConfig`) of the program serving
    #: each runtime kind; the kinds named are the kinds the family serves.
    sections: Mapping[RuntimeKind, str]
    #: The ``routerd-sim`` program standing in for each section's program.
    simulators: Mapping[str, str]
    #: One process serves every lane: loading a config for one lane displaces the others' configs.
    single_process: bool = False
    #: Keys the family's section has besides ``binary_path`` and ``extra_args``.
    settings: tuple[str, ...] = ()
    #: Route kinds the family's programs serve on the client's own path (the model rewritten only).
    passes_through: frozenset[str] = frozenset()
    #: Route kinds the family cannot serve (answered 501 ``unsupported_backend``).
    refuses: frozenset[str] = frozenset()
    #: Route kinds of the APIs its programs do not speak that routerd translates to and from chat
    #: completions (``routerd.routing.adapters.chat_apis``; README "APIs").
    translates: frozenset[str] = frozenset()
    #: The path of its text program's token-counting route taking raw text (``{"prompt"}``, answering
    #: ``{"value"}`` or ``{"count"}``): a translated ``count_tokens`` is counted there; "" for none.
    token_count_path: str = ""
    #: Whether it serves ``sd_vid_gen`` video jobs.
    video: bool = False
    #: The context window a config states is its ``vllm.settings.max_model_length`` first (the flag
    #: the family's program runs with), ``contextsize`` only when that is absent.
    context_from_settings: bool = False
    #: Its text program saves and restores a slot's KV cache to a file (llama-server's
    #: ``--slot-save-path`` and ``POST /slots/{id}?action=save|restore``): ``models.slot_keep_count``
    #: keeps the slots of recent sessions across a swap (``routerd.backends.kv_slots``).
    kv_slots: bool = False

    @property
    def kinds(self) -> tuple[RuntimeKind, ...]:
        """The runtime kinds the family serves, in :data:`RUNTIME_KINDS` order."""
        return tuple(kind for kind in RUNTIME_KINDS if kind in self.sections)

    @property
    def binary_sections(self) -> tuple[str, ...]:
        """Its config sections, each once, in kind order."""
        return tuple(dict.fromkeys(self.sections[kind] for kind in self.kinds))


#: The package holding one module per family; each module that defines ``DECLARED`` (a
#: :class:`Declared` named after the module) is a family.
FAMILY_PACKAGE = "routerd.backends.families"
#: A node's ``backend.mode`` when its config names none; the families are listed with it first, then
#: by name.
DEFAULT_MODE = "llama_sdcpp"

# Every family by name once found (filled whole, on the first question asked of the registry).
_BY_NAME: dict[str, Declared] = {}
# Held while the families are being found: another thread asking waits; this thread asking again
# (a family module asking at import time) is refused rather than answered with half the families.
_FINDING = threading.RLock()
_finding = False


def _found() -> Mapping[str, Declared]:
    """Every family by name, found (once) by importing each module of :data:`FAMILY_PACKAGE`."""
    global _finding
    if _BY_NAME:
        return _BY_NAME
    with _FINDING:
        if _BY_NAME:
            return _BY_NAME
        if _finding:
            raise RuntimeError("a module asked for the backend families while they were being found: "
                               "a family module declares its facts itself and asks nothing at import")
        _finding = True
        try:
            _BY_NAME.update(_scan())
        finally:
            _finding = False
    return _BY_NAME


def _scan() -> dict[str, Declared]:
    """The families declared in :data:`FAMILY_PACKAGE`, :data:`DEFAULT_MODE` first, then by name."""
    package = importlib.import_module(FAMILY_PACKAGE)
    found: dict[str, Declared] = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{FAMILY_PACKAGE}.{info.name}")
        facts = getattr(module, "DECLARED", None)
        if facts is None:
            continue
        if not isinstance(facts, Declared) or facts.name != info.name:
            raise ImportError(f"{module.__name__}.DECLARED must be the Declared facts of the "
                              f"{info.name} family")
        found[facts.name] = facts
    if DEFAULT_MODE not in found:
        raise ImportError(f"no module of {FAMILY_PACKAGE} declares the default family {DEFAULT_MODE}")
    return {name: found[name] for name in sorted(found, key=lambda name: (name != DEFAULT_MODE, name))}


def every_family() -> tuple[Declared, ...]:
    """Every family, in the order the modes are listed (:data:`DEFAULT_MODE` first, then by name)."""
    return tuple(_found().values())


def backend_modes() -> tuple[str, ...]:
    """Every family's name (``backend.mode`` / ``backend_mode`` value), in :func:`every_family` order."""
    return tuple(_found())


def binary_sections() -> tuple[str, ...]:
    """Every family's config sections, each once, in :func:`every_family` order."""
    return tuple(dict.fromkeys(section for family in every_family() for section in family.binary_sections))


def declared(mode: str) -> Declared:
    """The family named ``mode``; ``KeyError`` for a name no family declares."""
    try:
        return _BY_NAME[mode]
    except KeyError:
        return _found()[mode]


def is_declared(name: object) -> TypeGuard[str]:
    """Whether ``name`` (any value a config or a request gave as a mode) names a declared family."""
    return isinstance(name, str) and name in _found()


def single_process(mode: str) -> bool:
    """Whether one process serves every lane in the ``mode`` family (false for an unknown or empty
    mode, as a node that reports none)."""
    family = (_BY_NAME or _found()).get(mode)
    return family is not None and family.single_process


def keeps_kv_slots(mode: str) -> bool:
    """Whether the ``mode`` family's text program saves and restores slots (false for an unknown mode)."""
    family = (_BY_NAME or _found()).get(mode)
    return family is not None and family.kv_slots


def modes_phrase() -> str:
    """``"kobold, llama_sdcpp, or vllm"``: the modes for an error message."""
    names = sorted(_found())
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + ", or " + names[-1]
