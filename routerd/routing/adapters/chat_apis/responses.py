"""OpenAI's Responses API <-> chat completions (requests and answers).

Request (:func:`responses_to_chat`): ``instructions`` becomes the first ``system`` message; ``input`` a
string (one user message) or items: messages (``input_text``/``output_text`` parts text, ``input_image``
an ``image_url`` part; role ``developer`` is ``system``), ``function_call`` items an assistant's
``tool_calls`` (consecutive calls one message), ``function_call_output`` items ``role: tool`` messages;
``function`` tools become chat tools, ``tool_choice`` is kept (a named function in chat's form),
``max_output_tokens`` is ``max_tokens``, ``text.format`` ``json_schema``/``json_object`` chat's
``response_format``; ``temperature``, ``top_p``, ``parallel_tool_calls`` are kept.  Lost: ``reasoning``
items and settings, ``metadata``, ``include``, ``truncation``; refused (400): built-in tools
(``web_search``, ``file_search``, …), file inputs, and ``previous_response_id``/``store: true``
(:mod:`routerd.routing.server_state`).

Answer (:func:`chat_to_response`): a ``message`` item with one ``output_text`` part and a
``function_call`` item per tool call; ``finish_reason`` ``length`` makes it ``incomplete``
(``incomplete_details.reason`` ``max_output_tokens``), else ``completed``; usage ``input_tokens``,
``output_tokens``, ``total_tokens``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from routerd.routing.adapters import AdapterError, JSONObject
from routerd.routing.adapters.chat_apis.chat import add_tools, chat_request, read_answer, tokens
from routerd.routing.adapters.ollama._common import _text

#: The sampling fields a Responses request and a chat request share.
_SAMPLING = ("temperature", "top_p", "parallel_tool_calls")


def _content(content: object, where: str) -> str | list[JSONObject]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise AdapterError(f"{where} must be a string or a list of content parts")
    parts: list[JSONObject] = []
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        elif kind != "refusal":
            raise AdapterError(f"{where}: a {kind!r} part cannot be sent to this backend")
    return parts


def _message(item: Mapping[str, Any], where: str) -> JSONObject:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise AdapterError(f"{where}.role must be user, assistant, system or developer")
    content = _content(item.get("content"), f"{where}.content")
    if role in ("assistant", "system", "developer") and isinstance(content, list):
        content = _text(content)  # chat's assistant and system content: text
    return {"role": "system" if role == "developer" else role, "content": content}


def chat_messages(body: Mapping[str, Any]) -> list[JSONObject]:
    """The chat messages of a Responses request (its ``instructions`` first)."""
    out: list[JSONObject] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        out.append({"role": "system", "content": instructions})
    given = body.get("input")
    if isinstance(given, str):
        return [*out, {"role": "user", "content": given}]
    if not isinstance(given, list):
        raise AdapterError("input must be a string or a list of items")
    for n, item in enumerate(given):
        where = f"input[{n}]"
        if not isinstance(item, Mapping):
            raise AdapterError(f"{where} must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            out.append(_message(item, where))
        elif kind == "function_call":
            call = {"id": str(item.get("call_id", "")), "type": "function", "function": {
                "name": str(item.get("name", "")), "arguments": str(item.get("arguments", ""))}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                if last["content"] == "":
                    last["content"] = None
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            out.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")),
                        "content": output if isinstance(output, str) else _text(output)})
        elif kind != "reasoning":
            raise AdapterError(f"{where}: a {kind!r} item cannot be sent to this backend")
    return out


def _function(tool: Mapping[str, Any]) -> JSONObject:
    """A Responses ``function`` tool (``name``, ``description``, ``parameters``, ``strict``) as chat's."""
    if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
        raise AdapterError(f"only function tools (with a name) can be sent to this backend, "
                           f"not {tool.get('type')!r}")
    function: JSONObject = {"name": tool["name"], "parameters": tool.get("parameters") or {}}
    for key in ("description", "strict"):
        if tool.get(key) is not None:
            function[key] = tool[key]
    return function


def _response_format(text: object) -> JSONObject | None:
    form = text.get("format") if isinstance(text, Mapping) else None
    if not isinstance(form, Mapping) or form.get("type") in (None, "text"):
        return None
    if form.get("type") == "json_object":
        return {"type": "json_object"}
    if form.get("type") == "json_schema":
        schema = {key: form[key] for key in ("name", "schema", "strict", "description") if key in form}
        return {"type": "json_schema", "json_schema": schema}
    raise AdapterError(f"text.format {form.get('type')!r} cannot be sent to this backend")


def responses_to_chat(body: Mapping[str, Any], model: str, stream: bool) -> JSONObject:
    """A Responses request as a chat completions request for ``model`` (a stream asks for its usage)."""
    out = chat_request(model, chat_messages(body), body, _SAMPLING, stream)
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    if body.get("tools") is not None:
        add_tools(out, body["tools"], _function)
    choice = body.get("tool_choice")
    if isinstance(choice, str):
        out["tool_choice"] = choice
    elif isinstance(choice, Mapping):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise AdapterError("tool_choice must be auto, none, required or a named function")
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    form = _response_format(body.get("text"))
    if form is not None:
        out["response_format"] = form
    return out


def usage(chat_usage: object) -> JSONObject:
    """A chat ``usage`` as the Responses API's."""
    counts = tokens(chat_usage)
    return {"input_tokens": counts.prompt, "input_tokens_details": {"cached_tokens": counts.cached},
            "output_tokens": counts.output, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": counts.prompt + counts.output}


def status_of(finish: object) -> tuple[str, JSONObject | None]:
    """(``status``, ``incomplete_details``) for a chat ``finish_reason``."""
    if finish == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish == "content_filter":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def message_item(item_id: str, text: str, status: str = "completed") -> JSONObject:
    return {"id": item_id, "type": "message", "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> JSONObject:
    return {"id": item_id, "type": "function_call", "status": status, "call_id": call_id, "name": name,
            "arguments": arguments}


def response_object(response_id: str, model: str, created: int, request: Mapping[str, Any] | None,
                    output: list[JSONObject], status: str, incomplete: JSONObject | None,
                    chat_usage: object) -> JSONObject:
    """A Response object; the request's settings it echoes are taken from ``request``."""
    given = request or {}
    return {
        "id": response_id, "object": "response", "created_at": created, "model": model, "status": status,
        "incomplete_details": incomplete, "error": None, "output": output,
        "instructions": given.get("instructions"), "tools": given.get("tools") or [],
        "tool_choice": given.get("tool_choice") or "auto",
        "parallel_tool_calls": given.get("parallel_tool_calls", True),
        "temperature": given.get("temperature"), "top_p": given.get("top_p"),
        "max_output_tokens": given.get("max_output_tokens"), "metadata": given.get("metadata") or {},
        "text": given.get("text") or {"format": {"type": "text"}}, "store": False,
        "usage": None if status == "in_progress" else usage(chat_usage),
    }


def chat_to_response(chat: Mapping[str, Any], model: str, response_id: str, created: int,
                     request: Mapping[str, Any] | None = None) -> JSONObject:
    """A chat completions answer as a Response object named ``model`` (the client's ID)."""
    answer = read_answer(chat)
    output: list[JSONObject] = []
    if answer.text or not answer.calls:
        output.append(message_item(f"msg_{response_id.removeprefix('resp_')}", answer.text))
    output += [call_item(f"fc_{call.id}", call.id, call.name, call.arguments) for call in answer.calls]
    status, incomplete = status_of(answer.finish)
    return response_object(response_id, model, created, request, output, status, incomplete, answer.usage)
