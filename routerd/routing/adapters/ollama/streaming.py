"""Streaming: an OpenAI SSE answer -> Ollama NDJSON lines (:class:`SSEToNDJSON`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from routerd.jsonvalues import json_int
from routerd.routing.adapters import JSONObject
from routerd.routing.adapters.ollama._common import (
    Mode,
    _arguments,
    _counts,
    _done_reason,
    _first_choice,
    _ns,
    _text,
    _timing_durations,
    iso_utc,
)
from routerd.routing.adapters.ollama.responses import error_message_from_body
from routerd.routing.sse import Event, EventParser


def _ndjson_line(record: Mapping[str, Any]) -> bytes:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"


class SSEToNDJSON:
    """Incremental converter of an OpenAI SSE answer into Ollama NDJSON lines.

    ``feed`` takes the backend's bytes as they arrive (split anywhere) and
    returns the NDJSON lines completed by them; ``flush`` is called once at the
    end of the backend body.  Each content delta becomes one
    ``{"model", "created_at", "message"|"response", "done": false}`` line; the
    end (``data: [DONE]``, or the end of the body after a ``finish_reason``)
    gives a ``"done": true`` line with ``done_reason`` and counts/durations taken
    from ``usage``/``timings``.  An error (``data: {"error": ...}``,
    llama-server's ``error: {...}`` line, or a plain JSON error body instead of
    SSE) becomes one ``{"error": message}`` line and ends the conversion; so does
    a body that ends before any ``finish_reason``.

    ``clock`` returns epoch seconds; it is called once at construction and once
    per emitted content or done line, never otherwise, so the output does not
    depend on how the input was split.  ``started`` (on ``clock``'s scale) is when the request
    arrived, so the done line's ``total_duration`` counts the router's wait and ``load_ns`` (the
    model load the request waited for, Ollama's ``load_duration``) too; without it the total
    starts at construction.
    """

    def __init__(
        self,
        endpoint: Mode,
        model: str,
        clock: Callable[[], float],
        *,
        started: float | None = None,
        load_ns: int = 0,
        max_frame_bytes: int = 8 << 20,
    ) -> None:
        if endpoint not in ("chat", "generate"):
            raise ValueError(f"unknown mode {endpoint!r}")
        self._endpoint: Mode = endpoint
        self._model = model
        self._clock = clock
        self._max_frame = max_frame_bytes
        self._started = clock()
        self._request_started = self._started if started is None else started
        self._load_ns = max(0, load_ns)
        self._first_token_at: float | None = None
        self._buf = bytearray()
        self._sse: bool | None = None  # unknown until the first non-blank byte
        self._events = EventParser()
        self._finished = False
        self._done_reason: str | None = None
        self._usage: object = None
        self._timings: object = None
        self._tool_calls: dict[int, dict[str, str]] = {}

    @property
    def finished(self) -> bool:
        """True once the done or error line has been produced."""
        return self._finished

    def feed(self, chunk: bytes) -> bytes:
        if self._finished or not chunk:
            return b""
        self._buf += chunk
        if self._sse is None:
            head = self._buf.lstrip()
            if not head:
                return b""
            self._sse = not head.startswith(b"{")
        if not self._sse:
            if len(self._buf) > self._max_frame:
                return self._fail("backend answer too large")
            return b""
        out = bytearray()
        pos = 0
        while not self._finished:
            nl = self._buf.find(b"\n", pos)
            if nl < 0:
                break
            line = bytes(self._buf[pos:nl])
            pos = nl + 1
            out += self._line(line[:-1] if line.endswith(b"\r") else line)
        del self._buf[:pos]
        if not self._finished and len(self._buf) + self._events.pending_bytes > self._max_frame:
            out += self._fail("backend stream frame too large")
        return bytes(out)

    def flush(self) -> bytes:
        if self._finished:
            return b""
        if self._sse is None:
            return self._fail("backend returned an empty response")
        if not self._sse:
            return self._plain_json()
        out = bytearray()
        if self._buf:
            line = bytes(self._buf)
            self._buf.clear()
            out += self._line(line.rstrip(b"\r"))
        if not self._finished:
            out += self._dispatch(self._events.end())
        if not self._finished:
            if self._done_reason is not None:
                out += self._finish()
            else:
                out += self._fail("backend stream ended before the answer was complete")
        return bytes(out)

    # -- SSE framing

    def _line(self, line: bytes) -> bytes:
        return self._dispatch(self._events.line(line))

    def _dispatch(self, parsed: Event | None) -> bytes:
        if parsed is None:
            return b""
        data, event = parsed.data, parsed.name
        if event == "error":
            return self._fail(error_message_from_body(500, data.encode("utf-8")))
        if data.strip() == "[DONE]":
            return self._finish()
        try:
            payload = json.loads(data)
        except ValueError:
            return b""  # non-JSON data lines are dropped
        if not isinstance(payload, Mapping):
            return b""
        if payload.get("error"):
            return self._fail(error_message_from_body(500, data.encode("utf-8")))
        return self._chunk(payload)

    def _plain_json(self) -> bytes:
        """The backend answered with one JSON document instead of SSE."""
        body = bytes(self._buf)
        self._buf.clear()
        try:
            parsed: object = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            parsed = None
        answer = isinstance(parsed, Mapping) and not parsed.get("error")
        if answer and isinstance(parsed, Mapping) and isinstance(parsed.get("choices"), list):
            # A non-streamed answer: replay it as a single delta.
            choice = _first_choice(parsed)
            message = choice.get("message")
            delta: JSONObject = {}
            if isinstance(message, Mapping):
                delta = dict(message)
                delta["content"] = _text(message.get("content"))
            as_chunk: JSONObject = {
                "choices": [
                    {
                        "index": 0,
                        "delta": delta,
                        "text": choice.get("text"),
                        "finish_reason": choice.get("finish_reason") or "stop",
                    }
                ],
                "usage": parsed.get("usage"),
                "timings": parsed.get("timings"),
            }
            return self._chunk(as_chunk) + self._finish()
        return self._fail(error_message_from_body(500, body))

    # -- content

    def _chunk(self, payload: Mapping[str, Any]) -> bytes:
        out = bytearray()
        if isinstance(payload.get("usage"), Mapping):
            self._usage = payload["usage"]
        if isinstance(payload.get("timings"), Mapping):
            self._timings = payload["timings"]
        choice = _first_choice(payload)
        if not choice:
            return b""
        delta = choice.get("delta")
        if not isinstance(delta, Mapping):
            delta = {}
        content = delta.get("content")
        if not isinstance(content, str):
            content = choice.get("text")
        text = content if isinstance(content, str) else ""
        thinking = delta.get("reasoning_content")
        thought = thinking if isinstance(thinking, str) else ""
        if text or thought:
            out += self._delta_line(text, thought)
        if self._endpoint == "chat":
            self._collect_tool_calls(delta.get("tool_calls"))
        finish = choice.get("finish_reason")
        if finish:
            self._done_reason = _done_reason(finish)
            out += self._tool_calls_line()
        return bytes(out)

    def _collect_tool_calls(self, calls: object) -> None:
        if not isinstance(calls, list):
            return
        for n, call in enumerate(calls):
            if not isinstance(call, Mapping):
                continue
            index = json_int(call.get("index"))
            slot = self._tool_calls.setdefault(n if index is None else index, {"name": "", "arguments": ""})
            function = call.get("function")
            if isinstance(function, Mapping):
                if isinstance(function.get("name"), str):
                    slot["name"] += function["name"]
                if isinstance(function.get("arguments"), str):
                    slot["arguments"] += function["arguments"]

    def _tool_calls_line(self) -> bytes:
        calls = [
            {"function": {"name": c["name"], "arguments": _arguments(c["arguments"])}}
            for _, c in sorted(self._tool_calls.items())
            if c["name"]
        ]
        self._tool_calls.clear()
        if not calls:
            return b""
        return self._delta_line("", "", calls)

    def _record(self, now: float) -> JSONObject:
        return {"model": self._model, "created_at": iso_utc(now)}

    def _delta_line(self, text: str, thinking: str, tool_calls: list[JSONObject] | None = None) -> bytes:
        now = self._clock()
        if self._first_token_at is None:
            self._first_token_at = now
        record = self._record(now)
        if self._endpoint == "chat":
            message: JSONObject = {"role": "assistant", "content": text}
            if thinking:
                message["thinking"] = thinking
            if tool_calls:
                message["tool_calls"] = tool_calls
            record["message"] = message
        else:
            record["response"] = text
            if thinking:
                record["thinking"] = thinking
        record["done"] = False
        return _ndjson_line(record)

    def _finish(self) -> bytes:
        if self._finished:
            return b""
        out = bytearray(self._tool_calls_line())
        self._finished = True
        now = self._clock()
        first = self._first_token_at if self._first_token_at is not None else now
        durations = _timing_durations(self._timings)
        if durations is None:
            durations = (_ns(first - self._started), _ns(now - first))
        prompt_ns, eval_ns = durations
        prompt_n, eval_n = _counts(self._usage, self._timings)
        record = self._record(now)
        if self._endpoint == "chat":
            record["message"] = {"role": "assistant", "content": ""}
        else:
            record["response"] = ""
        record.update(done=True, done_reason=self._done_reason or "stop")
        if self._endpoint == "generate":
            record["context"] = []
        record.update(
            total_duration=_ns(now - self._request_started),
            load_duration=self._load_ns,
            prompt_eval_count=prompt_n,
            prompt_eval_duration=prompt_ns,
            eval_count=eval_n,
            eval_duration=eval_ns,
        )
        out += _ndjson_line(record)
        return bytes(out)

    def _fail(self, message: str) -> bytes:
        self._finished = True
        self._buf.clear()
        self._events = EventParser()
        return _ndjson_line({"error": message})
