"""A backend's whole (not streamed) answer as the client's, and the converter of a streamed one.

:func:`convert_answer` turns the backend's body into the client's API (Ollama, Kobold, whisper, and
Anthropic's Messages or OpenAI's Responses for a family routerd translates them for) with the model
named by its public ID, and records the tokens the answer reports on the call, once, from the usage
the backend reported.  :func:`translated_stream` gives the converter of a translated stream.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from routerd.errors import HTTPError
from routerd.routing import work
from routerd.routing.adapters import kobold, ollama, whisper
from routerd.routing.adapters.chat_apis import anthropic, responses
from routerd.routing.adapters.chat_apis.anthropic_stream import MessagesStream
from routerd.routing.adapters.chat_apis.responses_stream import ResponsesStream
from routerd.routing.body import json_loads
from routerd.routing.call import Call
from routerd.routing.plan import SECTIONS, BackendPlan
from routerd.routing.rewrite import rewrite_json_model

__all__ = ["convert_answer", "loads_answer", "translated_stream"]


def convert_answer(call: Call, plan: BackendPlan, public_id: str, code: int, ctype: str, raw: bytes,
                   now: float, load_ns: int = 0) -> tuple[str, bytes]:
    """(content type, body) of the client's answer; ``now`` is the node clock's seconds."""
    ok = 200 <= code < 300
    if plan.answer_format == "whisper":
        if not ok:
            return "application/json", whisper.whisper_error_to_openai(code, raw)
        try:
            return whisper.whisper_to_openai(raw, plan.response_format)
        except whisper.WhisperError as exc:
            raise HTTPError(502, f"speech-to-text backend failed: {exc}",
                            "backend_error", "backend_error") from None
    if plan.answer_format.startswith("ollama"):
        if not ok:
            return "application/json", ollama.openai_error_to_ollama(code, raw)
        data = loads_answer(raw)
        _usage(call, data)
        # Ollama's durations: the request's whole time here, and the load it waited for
        total_ns = max(0, int((now - call.started) * 1e9))
        if plan.answer_format == "ollama_chat":
            out = ollama.openai_chat_to_ollama(data, public_id, _iso_now(), total_ns, load_ns)
        elif plan.answer_format == "ollama_generate":
            out = ollama.openai_completion_to_ollama_generate(data, public_id, _iso_now(), total_ns, load_ns)
        else:
            out = ollama.openai_embeddings_to_ollama_embed(data, public_id, total_ns, load_ns)
        return "application/json", json.dumps(out).encode()
    if plan.answer_format == "kobold" and ok:
        data = loads_answer(raw)
        _usage(call, data)
        return "application/json", json.dumps(kobold.llama_completion_to_kobold(data)).encode()
    if plan.answer_format in ("anthropic", "responses", "token_count"):
        return "application/json", _translated(call, plan, public_id, code, raw, now)
    if ctype.startswith("application/json"):
        if ok and SECTIONS[call.route.kind] == "llm":
            try:
                parsed = json_loads(raw)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                _usage(call, parsed)
        return ctype, rewrite_json_model(raw, lambda _old: public_id)
    return ctype, raw


def _translated(call: Call, plan: BackendPlan, public_id: str, code: int, raw: bytes, now: float) -> bytes:
    """A translated API's answer: the chat (or tokenizer) answer in the client's API, an error in its
    error shape; the usage is the chat answer's (counted here, once)."""
    anthropic_api = plan.answer_format != "responses"
    if not 200 <= code < 300:
        if anthropic_api:
            return anthropic.error_to_anthropic(code, raw)
        return rewrite_json_model(raw, lambda _old: public_id)  # chat's error shape is the Responses API's
    data = loads_answer(raw)
    if plan.answer_format == "token_count":
        counted = anthropic.count_tokens_answer(data)
        if counted is None:
            raise HTTPError(502, "the backend's tokenizer answered no count", "backend_error",
                            "backend_error")
        return json.dumps(counted).encode()
    _usage(call, data)
    if anthropic_api:
        out = anthropic.chat_to_messages(data, public_id, message_id(call), anthropic.stops_of(call.parsed))
    else:
        out = responses.chat_to_response(data, public_id, response_id(call), int(now), call.parsed)
    return json.dumps(out, ensure_ascii=False).encode("utf-8")


def message_id(call: Call) -> str:
    """The ``msg_…`` id of a translated Messages answer: the request's own id."""
    return f"msg_{call.request_id}"


def response_id(call: Call) -> str:
    """The ``resp_…`` id of a translated Response: the request's own id."""
    return f"resp_{call.request_id}"


def translated_stream(plan: BackendPlan, call: Call, public_id: str,
                      now: float) -> MessagesStream | ResponsesStream | None:
    """The converter of a translated stream (None for an answer format that is not one)."""
    if plan.answer_format == "anthropic":
        return MessagesStream(public_id, message_id(call), anthropic.stops_of(call.parsed))
    if plan.answer_format == "responses":
        return ResponsesStream(public_id, response_id(call), int(now), call.parsed)
    return None


def _usage(call: Call, data: Mapping[str, Any]) -> None:
    usage = work.usage_from_json(data)
    if usage is not None:
        call.outcome.work = (float(usage[0]), float(usage[1]))


def loads_answer(raw: bytes) -> dict[str, Any]:
    """A backend's JSON object answer (502 when it is none)."""
    try:
        data = json_loads(raw)
    except ValueError:
        raise HTTPError(502, "backend answered with invalid JSON", "backend_error", "backend_error") from None
    if not isinstance(data, dict):
        raise HTTPError(502, "backend answered with unexpected JSON", "backend_error", "backend_error")
    return data


def _iso_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "Z"
