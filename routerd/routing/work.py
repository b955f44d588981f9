"""Work terms of a finished request, for cost samples (contract §8).

text (section ``llm``): ``[prompt_tokens, output_tokens]`` as the backend
reported them; image: ``[steps × width × height × count]``; stt: ``[audio
seconds]``; embeddings: ``[input tokens]``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
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
    such as ``prompt_tokens_details`` allowed), Anthropic's Messages or OpenAI's Responses ``usage``
    (``input_tokens``, ``output_tokens``; at the top, or in a stream event's ``message`` or ``response``),
    else llama-server ``timings`` (``cache_n`` + ``prompt_n``, ``predicted_n``), else llama
    ``/completion``'s ``tokens_evaluated``/``tokens_predicted``.

    The prompt is counted whole, the tokens the backend's prompt cache served included: ``timings``'
    ``prompt_n`` leaves them out, ``usage.prompt_tokens`` does not, Anthropic's ``input_tokens`` leaves
    out ``cache_read_input_tokens`` and ``cache_creation_input_tokens`` (added here), the Responses API's
    does not, and a request is priced by an estimate of its whole prompt (``lending.pricing``), so every
    sample must count the same way.  A Messages stream's ``message_delta`` that reports only
    ``output_tokens`` gives None here (its input is in ``message_start``: :func:`usage_from_tail`)."""
    usage = _usage_object(payload)
    if usage is not None:
        found = _counts(usage.get("prompt_tokens"), usage.get("completion_tokens", 0))
        if found is None:
            found = _counts(_input_tokens(usage), usage.get("output_tokens", 0))
        if found is not None:
            return found
    timings = payload.get("timings")
    if isinstance(timings, dict):
        found = _counts(timings.get("prompt_n"), timings.get("predicted_n"))
        if found is not None:
            cached = timings.get("cache_n")
            return (found[0] + cached, found[1]) if type(cached) is int and cached > 0 else found
    return _counts(payload.get("tokens_evaluated"), payload.get("tokens_predicted"))


def _usage_object(payload: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``usage`` object of an answer, or of the ``message`` (Anthropic's ``message_start``) or
    ``response`` (the Responses API's ``response.completed``) a stream event carries."""
    usage = payload.get("usage")
    if isinstance(usage, dict):  # decoded JSON: its objects are dicts
        return usage
    for key in ("message", "response"):
        inner = payload.get(key)
        if isinstance(inner, dict) and isinstance(inner.get("usage"), dict):
            found: dict[str, Any] = inner["usage"]
            return found
    return None


def _input_tokens(usage: Mapping[str, Any]) -> int | None:
    """``input_tokens`` with Anthropic's cache counts added (absent in the Responses API's usage)."""
    given = usage.get("input_tokens")
    if type(given) is not int:
        return None
    for key in ("cache_read_input_tokens", "cache_creation_input_tokens"):
        extra = usage.get(key)
        if type(extra) is int and extra > 0:
            given += extra
    return given


def _output_only(payload: Mapping[str, Any]) -> int | None:
    """The ``output_tokens`` of a usage that reports no input (Anthropic's ``message_delta``), or None."""
    usage = payload.get("usage")
    if not isinstance(usage, dict) or "input_tokens" in usage or "prompt_tokens" in usage:
        return None
    output = usage.get("output_tokens")
    return output if type(output) is int and output >= 0 else None


def _counts(prompt: object, output: object) -> tuple[int, int] | None:
    # decoded JSON: a number is exactly int or float, true and false exactly bool
    if type(prompt) is int and type(output) is int and prompt >= 0 and output >= 0:
        return prompt, output
    return None


_CACHED = re.compile(rb'"(?:cached_tokens|cache_n|cache_read_input_tokens)"\s*:\s*([0-9]{1,12})')


def cached_tokens(data: bytes) -> int:
    """The prompt tokens the backend's cache served, as the last report in an answer's bytes (a
    JSON body or a stream's tail) names them: OpenAI ``usage.prompt_tokens_details.cached_tokens``
    (the Responses API's ``input_tokens_details.cached_tokens``), Anthropic's
    ``cache_read_input_tokens`` or llama-server's ``timings.cache_n``; 0 when it names none."""
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
    output: int | None = None  # a later event's output count (Anthropic's message_delta)
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
                return found if output is None else (found[0], output)
            if output is None:
                output = _output_only(data)
    return None


#: How many first bytes of an Anthropic Messages stream are kept: its ``message_start`` event, the one
#: that reports the input tokens (its ``message_delta`` at the end reports the output only).
HEAD_KEEP = 4096


class StreamCounts:
    """What a relayed stream's token counts are read from: the tail the relay keeps, and for a
    Messages stream (``head``) its first :data:`HEAD_KEEP` bytes as well.  ``feed`` is the converter's
    own feed when no head is kept (nothing added per chunk)."""

    def __init__(self, feed: Callable[[bytes], bytes], *, head: bool) -> None:
        self._feed = feed
        self._head: list[bytes] = []
        self._kept = 0
        self.feed: Callable[[bytes], bytes] = self._keep if head else feed
        #: The bytes the counts were read from (after :meth:`usage`).
        self.seen = b""

    def _keep(self, chunk: bytes) -> bytes:
        if self._kept < HEAD_KEEP:
            self._head.append(chunk)
            self._kept += len(chunk)
        return self._feed(chunk)

    def ends(self, tail: bytes) -> bytes:
        """The bytes the counts of the stream whose last bytes are ``tail`` are read from (also
        :attr:`seen`): the head kept, a blank line, the tail; the tail alone when no head is kept."""
        self.seen = b"".join(self._head)[:HEAD_KEEP] + b"\n\n" + tail if self._head else tail
        return self.seen

    def usage(self, tail: bytes) -> tuple[int, int] | None:
        """Token counts of the stream whose last bytes are ``tail`` (:func:`usage_from_tail`)."""
        return usage_from_tail(self.ends(tail))


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
