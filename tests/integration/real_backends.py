"""What every test of the real-backend tier shares: the real servers, the tiny models, a node config on them.

The tier runs routerd in front of llama.cpp's ``llama-server`` and whisper.cpp's ``whisper-server`` (built by
``python -m tests.real_servers install``, which the README's test command runs first) serving models the tests
generate (:mod:`tests.support_models`).  Its tests carry ``pytest.mark.real`` (and ``slow``); they skip when
the servers are not installed, and fail instead when ``ROUTERD_REAL_SERVERS_REQUIRED=1`` (the README's test
command sets it, so CI never passes by skipping them).

Every ``llama-server`` and ``whisper-server`` runs with ``-t 1``: with other jobs on two cores, two spinning
threads made llama-server's speed swing by a factor of 30 (``reference/real-backends.md``).  Assert on text,
counts and states, never on speed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

from routerd.config.load import parse_config
from routerd.config.schema import Config
from tests import real_servers
from tests.integration.nodes import SIM
from tests.support_models import (
    LLAMA_ANSWER,
    WHISPER_ANSWER,
    write_tiny_llama,
    write_tiny_whisper,
    write_tone_wav,
    write_unloadable_gguf,
)

__all__ = ["LLAMA_ANSWER", "WHISPER_ANSWER", "RealServers", "TinyModels", "real_node_config",
           "real_servers_or_skip", "tiny_models_in", "write_real_models"]

REQUIRED_ENV = "ROUTERD_REAL_SERVERS_REQUIRED"
#: The llama-server flags every test node adds (see the module's docstring).
LLAMA_FLAGS: tuple[str, ...] = ("-t", "1")
#: The whisper-server flags every test node adds: one thread, for the same reason (with its default
#: two, one transcription of the tone took 3.2 s instead of 0.2 s on the loaded machine).
WHISPER_FLAGS: tuple[str, ...] = ("-t", "1")


@attrs.frozen
class RealServers:
    llama: str
    whisper: str


def real_servers_or_skip() -> RealServers:
    """The installed servers; skip the test when they are missing (fail when ``REQUIRED_ENV`` is 1)."""
    try:
        found = real_servers.paths(real_servers.cache_root())
    except real_servers.InstallError as missing:
        if os.environ.get(REQUIRED_ENV) == "1":
            pytest.fail(f"the real servers are not installed:\n{missing}")
        pytest.skip(f"the real servers are not installed (python -m tests.real_servers install):\n{missing}")
    return RealServers(found["llama-server"], found["whisper-server"])


@attrs.frozen
class TinyModels:
    """The generated weights, each a path (str, as model configs take them)."""

    tiny: str  # answers LLAMA_ANSWER; 0.5 MB
    slow: str  # the same answer with ~210x the weights per token (55 MB, f16)
    embed: str  # the tiny model with mean pooling (an embedding model's GGUF)
    truncated: str  # llama.cpp refuses it: tensor data cut off
    wrong_architecture: str  # llama.cpp refuses it: unknown architecture
    whisper: str  # transcribes any audio of a second or more to WHISPER_ANSWER
    tone: str  # two seconds of a 16 kHz sine (a WAV file)
    tools: str  # a template that knows tools; answers every chat with a get_weather call (tool_calls)


def tiny_models_in(folder: Path) -> TinyModels:
    """Write every tiny model into ``folder`` (well under a second, the slow one included)."""
    folder.mkdir(parents=True, exist_ok=True)
    return TinyModels(
        tiny=str(write_tiny_llama(folder / "tiny.gguf")),
        slow=str(write_tiny_llama(folder / "slow.gguf", slow=True, f16=True)),
        embed=str(write_tiny_llama(folder / "embed.gguf", mean_pooling=True)),
        truncated=str(write_unloadable_gguf(folder / "truncated.gguf", "truncated")),
        wrong_architecture=str(write_unloadable_gguf(folder / "wrong-arch.gguf", "wrong_architecture")),
        whisper=str(write_tiny_whisper(folder / "tiny-whisper.bin")),
        tone=str(write_tone_wav(folder / "tone.wav")),
        tools=str(write_tiny_llama(folder / "tools.gguf", tools=True)),
    )


def write_real_models(root: Path, models: Mapping[str, Mapping[str, Any]]) -> Path:
    """Write each model config as ``<root>/models/<id>.kcpps`` (KoboldCpp's JSON keys: ``model``,
    ``embeddingsmodel``, ``whispermodel``, ``contextsize``, ``parallel``, ...) and return the folder."""
    folder = root / "models"
    folder.mkdir(parents=True, exist_ok=True)
    for model_id, kcpps in models.items():
        (folder / f"{model_id}.kcpps").write_text(json.dumps(kcpps))
    return folder


def real_node_config(root: Path, servers: RealServers, models: Mapping[str, Mapping[str, Any]],
                     extra: Mapping[str, Mapping[str, Any]] | None = None,
                     llama_flags: Sequence[str] = LLAMA_FLAGS,
                     whisper_flags: Sequence[str] = WHISPER_FLAGS) -> Config:
    """A node config whose text and speech runtimes are the real servers (images stay on the simulator:
    sd-server has no model small enough to generate), with ``models`` written under ``root``."""
    write_real_models(root, models)
    data: dict[str, Any] = {
        "server": {"bind": "127.0.0.1:0"},
        "models": {"config_dir": str(root / "models")},
        "backend": {"mode": "llama_sdcpp"},
        "llama": {"binary_path": [servers.llama, *llama_flags]},
        "sdcpp": {"binary_path": [*SIM, "sd-server"]},
        "whispercpp": {"binary_path": [servers.whisper, *whisper_flags]},
        "cluster": {"store_dir": str(root / "store")},
    }
    for section, values in (extra or {}).items():
        data[section] = {**data.get(section, {}), **values}
    return parse_config(data, base_dir=str(root), env=dict(os.environ))
