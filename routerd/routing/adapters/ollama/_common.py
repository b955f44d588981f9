"""Helpers shared by the Ollama adapter's modules.

The request mode, timestamps and nanosecond durations, and the readers of an
OpenAI answer (first choice, text, token counts, llama-server ``timings``,
tool-call arguments) that both :mod:`.responses` and :mod:`.streaming` use.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal

from routerd.jsonvalues import json_int
from routerd.routing.adapters import JSONObject

Mode = Literal["chat", "generate"]


def iso_utc(ts: float) -> str:
    """Epoch seconds -> the RFC 3339 UTC form Ollama uses in ``created_at``."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _ns(seconds: float) -> int:
    return max(0, int(round(seconds * 1e9)))


def _done_reason(finish_reason: object) -> str:
    return "length" if finish_reason == "length" else "stop"


def _first_choice(resp: Mapping[str, Any]) -> Mapping[str, Any]:
    choices = resp.get("choices")
    if isinstance(choices, list):
        for choice in choices:
            if isinstance(choice, Mapping) and choice.get("index", 0) == 0:
                return choice
    return {}


def _text(value: object) -> str:
    """OpenAI message content (string, null or a list of parts) -> text."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(p["text"] for p in value if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    return ""


def _counts(usage: object, timings: object) -> tuple[int, int]:
    """(prompt tokens, generated tokens) from ``usage``, else llama-server ``timings``."""
    prompt = completion = None
    if isinstance(usage, Mapping):
        prompt = json_int(usage.get("prompt_tokens"))
        completion = json_int(usage.get("completion_tokens"))
    if isinstance(timings, Mapping):
        if prompt is None:
            prompt = json_int(timings.get("prompt_n"))
        if completion is None:
            completion = json_int(timings.get("predicted_n"))
    return prompt or 0, completion or 0


def _timing_durations(timings: object) -> tuple[int, int] | None:
    """(prompt, eval) nanoseconds from llama-server ``timings``, if it sent them."""
    if not isinstance(timings, Mapping):
        return None
    prompt_ms = timings.get("prompt_ms")
    predicted_ms = timings.get("predicted_ms")
    if not (isinstance(prompt_ms, int | float) and isinstance(predicted_ms, int | float)):
        return None
    if isinstance(prompt_ms, bool) or isinstance(predicted_ms, bool):
        return None
    return _ns(prompt_ms / 1000), _ns(predicted_ms / 1000)


def _arguments(raw: object) -> JSONObject:
    """OpenAI tool-call arguments (a JSON string) -> Ollama's argument object."""
    if isinstance(raw, Mapping):
        return dict(raw)
    if isinstance(raw, str) and raw.strip():
        try:
            parsed = json.loads(raw)
        except ValueError:
            return {}
        if isinstance(parsed, dict):
            return parsed
    return {}
