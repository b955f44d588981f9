"""Non-streaming OpenAI answers and error bodies -> Ollama answers.

:func:`openai_chat_to_ollama`, :func:`openai_completion_to_ollama_generate`
and :func:`openai_embeddings_to_ollama_embed` convert non-streaming answers;
:func:`openai_error_to_ollama` converts an error body.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from routerd.jsonvalues import json_int
from routerd.routing.adapters import JSONObject
from routerd.routing.adapters.ollama._common import (
    _arguments,
    _counts,
    _done_reason,
    _first_choice,
    _text,
    _timing_durations,
)


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


def _stats(resp: Mapping[str, Any], total_ns: int, load_ns: int) -> JSONObject:
    prompt_n, eval_n = _counts(resp.get("usage"), resp.get("timings"))
    durations = _timing_durations(resp.get("timings"))
    prompt_ns, eval_ns = durations if durations is not None else (0, max(0, total_ns - load_ns))
    return {
        "total_duration": max(0, total_ns),
        "load_duration": max(0, load_ns),
        "prompt_eval_count": prompt_n,
        "prompt_eval_duration": prompt_ns,
        "eval_count": eval_n,
        "eval_duration": eval_ns,
    }


def openai_chat_to_ollama(resp: Mapping[str, Any], model: str, now_iso: str, total_ns: int,
                          load_ns: int = 0) -> JSONObject:
    """A non-streaming ``/v1/chat/completions`` answer -> an Ollama ``/api/chat`` answer.

    ``total_ns`` is the request's whole time in the router (Ollama's ``total_duration``), ``load_ns``
    the model load it waited for (``load_duration``; 0 when the model was loaded already)."""
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
    out.update(_stats(resp, total_ns, load_ns))
    return out


def openai_completion_to_ollama_generate(
    resp: Mapping[str, Any], model: str, now_iso: str, total_ns: int, load_ns: int = 0
) -> JSONObject:
    """A non-streaming ``/v1/completions`` answer -> an Ollama ``/api/generate`` answer (durations as
    :func:`openai_chat_to_ollama`).

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
    out.update(_stats(resp, total_ns, load_ns))
    return out


def openai_embeddings_to_ollama_embed(
    resp: Mapping[str, Any], model: str, total_ns: int | None = None, load_ns: int = 0
) -> JSONObject:
    """A ``/v1/embeddings`` answer -> an Ollama ``/api/embed`` answer (input order kept)."""
    data = resp.get("data")
    items = [d for d in data if isinstance(d, Mapping)] if isinstance(data, list) else []
    items.sort(key=lambda d: json_int(d.get("index")) or 0)
    embeddings = [list(d["embedding"]) for d in items if isinstance(d.get("embedding"), list)]
    prompt_n, _ = _counts(resp.get("usage"), None)
    out: JSONObject = {"model": model, "embeddings": embeddings}
    if total_ns is not None:
        out.update(total_duration=max(0, total_ns), load_duration=max(0, load_ns))
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
