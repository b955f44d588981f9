"""What both translations share about the chat completions side: the request's tools, its sampling
fields and its stream setting; a chat answer's text, tool calls and finish, and its ``usage``'s counts."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from routerd.jsonvalues import json_int
from routerd.routing.adapters import AdapterError, JSONObject
from routerd.routing.adapters.chat_apis.chat_stream import matched_stop
from routerd.routing.adapters.ollama._common import _first_choice, _text


def add_tools(out: JSONObject, tools: object, function: Callable[[Mapping[str, Any]], JSONObject]) -> None:
    """Set a chat request's ``tools`` from an API's tool definitions, ``function`` giving each one's
    ``function`` object (and refusing, :class:`AdapterError`, one a chat backend cannot take), and its
    ``tool_choice`` to ``auto``, chat's default with tools, said outright: KoboldCpp offers the model the
    tools only when a ``tool_choice`` is given (``koboldcpp.py`` v1.76).  The API's own choice overrides
    it."""
    if not isinstance(tools, list):
        raise AdapterError("tools must be a list")
    out["tools"] = [{"type": "function", "function": function(tool if isinstance(tool, Mapping) else {})}
                    for tool in tools]
    out["tool_choice"] = "auto"


def chat_request(model: str, messages: list[JSONObject], body: Mapping[str, Any], kept: tuple[str, ...],
                 stream: bool) -> JSONObject:
    """A chat request for ``model``: the ``kept`` fields ``body`` gives, and a stream asking for its usage
    (``stream_options.include_usage``: the usage chunk the translated answer's usage comes from)."""
    out: JSONObject = {"model": model, "messages": messages}
    for key in kept:
        if body.get(key) is not None:
            out[key] = body[key]
    if stream:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return out


@attrs.frozen
class Tokens:
    """A chat answer's token counts: the whole prompt, the part of it the backend's cache served, the
    output."""

    prompt: int
    cached: int
    output: int


def tokens(chat_usage: object) -> Tokens:
    """The counts of a chat ``usage`` (zeros for what it leaves out)."""
    given = chat_usage if isinstance(chat_usage, Mapping) else {}
    prompt = max(json_int(given.get("prompt_tokens")) or 0, 0)
    details = given.get("prompt_tokens_details")
    cached = json_int(details.get("cached_tokens")) if isinstance(details, Mapping) else None
    output = max(json_int(given.get("completion_tokens")) or 0, 0)
    return Tokens(prompt, min(max(cached or 0, 0), prompt), output)


@attrs.frozen
class ToolCall:
    id: str
    name: str
    #: The arguments as the backend wrote them (a JSON text, ``{}`` when it gave none).
    arguments: str


@attrs.frozen
class ChatAnswer:
    """A chat answer's first choice: its text, its tool calls, its ``finish_reason``, the stop string it
    says it met, and the answer's ``usage``."""

    text: str
    calls: tuple[ToolCall, ...]
    finish: object
    matched: str | None
    usage: object


def read_answer(chat: Mapping[str, Any]) -> ChatAnswer:
    """What a chat completions answer says (a tool call without an id gets ``call_<n>``)."""
    choice = _first_choice(chat)
    message = choice.get("message")
    message = message if isinstance(message, Mapping) else {}
    calls: list[ToolCall] = []
    given = message.get("tool_calls")
    for n, call in enumerate(given if isinstance(given, list) else []):
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping):
            named = call.get("id")
            calls.append(ToolCall(named if isinstance(named, str) and named else f"call_{n}",
                                  str(function.get("name", "")), _arguments_text(function.get("arguments"))))
    return ChatAnswer(_text(message.get("content")), tuple(calls), choice.get("finish_reason"),
                      matched_stop(choice), chat.get("usage"))


def _arguments_text(arguments: object) -> str:
    """A tool call's arguments as JSON text: as written, or an object (KoboldCpp v1.76 writes one) encoded."""
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments) if isinstance(arguments, Mapping) else "{}"
