"""The vocabulary of replica choice (``routing.replica_choice``): the modes and the session
key sources, shared by the config, the model configs and the master's choice."""

from __future__ import annotations

from typing import Literal, get_args

#: How a master picks among the replicas of one public ID (``rotation``: the spec's default).
Mode = Literal["rotation", "least_loaded", "affinity"]
MODES: tuple[Mode, ...] = get_args(Mode)

#: Where ``affinity`` reads a request's session key: ``auto`` tries the ``X-Session-Id`` header, then
#: the OpenAI ``user`` field, then the prompt; each other value reads only that source.
KeySource = Literal["auto", "header", "user", "prompt"]
KEY_SOURCES: tuple[KeySource, ...] = get_args(KeySource)

__all__ = ["KEY_SOURCES", "MODES", "KeySource", "Mode"]
