"""Work terms of a finished request, for cost samples (contract §8).

text (section ``llm``): ``[prompt_tokens, output_tokens]`` as the backend
reported them; image: ``[steps × width × height × count]``; stt: ``[audio
seconds]``; embeddings: ``[input tokens]``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from routerd.routing.audio import wav_duration
from routerd.routing.classify import Route
from routerd.routing.multipart import MultipartError, parse_form
from routerd.routing.plan import SECTIONS

_SIZE = re.compile(r"^\s*(\d+)\s*[xX×]\s*(\d+)\s*$")
_USAGE = re.compile(rb'"usage"\s*:\s*(\{[^{}]*\})')

DEFAULT_STEPS = 20
DEFAULT_SIDE = 512


def _positive_int(value: Any, default: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return default
    return int(value)


def image_work(kind: str, body: Mapping[str, Any]) -> tuple[float, ...]:
    """``steps × width × height × count`` of an image request."""
    steps = _positive_int(body.get("steps", body.get("sample_steps")), DEFAULT_STEPS)
    width = height = DEFAULT_SIDE
    if kind == "sdapi":
        width = _positive_int(body.get("width"), DEFAULT_SIDE)
        height = _positive_int(body.get("height"), DEFAULT_SIDE)
        count = _positive_int(body.get("batch_size"), 1) * _positive_int(body.get("n_iter"), 1)
    else:
        size = body.get("size")
        if isinstance(size, str) and (m := _SIZE.match(size)):
            width, height = int(m.group(1)), int(m.group(2))
        count = _positive_int(body.get("n"), 1)
    return (float(steps * width * height * count),)


def usage_from_json(payload: Mapping[str, Any]) -> tuple[int, int] | None:
    """(prompt, output) tokens from an OpenAI ``usage`` or llama ``/completion`` answer."""
    usage = payload.get("usage")
    if isinstance(usage, Mapping):
        prompt = usage.get("prompt_tokens")
        output = usage.get("completion_tokens", 0)
        if isinstance(prompt, int) and isinstance(output, int):
            return prompt, output
    prompt = payload.get("tokens_evaluated")
    output = payload.get("tokens_predicted")
    if isinstance(prompt, int) and isinstance(output, int):
        return prompt, output
    return None


def usage_from_tail(tail: bytes) -> tuple[int, int] | None:
    """The last ``usage`` object in the tail of an SSE stream, if any."""
    found = None
    for match in _USAGE.finditer(tail):
        try:
            data = json.loads(match.group(1))
        except ValueError:
            continue
        if isinstance(data, dict):
            found = usage_from_json({"usage": data})
    if found is None:
        # llama-server's native /completion stream ends with token counts.
        for line in reversed(tail.split(b"\n")):
            if line.startswith(b"data: ") and b"tokens_predicted" in line:
                try:
                    data = json.loads(line[6:])
                except ValueError:
                    continue
                if isinstance(data, dict):
                    return usage_from_json(data)
    return found


def request_work(route: Route, parsed: Mapping[str, Any] | None, body: bytes,
                  content_type: str) -> tuple[float, ...]:
    section = SECTIONS[route.kind]
    if section == "image" and parsed is not None:
        return image_work("sdapi" if route.family == "sdapi" else "openai", parsed)
    if section == "stt":
        return (_audio_seconds(body, content_type),)
    return ()


def _audio_seconds(body: bytes, content_type: str) -> float:
    """Seconds of audio in the uploaded WAV (0 when it is not a readable WAV)."""
    try:
        parts = parse_form(body, content_type)
    except MultipartError:
        return 0.0
    for part in parts:
        if part.name == "file":
            try:
                return wav_duration(part.data)
            except ValueError:
                return 0.0
    return 0.0
