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

from routerd.routing.audio import audio_duration
from routerd.routing.body import json_loads_text
from routerd.routing.classify import Route
from routerd.routing.jobs import video_work
from routerd.routing.multipart import MultipartError, parse_form
from routerd.routing.plan import SECTIONS
from routerd.routing.sse import parse_events

_SIZE = re.compile(r"^\s*(\d+)\s*[xX×]\s*(\d+)\s*$")

DEFAULT_STEPS = 20
DEFAULT_SIDE = 512


def _positive_int(value: Any, default: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return default
    return int(value)


def image_count(kind: str, body: Mapping[str, Any]) -> int:
    """How many images an image request asks for (``sdapi``: batch size × iterations; else ``n``)."""
    if kind == "sdapi":
        return _positive_int(body.get("batch_size"), 1) * _positive_int(body.get("n_iter"), 1)
    return _positive_int(body.get("n"), 1)


def image_work(kind: str, body: Mapping[str, Any]) -> tuple[float, ...]:
    """``steps × width × height × count`` of an image request."""
    steps = _positive_int(body.get("steps", body.get("sample_steps")), DEFAULT_STEPS)
    width = height = DEFAULT_SIDE
    if kind == "sdapi":
        width = _positive_int(body.get("width"), DEFAULT_SIDE)
        height = _positive_int(body.get("height"), DEFAULT_SIDE)
    else:
        size = body.get("size")
        if isinstance(size, str) and (m := _SIZE.match(size)):
            width, height = int(m.group(1)), int(m.group(2))
    return (float(steps * width * height * image_count(kind, body)),)


def vector_count(body: Mapping[str, Any] | None) -> int:
    """How many vectors an embeddings request asks for: one per ``input`` item (Ollama's older
    ``prompt`` is one)."""
    if body is None:
        return 0
    given = body.get("input", body.get("prompt"))
    if isinstance(given, list):
        return len(given)
    return 1 if isinstance(given, str) else 0


def usage_from_json(payload: Mapping[str, Any]) -> tuple[int, int] | None:
    """(prompt, output) tokens of one answer or stream event: OpenAI ``usage`` (nested details
    such as ``prompt_tokens_details`` allowed), else llama-server ``timings`` (``cache_n`` +
    ``prompt_n``, ``predicted_n``), else llama ``/completion``'s ``tokens_evaluated``/``tokens_predicted``.

    The prompt is counted whole, the tokens the backend's prompt cache served included: ``timings``'
    ``prompt_n`` leaves them out, ``usage.prompt_tokens`` does not, and a request is priced by an
    estimate of its whole prompt (``lending.pricing``), so every sample must count the same way."""
    usage = payload.get("usage")
    if isinstance(usage, dict):  # decoded JSON: its objects are dicts
        found = _counts(usage.get("prompt_tokens"), usage.get("completion_tokens", 0))
        if found is not None:
            return found
    timings = payload.get("timings")
    if isinstance(timings, dict):
        found = _counts(timings.get("prompt_n"), timings.get("predicted_n"))
        if found is not None:
            cached = timings.get("cache_n")
            return (found[0] + cached, found[1]) if type(cached) is int and cached > 0 else found
    return _counts(payload.get("tokens_evaluated"), payload.get("tokens_predicted"))


def _counts(prompt: object, output: object) -> tuple[int, int] | None:
    # decoded JSON: a number is exactly int or float, true and false exactly bool
    if type(prompt) is int and type(output) is int and prompt >= 0 and output >= 0:
        return prompt, output
    return None


_CACHED = re.compile(rb'"(?:cached_tokens|cache_n)"\s*:\s*([0-9]{1,12})')


def cached_tokens(data: bytes) -> int:
    """The prompt tokens the backend's cache served, as the last report in an answer's bytes (a
    JSON body or a stream's tail) names them: OpenAI ``usage.prompt_tokens_details.cached_tokens``
    or llama-server's ``timings.cache_n``; 0 when it names none."""
    found = _CACHED.findall(data)
    return int(found[-1]) if found else 0


def usage_from_tail(tail: bytes) -> tuple[int, int] | None:
    """Token counts from the last event of an SSE stream's tail that reports them (a final
    ``usage``, nested or not, or llama-server ``timings``)."""
    last = max(tail.rfind(b'"usage"'), tail.rfind(b'"timings"'), tail.rfind(b'"tokens_predicted"'))
    if last < 0:
        return None
    # The report is nearly always in the last event naming it: parse from that event's start
    # (after the blank line before it) first, and the whole tail only when that finds nothing.
    start = max(tail.rfind(b"\n\n", 0, last), tail.rfind(b"\r\n\r\n", 0, last))
    if start > 0:
        # parsed from the event itself: the two blank lines found at the cut end no event (ops.py,
        # a 20-chunk stream: two parsed lines fewer, about 90 opcodes)
        found = _usage_in(tail[start + (2 if tail[start:start + 2] == b"\n\n" else 4):])
        if found is not None:
            return found
    return _usage_in(tail)


def usage_of_answer(content_type: str, data: bytes) -> tuple[int, int] | None:
    """Token counts an answer reports, from its whole body (JSON) or its last bytes (an SSE or
    NDJSON stream): OpenAI ``usage``, llama-server ``timings``, or Ollama's ``prompt_eval_count``
    and ``eval_count``.  None when it reports none."""
    if content_type.startswith("text/event-stream"):
        return usage_from_tail(data)
    if content_type.startswith(("application/x-ndjson", "application/ndjson")):
        lines = data.rstrip(b"\n").rsplit(b"\n", 1)
        data = lines[-1]
    try:
        payload = json.loads(data)
    except ValueError:
        return None
    if not isinstance(payload, dict):
        return None
    found = usage_from_json(payload)
    if found is None:
        found = _counts(payload.get("prompt_eval_count"), payload.get("eval_count"))
    return found


def _usage_in(tail: bytes) -> tuple[int, int] | None:
    for event in reversed(parse_events(tail)):
        if event.name == "error" or '"' not in event.data:
            continue
        try:
            data = json_loads_text(event.data)
        except ValueError:
            continue  # the tail may begin inside an event
        if isinstance(data, dict):
            found = usage_from_json(data)
            if found is not None:
                return found
    return None


def request_work(route: Route, parsed: Mapping[str, Any] | None, body: bytes,
                  content_type: str) -> tuple[float, ...]:
    section = SECTIONS[route.kind]
    if section == "image" and parsed is not None:
        return image_work("sdapi" if route.family == "sdapi" else "openai", parsed)
    if section == "video":
        return video_work(parsed)
    if section == "stt":
        return (_audio_seconds(body, content_type),)
    return ()


def _audio_seconds(body: bytes, content_type: str) -> float:
    """Seconds of audio in the uploaded file (0 when its format is not readable)."""
    try:
        parts = parse_form(body, content_type)
    except MultipartError:
        return 0.0
    for part in parts:
        if part.name == "file":
            return audio_duration(part.data, part.filename or "")
    return 0.0
