"""What every layer may know about a backend family without running it: its declared facts.

A backend family is a way of running the inference programs (the node's ``backend.mode``, or a
``.kcpps`` file's ``backend_mode``).  Each one declares here its name, the config section naming the
program of each runtime kind it serves, whether one process serves every lane, the keys its section
holds besides ``binary_path`` and ``extra_args``, the routes its programs serve as the client sent
them and the routes they cannot serve, and the simulator (a ``routerd-sim`` program) standing in for
each program.  How a family runs (command lines, readiness probes, runtime slots) is its module in
:mod:`routerd.backends.families`, which carries its declaration from here.

The declarations sit on the ground floor, importing nothing of routerd, because the config, the
catalog, routing and the lending core read them and all sit below the backends; every list of modes
and every choice that depends on a mode is derived from :data:`DECLARED`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import attrs

__all__ = [
    "BACKEND_MODES",
    "DECLARED",
    "RUNTIME_KINDS",
    "BINARY_SECTIONS",
    "DEFAULT_MODE",
    "Declared",
    "RuntimeKind",
    "declared",
    "is_declared",
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
    #: Whether it serves ``sd_vid_gen`` video jobs.
    video: bool = False
    #: The context window a config states is its ``vllm.settings.max_model_length`` first (the flag
    #: the family's program runs with), ``contextsize`` only when that is absent.
    context_from_settings: bool = False

    @property
    def kinds(self) -> tuple[RuntimeKind, ...]:
        """The runtime kinds the family serves, in :data:`RUNTIME_KINDS` order."""
        return tuple(kind for kind in RUNTIME_KINDS if kind in self.sections)

    @property
    def binary_sections(self) -> tuple[str, ...]:
        """Its config sections, each once, in kind order."""
        return tuple(dict.fromkeys(self.sections[kind] for kind in self.kinds))


_KOBOLD_ROUTES = frozenset({"kobold_tts", "kobold_generate", "kobold_generate_stream", "kobold_transcribe",
                            "kobold_music"})

#: Every family, in the order the modes are listed (the first is the default mode).
DECLARED: tuple[Declared, ...] = (
    Declared(
        "llama_sdcpp",
        sections={"text": "llama", "image": "sdcpp", "stt": "whispercpp"},
        simulators={"llama": "llama-server", "sdcpp": "sd-server", "whispercpp": "whisper-server"},
        refuses=frozenset({"kobold_generate_stream"}),
        video=True,
    ),
    Declared(
        "kobold",
        sections={"text": "kobold", "image": "kobold", "stt": "kobold"},
        simulators={"kobold": "koboldcpp"},
        single_process=True,
        settings=("no_model", "reload_timeout"),
        passes_through=_KOBOLD_ROUTES | {"tts", "stt"},
    ),
    Declared(
        "vllm",
        sections={"text": "vllm", "stt": "vllm"},
        simulators={"vllm": "vllm"},
        passes_through=frozenset({"tts", "stt"}),
        refuses=_KOBOLD_ROUTES | {"llama_completion", "image", "sd_txt2img", "sd_img2img"},
        context_from_settings=True,
    ),
)

_BY_NAME: Mapping[str, Declared] = {family.name: family for family in DECLARED}
BACKEND_MODES: tuple[str, ...] = tuple(_BY_NAME)
#: A node's ``backend.mode`` when its config names none: the first family declared.
DEFAULT_MODE = BACKEND_MODES[0]
#: Every family's config sections, each once.
BINARY_SECTIONS: tuple[str, ...] = tuple(dict.fromkeys(s for f in DECLARED for s in f.binary_sections))


def declared(mode: str) -> Declared:
    """The family named ``mode``; ``KeyError`` for a name no family declares."""
    return _BY_NAME[mode]


def is_declared(name: object) -> bool:
    """Whether ``name`` (any value a config or a request gave as a mode) names a declared family."""
    return isinstance(name, str) and name in _BY_NAME


def single_process(mode: str) -> bool:
    """Whether one process serves every lane in the ``mode`` family (false for an unknown or empty
    mode, as a node that reports none)."""
    family = _BY_NAME.get(mode)
    return family is not None and family.single_process


def modes_phrase() -> str:
    """``"kobold, llama_sdcpp, or vllm"``: the modes for an error message."""
    names = sorted(BACKEND_MODES)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + ", or " + names[-1]
