"""Tool calls in the simulated chat completions, Messages and Responses answers (every family whose chat route
is :meth:`routerd.sim.llama.LlamaServer.chat_completions`: llama-server, KoboldCpp and vLLM), in the shapes
llama-server b11434 answers with a template that knows tools (``tests/integration/test_real_conformance.py``
holds them to it):

* chat completions: ``message {role, content: "", tool_calls [{type: "function", function {name, arguments:
  a JSON string}, id}]}``, ``finish_reason: "tool_calls"``; streamed, a chunk ``{role, content: null}``, then
  ``tool_calls [{index, id, type, function {name, arguments: its first piece}}]``, then one chunk per further
  piece (``tool_calls [{index, function {arguments}}]``), then the ``"tool_calls"`` finish;
* Messages: ``content [{type: "tool_use", id, name, input}]``, ``stop_reason: "tool_use"``; streamed,
  ``content_block_start`` with ``{type: "tool_use", id, name}`` (no ``input``), an ``input_json_delta`` per
  piece (``partial_json``), ``message_delta`` with ``stop_reason: "tool_use"``;
* Responses: ``output [{id: "fc_…", type: "function_call", status, arguments, call_id: "call_…", name}]``;
  streamed, ``response.output_item.added`` (``arguments: ""``, ``in_progress``), a
  ``response.function_call_arguments.delta`` per piece (llama-server sends no ``….done`` event),
  ``response.output_item.done``, ``response.completed``.

**When the simulator calls a tool** (one rule for the three APIs): a request with ``tools`` calls one when its
tool choice forces one -- ``"required"`` (Messages: ``{"type": "any"}``) calls the first tool, a named one
(chat: ``{"type": "function", "function": {"name"}}``, Responses: ``{"type": "function", "name"}``,
Messages: ``{"type": "tool", "name"}``) calls that one -- or, under ``"auto"`` (the default), when the last
input is the user's text and it names a tool (the first so named, in the tools' order).  ``"none"`` never
calls.  So an agent's second turn, which ends in a tool result, gets a text answer unless a tool is forced.

**The arguments** satisfy the tool's JSON schema, deterministically (the weights label and the prompt choose
the words): an object has its ``required`` properties; a string is a word, an integer or number the
schema's ``minimum`` (else a small number), a boolean ``true``, an array one item, an ``enum`` or ``const``
its first value.  The arguments stream (and count as tokens) a whitespace-separated piece at a time.
"""

from __future__ import annotations

import itertools
import json
import re
import uuid
from collections.abc import Iterator, Mapping, Sequence

import attrs

from routerd.sim.outputs import generate_tokens

__all__ = ["ToolCall", "chat_tool_call", "messages_tool_call", "responses_tool_call", "schema_value"]

#: How deep the argument generator follows nested schemas (deeper ones get a word).
MAX_DEPTH = 6


@attrs.frozen
class ToolCall:
    """One call: the tool's name, its arguments (a JSON object's text) and the call's id (``call_id``)."""

    name: str
    arguments: str
    id: str = attrs.field(factory=lambda: uuid.uuid4().hex)

    @property
    def pieces(self) -> list[str]:
        """The arguments as they stream and count: whitespace-separated pieces (each with its leading
        space)."""
        return re.findall(r"\s*\S+", self.arguments)

    @property
    def input(self) -> object:
        return json.loads(self.arguments)

    # -- chat completions ----------------------------------------------------------------------

    def chat_message(self) -> dict[str, object]:
        return {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": self.name, "arguments": self.arguments},
             "id": self.id}]}

    def chat_delta(self, index: int, piece: str) -> dict[str, object]:
        """The ``delta`` of the chunk streaming piece ``index``: the first names the call."""
        if index == 0:
            return {"tool_calls": [{"index": 0, "id": self.id, "type": "function",
                                    "function": {"name": self.name, "arguments": piece}}]}
        return {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}

    # -- Anthropic Messages --------------------------------------------------------------------

    def tool_use_block(self) -> dict[str, object]:
        return {"type": "tool_use", "id": self.id, "name": self.name, "input": self.input}

    def tool_use_start(self) -> dict[str, object]:
        return {"type": "tool_use", "id": self.id, "name": self.name}

    # -- OpenAI Responses ----------------------------------------------------------------------

    @property
    def item_id(self) -> str:
        return f"fc_{self.id}"

    def function_call_item(self, done: bool) -> dict[str, object]:
        return {"id": self.item_id, "type": "function_call", "status": "completed" if done else "in_progress",
                "arguments": self.arguments if done else "", "call_id": f"call_{self.id}", "name": self.name}


@attrs.frozen
class _Tool:
    name: str
    schema: Mapping[str, object]


def _tools(raw: object, function_key: str | None, schema_key: str) -> list[_Tool]:
    """The request's named tools: each an object (under ``function_key`` when given) with a name and a
    schema."""
    found: list[_Tool] = []
    for tool in raw if isinstance(raw, list) else []:
        spec = tool.get(function_key) if isinstance(tool, dict) and function_key else tool
        if isinstance(spec, dict) and isinstance(spec.get("name"), str):
            schema = spec.get(schema_key)
            found.append(_Tool(spec["name"], schema if isinstance(schema, dict) else {}))
    return found


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part["text"] for part in content if isinstance(part, dict)
                         and part.get("type") in ("text", "input_text") and isinstance(part.get("text"), str))
    return ""


def _last_user_text(items: object) -> str:
    """The text of the last message when it is the user's own (not a tool's result), else ""."""
    if isinstance(items, str):
        return items
    if not isinstance(items, list) or not items or not isinstance(items[-1], dict):
        return ""
    last = items[-1]
    if last.get("role") != "user" or last.get("type", "message") != "message":
        return ""
    content = last.get("content")
    if isinstance(content, list) and any(isinstance(part, dict) and part.get("type") == "tool_result"
                                         for part in content):
        return ""
    return _text(content)


def _call(tools: Sequence[_Tool], mode: str, named: str | None, last_user: str, label: str,
          prompt: str) -> ToolCall | None:
    """The rule of the module's docstring."""
    if not tools or mode == "none":
        return None
    if named is not None:
        tool = next((t for t in tools if t.name == named), None)
    elif mode == "required":
        tool = tools[0]
    else:
        tool = next((t for t in tools if re.search(rf"(?<!\w){re.escape(t.name)}(?!\w)", last_user)), None)
    if tool is None:
        return None
    words = itertools.cycle([w.strip() for w in generate_tokens(label, f"tool:{tool.name}\n{prompt}", 16)])
    value = schema_value(tool.schema, words)
    return ToolCall(tool.name, json.dumps(value if isinstance(value, dict) else {}))


def schema_value(schema: Mapping[str, object], words: Iterator[str], depth: int = 0) -> object:
    """A value that satisfies ``schema`` (the subset the module's docstring names)."""
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if depth >= MAX_DEPTH:
        return next(words)
    if kind == "object" or (kind is None and isinstance(schema.get("properties"), dict)):
        properties = schema.get("properties")
        required = schema.get("required")
        props: dict[str, object] = properties if isinstance(properties, dict) else {}
        return {name: schema_value(_mapping(props.get(name)), words, depth + 1)
                for name in (required if isinstance(required, list) else []) if isinstance(name, str)}
    if kind in ("integer", "number"):
        low = schema.get("minimum")
        value = low if isinstance(low, int | float) and not isinstance(low, bool) else len(next(words))
        return int(value) if kind == "integer" else float(value)
    if kind == "boolean":
        return True
    if kind == "array":
        items = schema.get("items")
        return [schema_value(_mapping(items), words, depth + 1)]
    if kind == "null":
        return None
    return next(words)


def _mapping(value: object) -> Mapping[str, object]:
    return value if isinstance(value, dict) else {}


def _choice(raw: object, named: str | None) -> tuple[str, str | None]:
    """(mode, named tool) of a tool choice given as a string (``"auto"``, ``"none"``, ``"required"``)."""
    if named is not None:
        return "required", named
    return (raw if isinstance(raw, str) else "auto"), None


def chat_tool_call(body: Mapping[str, object], label: str, prompt: str) -> ToolCall | None:
    """The call a chat completions request gets, if any."""
    choice = body.get("tool_choice")
    function = choice.get("function") if isinstance(choice, dict) else None
    named = function.get("name") if isinstance(function, dict) else None
    mode, name = _choice(choice, named if isinstance(named, str) else None)
    return _call(_tools(body.get("tools"), "function", "parameters"), mode, name,
                 _last_user_text(body.get("messages")), label, prompt)


def messages_tool_call(body: Mapping[str, object], label: str, prompt: str) -> ToolCall | None:
    """The call an Anthropic Messages request gets, if any (``tool_choice {type: auto|any|tool|none}``)."""
    choice = body.get("tool_choice")
    kind = choice.get("type") if isinstance(choice, dict) else "auto"
    named = choice.get("name") if isinstance(choice, dict) and kind == "tool" else None
    mode = {"any": "required", "none": "none"}.get(str(kind), "auto")
    tools = _tools(body.get("tools"), None, "input_schema")
    return _call(tools, mode, named if isinstance(named, str) else None,
                 _last_user_text(body.get("messages")), label, prompt)


def responses_tool_call(body: Mapping[str, object], label: str, prompt: str) -> ToolCall | None:
    """The call an OpenAI Responses request gets, if any (its ``function`` tools only)."""
    given = body.get("tools")
    tools = [tool for tool in given if isinstance(tool, dict) and tool.get("type") == "function"] \
        if isinstance(given, list) else []
    choice = body.get("tool_choice")
    named = choice.get("name") if isinstance(choice, dict) and choice.get("type") == "function" else None
    mode, name = _choice(choice, named if isinstance(named, str) else None)
    return _call(_tools(tools, None, "parameters"), mode, name, _last_user_text(body.get("input")), label,
                 prompt)
