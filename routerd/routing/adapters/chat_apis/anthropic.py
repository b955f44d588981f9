"""Anthropic's Messages API <-> chat completions (requests, answers, errors, token counting).

Request (:func:`messages_to_chat`): ``system`` (a string or text blocks) becomes the first ``system``
message; each message's blocks become chat content: ``text`` a text part, ``image`` (a ``base64`` or
``url`` source) an ``image_url`` part, an assistant's ``tool_use`` blocks its ``tool_calls`` (``input``
as the JSON ``arguments``), a user's ``tool_result`` blocks ``role: tool`` messages before the rest of
its content; ``tools`` become ``function`` tools (``input_schema`` their ``parameters``), ``tool_choice``
``auto``/``any``/``tool``/``none`` chat's ``auto``/``required``/a named function/``none``;
``stop_sequences`` is ``stop``; ``max_tokens``, ``temperature``, ``top_p``, ``top_k`` are kept.  Lost:
``thinking`` and ``redacted_thinking`` blocks, ``cache_control``, ``metadata``, a tool result's
``is_error`` and its images (its text is kept), ``document`` blocks (refused: 400).

Answer (:func:`chat_to_messages`): the text and the tool calls become ``text`` and ``tool_use`` blocks;
``finish_reason`` ``stop`` is ``end_turn`` (``stop_sequence`` with ``stop_sequence`` set when the backend
names the stop string it met, as vLLM's ``stop_reason`` does), ``length`` ``max_tokens``, ``tool_calls``
``tool_use``; the usage's ``prompt_tokens`` less the cached ones is ``input_tokens``, the cached ones
``cache_read_input_tokens``, ``completion_tokens`` ``output_tokens``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from routerd.errors import error_body
from routerd.jsonvalues import json_int
from routerd.routing.adapters import AdapterError, JSONObject
from routerd.routing.adapters.chat_apis.chat import add_tools, chat_request, read_answer, tokens
from routerd.routing.adapters.ollama._common import _arguments
from routerd.routing.adapters.ollama.responses import error_message_from_body

#: ``finish_reason`` -> ``stop_reason``.
STOP_REASONS: Mapping[str, str] = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                                   "function_call": "tool_use", "content_filter": "refusal"}
#: The sampling fields a Messages request and a chat request share.
_SAMPLING = ("max_tokens", "temperature", "top_p", "top_k")
#: Blocks that carry nothing a chat backend can use (dropped).
_DROPPED_BLOCKS = frozenset({"thinking", "redacted_thinking"})


def _blocks(content: object, where: str) -> list[Mapping[str, Any]]:
    """A message's content as blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, Mapping) for b in content):
        raise AdapterError(f"{where} must be a string or a list of content blocks")
    return content


def _block_text(content: object) -> str:
    """The text of a ``system`` or ``tool_result`` content: a string or its text blocks, joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(b["text"] for b in content if isinstance(b, Mapping) and b.get("type") == "text"
                         and isinstance(b.get("text"), str))
    return ""


def _image_part(block: Mapping[str, Any]) -> JSONObject:
    source = block.get("source")
    if not isinstance(source, Mapping):
        raise AdapterError("an image block needs a source")
    if source.get("type") == "base64" and isinstance(source.get("data"), str):
        media = source.get("media_type") if isinstance(source.get("media_type"), str) else "image/png"
        return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{source['data']}"}}
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return {"type": "image_url", "image_url": {"url": source["url"]}}
    raise AdapterError("an image source must be base64 data or a url")


def _user(content: object, where: str) -> list[JSONObject]:
    """A user message: its ``tool_result`` blocks as tool messages, then the rest as one user message."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    out: list[JSONObject] = []
    parts: list[JSONObject] = []
    for block in _blocks(content, where):
        kind = block.get("type")
        if kind == "text":
            parts.append({"type": "text", "text": str(block.get("text", ""))})
        elif kind == "image":
            parts.append(_image_part(block))
        elif kind == "tool_result":
            out.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")),
                        "content": _block_text(block.get("content"))})
        elif kind not in _DROPPED_BLOCKS:
            raise AdapterError(f"{where}: a {kind!r} block cannot be sent to this backend")
    if parts:
        out.append({"role": "user", "content": parts})
    return out


def _assistant(content: object, where: str) -> JSONObject:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[str] = []
    calls: list[JSONObject] = []
    for block in _blocks(content, where):
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use":
            given = block.get("input")
            calls.append({"id": str(block.get("id", "")), "type": "function", "function": {
                "name": str(block.get("name", "")),
                "arguments": json.dumps(given if isinstance(given, Mapping) else {})}})
        elif kind not in _DROPPED_BLOCKS:
            raise AdapterError(f"{where}: a {kind!r} block cannot be sent to this backend")
    message: JSONObject = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        message["tool_calls"] = calls
    return message


def chat_messages(body: Mapping[str, Any]) -> list[JSONObject]:
    """The chat messages of a Messages request (its ``system`` first)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise AdapterError("messages must be a list")
    out: list[JSONObject] = []
    system = body.get("system")
    if system is not None:
        if not isinstance(system, str | list):
            raise AdapterError("system must be a string or a list of text blocks")
        out.append({"role": "system", "content": _block_text(system)})
    for n, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise AdapterError(f"messages[{n}] must be an object")
        role, where = message.get("role"), f"messages[{n}].content"
        if role == "user":
            out += _user(message.get("content"), where)
        elif role == "assistant":
            out.append(_assistant(message.get("content"), where))
        else:
            raise AdapterError(f"messages[{n}].role must be user or assistant")
    return out


def _function(tool: Mapping[str, Any]) -> JSONObject:
    """A Messages tool (``name``, ``description``, ``input_schema``) as a chat function."""
    if not isinstance(tool.get("name"), str):
        raise AdapterError("each tool needs a name")
    if tool.get("type") not in (None, "custom"):
        raise AdapterError(f"the {tool.get('type')!r} server tool cannot be sent to this backend")
    function: JSONObject = {"name": tool["name"], "parameters": tool.get("input_schema") or {}}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    return function


def _tool_choice(choice: Mapping[str, Any], out: JSONObject) -> None:
    kind = choice.get("type")
    if kind == "tool" and isinstance(choice.get("name"), str):
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    elif kind in ("auto", "any", "none"):
        out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    else:
        raise AdapterError("tool_choice must be auto, any, tool (with a name) or none")
    if choice.get("disable_parallel_tool_use") is True:
        out["parallel_tool_calls"] = False


def messages_to_chat(body: Mapping[str, Any], model: str, stream: bool) -> JSONObject:
    """A Messages request as a chat completions request for ``model`` (a stream asks for its usage)."""
    out = chat_request(model, chat_messages(body), body, _SAMPLING, stream)
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise AdapterError("stop_sequences must be a list of strings")
        out["stop"] = list(stops)
    if body.get("tools") is not None:
        add_tools(out, body["tools"], _function)
    choice = body.get("tool_choice")
    if isinstance(choice, Mapping):
        _tool_choice(choice, out)
    return out


def stop_reason(finish: object, matched: str | None, stops: Sequence[str],
                called: bool = False) -> tuple[str, str | None]:
    """(``stop_reason``, ``stop_sequence``) for a chat ``finish_reason`` (and the stop string matched); an
    answer that ``called`` a tool but finished ``stop`` (KoboldCpp's) is ``tool_use`` too, which is what a
    Messages client runs the tools on."""
    if finish == "stop" and matched is not None and matched in stops:
        return "stop_sequence", matched
    reason = STOP_REASONS.get(finish if isinstance(finish, str) else "", "end_turn")
    return ("tool_use" if called and reason == "end_turn" else reason), None


def usage(chat_usage: object) -> JSONObject:
    """A chat ``usage`` as Anthropic's: the cached prompt tokens apart from ``input_tokens``."""
    counts = tokens(chat_usage)
    return {"input_tokens": counts.prompt - counts.cached, "cache_read_input_tokens": counts.cached,
            "cache_creation_input_tokens": 0, "output_tokens": counts.output}


def stops_of(request: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The ``stop_sequences`` a Messages request gave (none when it gave no list of strings)."""
    stops = request.get("stop_sequences") if request is not None else None
    return tuple(s for s in stops if isinstance(s, str)) if isinstance(stops, list) else ()


def tool_input(arguments: object) -> JSONObject:
    """A tool call's ``arguments`` (a JSON string) as a ``tool_use`` block's ``input`` object."""
    return _arguments(arguments)


def chat_to_messages(chat: Mapping[str, Any], model: str, message_id: str,
                     stops: Sequence[str] = ()) -> JSONObject:
    """A chat completions answer as a Messages answer named ``model`` (the client's ID)."""
    answer = read_answer(chat)
    content: list[JSONObject] = [{"type": "text", "text": answer.text}] if answer.text else []
    content += [{"type": "tool_use", "id": call.id, "name": call.name, "input": tool_input(call.arguments)}
                for call in answer.calls]
    reason, sequence = stop_reason(answer.finish, answer.matched, stops, bool(answer.calls))
    return {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": reason, "stop_sequence": sequence, "usage": usage(answer.usage)}


def error_to_anthropic(status: int, body: bytes) -> bytes:
    """A backend's error answer (any shape) in Anthropic's error shape, its message kept."""
    return error_body("anthropic", error_message_from_body(status, body), "backend_error", "backend_error",
                      status)


# -- token counting ---------------------------------------------------------------------------------


def count_tokens_text(body: Mapping[str, Any]) -> str:
    """The text a count-tokens request's tokens are counted on, for a tokenizer that takes raw text
    (KoboldCpp's ``/api/extra/tokencount``): the system prompt, each message's text, tool calls and
    tool results, and the tool definitions as JSON, one per line (no chat template: README "APIs")."""
    lines: list[str] = []
    for message in chat_messages(body):
        content = message.get("content")
        if isinstance(content, str):
            lines.append(content)
        elif isinstance(content, list):
            lines += [str(p["text"]) for p in content if p.get("type") == "text"]
        for call in message.get("tool_calls", ()):
            lines.append(call["function"]["name"] + " " + call["function"]["arguments"])
    if body.get("tools") is not None:
        listed: JSONObject = {}
        add_tools(listed, body["tools"], _function)
        lines += [json.dumps(tool, separators=(",", ":")) for tool in listed["tools"]]
    return "\n".join(line for line in lines if line)


def count_tokens_request(body: Mapping[str, Any]) -> JSONObject:
    """The tokenizer request counting a count-tokens request's text."""
    return {"prompt": count_tokens_text(body)}


def count_tokens_answer(tokenizer: Mapping[str, Any]) -> JSONObject | None:
    """A tokenizer's answer (KoboldCpp's ``{"value"}``, vLLM's ``{"count"}``) as ``{"input_tokens"}``;
    None when it names no count."""
    for key in ("value", "count"):
        count = json_int(tokenizer.get(key))
        if count is not None and count >= 0:
            return {"input_tokens": count}
    return None
