"""Ollama API <-> OpenAI API translation for ``llama-server`` backends.

Requests: :func:`ollama_chat_to_openai`, :func:`ollama_generate_to_openai` and
:func:`ollama_embed_to_openai` turn an Ollama request body into a
``(backend path, OpenAI body)`` pair.

Responses: :func:`openai_chat_to_ollama`, :func:`openai_completion_to_ollama_generate`
and :func:`openai_embeddings_to_ollama_embed` convert non-streaming answers;
:class:`SSEToNDJSON` converts a streaming answer incrementally;
:func:`openai_error_to_ollama` converts an error body.

Listings: :class:`ListedModel` and :func:`ollama_tags`, :func:`ollama_ps`,
:func:`ollama_show`, :func:`openai_models`.

Everything here is pure: no I/O, no reactor, clocks are passed in.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Literal

import attrs

from routerd.jsonvalues import json_int
from routerd.routing.adapters import AdapterError, JSONObject

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
EMBEDDINGS_PATH = "/v1/embeddings"

Mode = Literal["chat", "generate"]

# ---------------------------------------------------------------------------
# small helpers


def iso_utc(ts: float) -> str:
    """Epoch seconds -> the RFC 3339 UTC form Ollama uses in ``created_at``."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _ns(seconds: float) -> int:
    return max(0, int(round(seconds * 1e9)))


def _ndjson_line(record: Mapping[str, Any]) -> bytes:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)




def _require_object(body: object) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise AdapterError("request body must be a JSON object")
    return body


def _require_model(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise AdapterError("model is required")
    return model


def _optional_str(body: Mapping[str, Any], key: str) -> str:
    value = body.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise AdapterError(f"{key} must be a string")
    return value


# ---------------------------------------------------------------------------
# Ollama -> OpenAI requests

# Ollama ``options`` key -> the llama-server OpenAI-endpoint field of the same
# meaning (llama-server accepts its native sampling fields on /v1/* too).
_FLOAT_OPTIONS: dict[str, str] = {
    "temperature": "temperature",
    "top_p": "top_p",
    "min_p": "min_p",
    "typical_p": "typical_p",
    "repeat_penalty": "repeat_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "mirostat_tau": "mirostat_tau",
    "mirostat_eta": "mirostat_eta",
}
_INT_OPTIONS: dict[str, str] = {
    "top_k": "top_k",
    "seed": "seed",
    "repeat_last_n": "repeat_last_n",
    "mirostat": "mirostat",
}
# Everything else (num_ctx, num_gpu, num_thread, num_batch, use_mmap, ...) is
# about how a model is loaded, which routerd decides from the model config.

# Leading base64 characters of common image formats -> MIME type.
_IMAGE_MAGIC: tuple[tuple[str, str], ...] = (
    ("iVBORw0KGgo", "image/png"),
    ("/9j/", "image/jpeg"),
    ("R0lGOD", "image/gif"),
    ("UklGR", "image/webp"),
)


def image_data_url(image: str) -> str:
    """An Ollama base64 image -> a ``data:`` URL for an OpenAI ``image_url`` part.

    The MIME type is sniffed from the base64 prefix (PNG, JPEG, GIF, WebP) and
    defaults to ``image/png``; a value that already is a data URL is kept.
    """
    if image.startswith("data:"):
        return image
    data = "".join(image.split())
    mime = next((m for prefix, m in _IMAGE_MAGIC if data.startswith(prefix)), "image/png")
    return f"data:{mime};base64,{data}"


def _images(value: object, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(i, str) for i in value):
        raise AdapterError(f"{where} must be a list of base64 strings")
    return list(value)


def _image_parts(text: str, images: list[str]) -> list[JSONObject]:
    parts: list[JSONObject] = []
    if text:
        parts.append({"type": "text", "text": text})
    parts.extend({"type": "image_url", "image_url": {"url": image_data_url(i)}} for i in images)
    return parts


def _stop_list(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return list(value)
    raise AdapterError("option stop must be a string or a list of strings")


def _apply_options(body: Mapping[str, Any], out: JSONObject) -> None:
    options = body.get("options")
    if options is None:
        return
    if not isinstance(options, Mapping):
        raise AdapterError("options must be an object")
    for key, value in options.items():
        if value is None:
            continue
        if key == "num_predict":
            n = json_int(value)
            if n is None:
                raise AdapterError("option num_predict must be an integer")
            if n > 0:  # -1 (infinite) and -2 (fill context) mean "no limit"
                out["max_tokens"] = n
        elif key == "stop":
            out["stop"] = _stop_list(value)
        elif key in _FLOAT_OPTIONS:
            if not _is_number(value):
                raise AdapterError(f"option {key} must be a number")
            out[_FLOAT_OPTIONS[key]] = value
        elif key in _INT_OPTIONS:
            n = json_int(value)
            if n is None:
                raise AdapterError(f"option {key} must be an integer")
            out[_INT_OPTIONS[key]] = n


def _apply_format(body: Mapping[str, Any], out: JSONObject) -> None:
    fmt = body.get("format")
    if fmt is None or fmt == "":
        return
    if fmt == "json":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, Mapping):
        out["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "response", "schema": dict(fmt)},
        }
    else:
        raise AdapterError('format must be "json" or a JSON schema object')


def _apply_stream(body: Mapping[str, Any], out: JSONObject) -> None:
    stream = body.get("stream")
    if stream is None:
        stream = True  # Ollama streams unless told not to
    if not isinstance(stream, bool):
        raise AdapterError("stream must be a boolean")
    out["stream"] = stream
    if stream:
        out["stream_options"] = {"include_usage": True}


def _convert_messages(messages: object) -> list[JSONObject]:
    if not isinstance(messages, list):
        raise AdapterError("messages must be a list")
    out: list[JSONObject] = []
    pending_calls: dict[str, list[str]] = {}  # tool name -> ids of calls not yet answered
    next_call = 0
    for i, msg in enumerate(messages):
        if not isinstance(msg, Mapping):
            raise AdapterError(f"messages[{i}] must be an object")
        role = msg.get("role")
        if not isinstance(role, str) or not role:
            raise AdapterError(f"messages[{i}].role is required")
        content = _optional_str(msg, "content")
        images = _images(msg.get("images"), f"messages[{i}].images")
        new: JSONObject = {"role": role}
        new["content"] = _image_parts(content, images) if images else content
        thinking = msg.get("thinking")
        if role == "assistant" and isinstance(thinking, str) and thinking:
            new["reasoning_content"] = thinking
        tool_calls = msg.get("tool_calls")
        if tool_calls:
            if not isinstance(tool_calls, list):
                raise AdapterError(f"messages[{i}].tool_calls must be a list")
            converted: list[JSONObject] = []
            for call in tool_calls:
                function = call.get("function") if isinstance(call, Mapping) else None
                name = function.get("name") if isinstance(function, Mapping) else None
                if not isinstance(function, Mapping) or not isinstance(name, str):
                    raise AdapterError(f"messages[{i}].tool_calls entries need function.name")
                arguments = function.get("arguments", {})
                call_id = f"call_{next_call}"
                next_call += 1
                pending_calls.setdefault(name, []).append(call_id)
                converted.append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": name,
                            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                        },
                    }
                )
            new["tool_calls"] = converted
        if role == "tool":
            tool_name = msg.get("tool_name") or msg.get("name")
            if isinstance(tool_name, str) and tool_name:
                new["name"] = tool_name
                ids = pending_calls.get(tool_name)
                if ids:
                    new["tool_call_id"] = ids.pop(0)
        out.append(new)
    return out


def ollama_chat_to_openai(body: Mapping[str, Any]) -> tuple[str, JSONObject]:
    """Ollama ``/api/chat`` body -> (``/v1/chat/completions``, OpenAI body).

    Raises :class:`AdapterError` (answer 400) for a malformed body.
    """
    body = _require_object(body)
    model = _require_model(body)
    messages = body.get("messages")
    out: JSONObject = {"model": model, "messages": _convert_messages([] if messages is None else messages)}
    _apply_stream(body, out)
    _apply_options(body, out)
    _apply_format(body, out)
    tools = body.get("tools")
    if tools:
        if not isinstance(tools, list):
            raise AdapterError("tools must be a list")
        out["tools"] = list(tools)  # Ollama's tool schema is OpenAI's
    return CHAT_PATH, out


def ollama_generate_to_openai(body: Mapping[str, Any]) -> tuple[str, JSONObject]:
    """Ollama ``/api/generate`` body -> (backend path, OpenAI body).

    Text only: ``/v1/completions`` with ``system`` prefixed to the prompt (not
    in ``raw`` mode).  With ``images``: ``/v1/chat/completions`` with a system
    message and one user message holding the prompt and the image parts; the
    answer converters and :class:`SSEToNDJSON` accept either answer shape.
    """
    body = _require_object(body)
    model = _require_model(body)
    prompt = _optional_str(body, "prompt")
    system = _optional_str(body, "system")
    images = _images(body.get("images"), "images")
    raw = body.get("raw") is True
    out: JSONObject = {"model": model}
    if images:
        messages: list[JSONObject] = []
        if system and not raw:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": _image_parts(prompt, images)})
        out["messages"] = messages
        path = CHAT_PATH
    else:
        out["prompt"] = f"{system}\n\n{prompt}" if system and not raw else prompt
        path = COMPLETIONS_PATH
    _apply_stream(body, out)
    _apply_options(body, out)
    _apply_format(body, out)
    return path, out


def ollama_embed_to_openai(body: Mapping[str, Any]) -> tuple[str, JSONObject]:
    """Ollama ``/api/embed`` body -> (``/v1/embeddings``, OpenAI body)."""
    body = _require_object(body)
    model = _require_model(body)
    inp = body.get("input")
    if not (isinstance(inp, str) or (isinstance(inp, list) and all(isinstance(s, str) for s in inp))):
        raise AdapterError("input must be a string or a list of strings")
    out: JSONObject = {"model": model, "input": inp}
    dimensions = body.get("dimensions")
    if dimensions is not None:
        n = json_int(dimensions)
        if n is None or n <= 0:
            raise AdapterError("dimensions must be a positive integer")
        out["dimensions"] = n
    return EMBEDDINGS_PATH, out


def is_ollama_load_request(mode: Mode, body: Mapping[str, Any]) -> bool:
    """True for a chat with no messages or a generate with no prompt and no images.

    Ollama answers these by only loading the model (clients use them to
    preload); see :func:`ollama_load_response`.
    """
    if mode == "chat":
        return not body.get("messages")
    return not body.get("prompt") and not body.get("images")


def ollama_load_response(mode: Mode, model: str, now_iso: str) -> JSONObject:
    """The answer Ollama gives to a load-only request (``done_reason: "load"``)."""
    out: JSONObject = {"model": model, "created_at": now_iso}
    if mode == "chat":
        out["message"] = {"role": "assistant", "content": ""}
    else:
        out["response"] = ""
    out.update(done=True, done_reason="load")
    return out


# ---------------------------------------------------------------------------
# OpenAI -> Ollama responses


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


def _ollama_tool_calls(calls: object) -> list[JSONObject]:
    out: list[JSONObject] = []
    if not isinstance(calls, list):
        return out
    for call in calls:
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            continue
        arguments = _arguments(function.get("arguments"))
        out.append({"function": {"name": function["name"], "arguments": arguments}})
    return out


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


def _stats(resp: Mapping[str, Any], total_ns: int) -> JSONObject:
    prompt_n, eval_n = _counts(resp.get("usage"), resp.get("timings"))
    durations = _timing_durations(resp.get("timings"))
    prompt_ns, eval_ns = durations if durations is not None else (0, max(0, total_ns))
    return {
        "total_duration": max(0, total_ns),
        "load_duration": 0,
        "prompt_eval_count": prompt_n,
        "prompt_eval_duration": prompt_ns,
        "eval_count": eval_n,
        "eval_duration": eval_ns,
    }


def openai_chat_to_ollama(resp: Mapping[str, Any], model: str, now_iso: str, total_ns: int) -> JSONObject:
    """A non-streaming ``/v1/chat/completions`` answer -> an Ollama ``/api/chat`` answer."""
    choice = _first_choice(resp)
    message = choice.get("message")
    if not isinstance(message, Mapping):
        message = {}
    out_message: JSONObject = {"role": "assistant", "content": _text(message.get("content"))}
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        out_message["thinking"] = reasoning
    tool_calls = _ollama_tool_calls(message.get("tool_calls"))
    if tool_calls:
        out_message["tool_calls"] = tool_calls
    out: JSONObject = {
        "model": model,
        "created_at": now_iso,
        "message": out_message,
        "done": True,
        "done_reason": _done_reason(choice.get("finish_reason")),
    }
    out.update(_stats(resp, total_ns))
    return out


def openai_completion_to_ollama_generate(
    resp: Mapping[str, Any], model: str, now_iso: str, total_ns: int
) -> JSONObject:
    """A non-streaming ``/v1/completions`` answer -> an Ollama ``/api/generate`` answer.

    A chat-shaped answer (the image case of :func:`ollama_generate_to_openai`)
    is accepted too.
    """
    choice = _first_choice(resp)
    text = choice.get("text")
    message = choice.get("message")
    reasoning: object = None
    if not isinstance(text, str):
        text = _text(message.get("content")) if isinstance(message, Mapping) else ""
    if isinstance(message, Mapping):
        reasoning = message.get("reasoning_content")
    out: JSONObject = {"model": model, "created_at": now_iso, "response": text}
    if isinstance(reasoning, str) and reasoning:
        out["thinking"] = reasoning
    out.update(done=True, done_reason=_done_reason(choice.get("finish_reason")), context=[])
    out.update(_stats(resp, total_ns))
    return out


def openai_embeddings_to_ollama_embed(
    resp: Mapping[str, Any], model: str, total_ns: int | None = None
) -> JSONObject:
    """A ``/v1/embeddings`` answer -> an Ollama ``/api/embed`` answer (input order kept)."""
    data = resp.get("data")
    items = [d for d in data if isinstance(d, Mapping)] if isinstance(data, list) else []
    items.sort(key=lambda d: json_int(d.get("index")) or 0)
    embeddings = [list(d["embedding"]) for d in items if isinstance(d.get("embedding"), list)]
    prompt_n, _ = _counts(resp.get("usage"), None)
    out: JSONObject = {"model": model, "embeddings": embeddings}
    if total_ns is not None:
        out.update(total_duration=max(0, total_ns), load_duration=0)
    out["prompt_eval_count"] = prompt_n
    return out


def _error_message(parsed: object) -> str | None:
    """The message of an OpenAI/llama-server/Ollama error object, if it is one."""
    if not isinstance(parsed, Mapping):
        return None
    err = parsed.get("error")
    if isinstance(err, str) and err:
        return err
    if isinstance(err, Mapping):
        msg = err.get("message")
        if isinstance(msg, str) and msg:
            return msg
    msg = parsed.get("message")
    if isinstance(msg, str) and msg:
        return msg
    return None


def error_message_from_body(status: int, body: bytes) -> str:
    """The human message of a backend error body (JSON error object, else its text)."""
    try:
        parsed: object = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        parsed = None
    msg = _error_message(parsed)
    if msg is not None:
        return msg
    text = body.decode("utf-8", "replace").strip()
    return text[:2000] if text else f"backend returned HTTP {status}"


def ollama_error(message: str) -> bytes:
    """An Ollama error body ``{"error": message}``."""
    return json.dumps({"error": message}, ensure_ascii=False).encode("utf-8")


def openai_error_to_ollama(status: int, body: bytes) -> bytes:
    """An OpenAI-style error body (``{"error": {"message": ...}}``) -> ``{"error": "..."}``.

    Non-JSON bodies use their text, empty ones ``backend returned HTTP <status>``.
    The caller keeps the status code.
    """
    return ollama_error(error_message_from_body(status, body))


# ---------------------------------------------------------------------------
# streaming: OpenAI SSE -> Ollama NDJSON


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
    depend on how the input was split.
    """

    def __init__(
        self,
        mode: Mode,
        model: str,
        clock: Callable[[], float],
        *,
        max_frame_bytes: int = 8 << 20,
    ) -> None:
        if mode not in ("chat", "generate"):
            raise ValueError(f"unknown mode {mode!r}")
        self._mode: Mode = mode
        self._model = model
        self._clock = clock
        self._max_frame = max_frame_bytes
        self._started = clock()
        self._first_token_at: float | None = None
        self._buf = bytearray()
        self._sse: bool | None = None  # unknown until the first non-blank byte
        self._data: list[bytes] = []
        self._data_size = 0
        self._event = ""
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
        if not self._finished and len(self._buf) + self._data_size > self._max_frame:
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
            out += self._dispatch()
        if not self._finished:
            if self._done_reason is not None:
                out += self._finish()
            else:
                out += self._fail("backend stream ended before the answer was complete")
        return bytes(out)

    # -- SSE framing

    def _line(self, line: bytes) -> bytes:
        if not line:
            return self._dispatch()
        if line.startswith(b":"):
            return b""  # comment / keep-alive
        name, sep, value = line.partition(b":")
        if sep and value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            self._data.append(value)
            self._data_size += len(value)
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
        elif name == b"error":  # llama-server: "error: {json}"
            self._event = "error"
            self._data.append(value)
            self._data_size += len(value)
        return b""

    def _dispatch(self) -> bytes:
        if not self._data:
            self._event = ""
            return b""
        data = b"\n".join(self._data).decode("utf-8", "replace")
        event = self._event
        self._data = []
        self._data_size = 0
        self._event = ""
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
        if self._mode == "chat":
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
        if self._mode == "chat":
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
        if self._mode == "chat":
            record["message"] = {"role": "assistant", "content": ""}
        else:
            record["response"] = ""
        record.update(done=True, done_reason=self._done_reason or "stop")
        if self._mode == "generate":
            record["context"] = []
        record.update(
            total_duration=_ns(now - self._started),
            load_duration=0,
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
        self._data = []
        return _ndjson_line({"error": message})


# ---------------------------------------------------------------------------
# listings


@attrs.frozen
class ListedModel:
    """One public model as the Ollama/OpenAI listings show it.

    ``capabilities`` may use routerd words (``llm``, ``multimodal``,
    ``embeddings``, ``image``, ``stt``, ``tts``) or Ollama's (``completion``,
    ``vision``, ``embedding``, ``tools``, ``thinking``, ``insert``, ``audio``,
    ``image``); unknown words are ignored.  ``modified_at`` is an ISO 8601
    timestamp; ``context`` is the context window in tokens, 0 if unknown.
    """

    name: str
    model_hash: str
    size: int
    modified_at: str
    capabilities: tuple[str, ...]
    context: int
    family: str = "unknown"
    loaded: bool = False


# Ollama's /api/ps "until" for models routerd keeps loaded until swapped out.
NEVER_EXPIRES = "9999-12-31T23:59:59Z"
_EPOCH_ISO = "1970-01-01T00:00:00Z"

_CAPABILITY_WORDS: dict[str, str] = {
    "llm": "completion",
    "text": "completion",
    "completion": "completion",
    "multimodal": "vision",
    "vision": "vision",
    "tools": "tools",
    "thinking": "thinking",
    "insert": "insert",
    "stt": "audio",
    "tts": "audio",
    "audio": "audio",
    "image": "image",
    "embeddings": "embedding",
    "embedding": "embedding",
}
_CAPABILITY_ORDER = ("completion", "vision", "tools", "thinking", "insert", "audio", "image", "embedding")
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")


def ollama_capabilities(words: Iterable[str]) -> list[str]:
    """Capability words -> Ollama's vocabulary, in a fixed order (vision implies completion)."""
    caps = {_CAPABILITY_WORDS[w.lower()] for w in words if w.lower() in _CAPABILITY_WORDS}
    if "vision" in caps:
        caps.add("completion")
    return [c for c in _CAPABILITY_ORDER if c in caps]


def ollama_digest(name: str, model_hash: str) -> str:
    """``sha256:<model_hash>`` for a sha256 hex hash, else ``sha256:`` + sha256(name NUL hash)."""
    bare = model_hash.removeprefix("sha256:")
    if _HEX64.fullmatch(bare):
        return "sha256:" + bare.lower()
    return "sha256:" + hashlib.sha256(f"{name}\0{model_hash}".encode()).hexdigest()


def _parse_time(value: str) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _timestamp(value: str) -> str:
    return value if _parse_time(value) is not None else _EPOCH_ISO


def _details(entry: ListedModel) -> JSONObject:
    return {
        "parent_model": "",
        "format": "gguf",
        "family": entry.family,
        "families": [entry.family],
        "parameter_size": "unknown",
        "quantization_level": "unknown",
    }


def _unique(entries: Iterable[ListedModel]) -> list[ListedModel]:
    """One entry per name (the first seen; loaded if any replica is), sorted by name."""
    by_name: dict[str, ListedModel] = {}
    for entry in entries:
        seen = by_name.get(entry.name)
        if seen is None:
            by_name[entry.name] = entry
        elif entry.loaded and not seen.loaded:
            by_name[entry.name] = attrs.evolve(seen, loaded=True)
    return [by_name[name] for name in sorted(by_name)]


def _listing(entry: ListedModel) -> JSONObject:
    return {
        "name": entry.name,
        "model": entry.name,
        "modified_at": _timestamp(entry.modified_at),
        "size": entry.size,
        "digest": ollama_digest(entry.name, entry.model_hash),
        "details": _details(entry),
    }


def ollama_tags(entries: Iterable[ListedModel]) -> JSONObject:
    """``GET /api/tags``: every model once, sorted by name."""
    models = []
    for entry in _unique(entries):
        item = _listing(entry)
        item["capabilities"] = ollama_capabilities(entry.capabilities)
        models.append(item)
    return {"models": models}


def ollama_ps(entries: Iterable[ListedModel], expires_at: str = NEVER_EXPIRES) -> JSONObject:
    """``GET /api/ps``: the loaded models, sorted by name, with ``size_vram`` = size."""
    models = []
    for entry in _unique(entries):
        if not entry.loaded:
            continue
        item = _listing(entry)
        del item["modified_at"]
        item.update(expires_at=expires_at, size_vram=entry.size, context_length=entry.context)
        models.append(item)
    return {"models": models}


def ollama_show(entry: ListedModel) -> JSONObject:
    """``POST /api/show`` for one model, from what the catalog knows."""
    model_info: JSONObject = {"general.architecture": entry.family, "general.basename": entry.name}
    modelfile = f"# Modelfile generated by routerd\nFROM {entry.name}\n"
    parameters = ""
    if entry.context > 0:
        model_info[f"{entry.family}.context_length"] = entry.context
        modelfile += f"PARAMETER num_ctx {entry.context}\n"
        parameters = f"num_ctx {entry.context}"
    return {
        "license": "",
        "modelfile": modelfile,
        "parameters": parameters,
        "template": "{{ .Prompt }}",
        "details": _details(entry),
        "model_info": model_info,
        "capabilities": ollama_capabilities(entry.capabilities),
        "modified_at": _timestamp(entry.modified_at),
    }


def ollama_not_found(name: str) -> bytes:
    """The 404 body for an unknown model on an Ollama path."""
    return ollama_error(f"model '{name}' not found")


def openai_models(entries: Iterable[ListedModel]) -> JSONObject:
    """``GET /v1/models``: every model once, sorted by id; ``created`` from ``modified_at``."""
    data = []
    for entry in _unique(entries):
        parsed = _parse_time(entry.modified_at)
        created = int(parsed.timestamp()) if parsed is not None else 0
        data.append({"id": entry.name, "object": "model", "created": created, "owned_by": "routerd"})
    return {"object": "list", "data": data}
