"""The session key ``routing.replica_choice: affinity`` keeps a request's replica by.

``routing.affinity_key`` chooses the source:

* ``header``: the ``X-Session-Id`` header;
* ``user``: the OpenAI ``user`` field of the JSON body (a string);
* ``prompt``: the system prompt and the first user turn of a chat body (``messages``: every
  ``system``/``developer`` message before the first ``user`` one, and that ``user`` message).  Each
  later turn of one chat resends them unchanged, so the key is the same for the whole chat;
* ``auto`` (the default): the header, else ``user``, else the prompt.

A request without the source has no key (the choice then falls back to ``least_loaded``).  The key
is only ever hashed (:func:`routerd.registry.replica_choice.key_hash`); the raw key and the prompt
never reach a log, a metric or the decision log.  Pure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from routerd.replica_modes import KeySource
from routerd.routing.call import Call

__all__ = ["session_key"]

_SYSTEM_ROLES = frozenset({"system", "developer"})


def session_key(call: Call, source: KeySource) -> str | None:
    """The raw session key of ``call`` from ``source`` (prefixed by its source, so a header and a
    ``user`` field with the same text are different keys), or None."""
    if source in ("auto", "header") and call.session:
        return "header:" + call.session
    if source in ("auto", "user"):
        user = call.parsed.get("user") if call.parsed is not None else None
        if isinstance(user, str) and user:
            return "user:" + user
    if source in ("auto", "prompt"):
        opening = _opening(call.parsed)
        if opening is not None:
            return "prompt:" + opening
    return None


def _opening(parsed: Mapping[str, Any] | None) -> str | None:
    """The system messages and first user message of a chat body, as canonical JSON, or None."""
    if parsed is None:
        return None
    messages = parsed.get("messages")
    if not isinstance(messages, list):
        return None
    opening: list[Any] = []
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        role = message.get("role")
        if role in _SYSTEM_ROLES:
            opening.append([role, message.get("content")])
        elif role == "user":
            opening.append([role, message.get("content")])
            return json.dumps(opening, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return None
