"""Ollama requests -> OpenAI (llama-server) requests.

:func:`ollama_chat_to_openai`, :func:`ollama_generate_to_openai` and
:func:`ollama_embed_to_openai` turn an Ollama request body into a
``(backend path, OpenAI body)`` pair; :func:`is_ollama_load_request` and
:func:`ollama_load_response` handle Ollama's load-only requests.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from routerd.jsonvalues import json_int
from routerd.routing.adapters import AdapterError, JSONObject
from routerd.routing.adapters.ollama._common import Mode

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
EMBEDDINGS_PATH = "/v1/embeddings"


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


def is_ollama_load_request(endpoint: Mode, body: Mapping[str, Any]) -> bool:
    """True for a chat with no messages or a generate with no prompt and no images.

    Ollama answers these by only loading the model (clients use them to
    preload); see :func:`ollama_load_response`.
    """
    if endpoint == "chat":
        return not body.get("messages")
    return not body.get("prompt") and not body.get("images")


def ollama_load_response(endpoint: Mode, model: str, now_iso: str) -> JSONObject:
    """The answer Ollama gives to a load-only request (``done_reason: "load"``)."""
    out: JSONObject = {"model": model, "created_at": now_iso}
    if endpoint == "chat":
        out["message"] = {"role": "assistant", "content": ""}
    else:
        out["response"] = ""
    out.update(done=True, done_reason="load")
    return out
