"""The simulator's tool calls (:mod:`routerd.sim.tools`): when it calls, the arguments it makes from a tool's
schema, and that every family's chat route (llama-server, KoboldCpp, vLLM) answers them, in-process on a
task.Clock."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from routerd.sim.harness import SimHarness
from routerd.sim.tools import chat_tool_call, messages_tool_call, responses_tool_call, schema_value
from routerd.sim.weights import write_weights

CITY = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"]}
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
              {"type": "function", "function": {"name": "get_weather", "parameters": CITY}}]
ASK = [{"role": "user", "content": "What is the weather?"}]


def test_arguments_fill_the_required_properties_with_values_of_their_types() -> None:
    schema = {"type": "object", "required": ["s", "i", "n", "b", "a", "e", "o", "c", "m"], "properties": {
        "s": {"type": "string"}, "i": {"type": "integer", "minimum": 3}, "n": {"type": "number"},
        "b": {"type": "boolean"}, "a": {"type": "array", "items": {"type": "integer"}},
        "e": {"type": "string", "enum": ["low", "high"]}, "c": {"const": 7},
        "o": {"type": "object", "properties": {"x": {"type": ["null", "string"]}}, "required": ["x"]},
        "m": {"type": "number", "minimum": 0.5}, "optional": {"type": "string"}}}
    value = schema_value(schema, itertools.cycle(["amber", "cobalt"]))
    assert isinstance(value, dict)
    assert value == {"s": "amber", "i": 3, "n": 6.0, "b": True, "a": [5], "e": "low",
                     "o": {"x": "cobalt"}, "c": 7, "m": 0.5}


def test_a_forced_choice_calls_the_first_or_the_named_tool_with_deterministic_arguments() -> None:
    required = chat_tool_call({"tools": CHAT_TOOLS, "tool_choice": "required", "messages": ASK}, "w", "p")
    named = chat_tool_call({"tools": CHAT_TOOLS, "messages": ASK, "tool_choice": {
        "type": "function", "function": {"name": "get_weather"}}}, "w", "p")
    again = chat_tool_call({"tools": CHAT_TOOLS, "messages": ASK, "tool_choice": {
        "type": "function", "function": {"name": "get_weather"}}}, "w", "p")
    assert required is not None and (required.name, required.arguments) == ("get_time", "{}")
    assert named is not None and again is not None and named.name == "get_weather"
    assert list(json.loads(named.arguments)) == ["city"] and named.arguments == again.arguments
    assert "".join(named.pieces) == named.arguments and len(named.pieces) == 2


def test_auto_calls_only_a_tool_the_users_last_text_names_and_none_never_calls() -> None:
    def chat(messages: list[Any], choice: object = "auto") -> str | None:
        call = chat_tool_call({"tools": CHAT_TOOLS, "tool_choice": choice, "messages": messages}, "w", "p")
        return None if call is None else call.name

    assert chat(ASK) is None
    assert chat([{"role": "user", "content": "please call get_weather for Paris"}]) == "get_weather"
    assert chat([{"role": "user", "content": "please call get_weather_now"}]) is None  # a whole name only
    assert chat([{"role": "user", "content": "call get_weather"}], "none") is None
    assert chat([{"role": "user", "content": "call get_weather"},
                 {"role": "tool", "tool_call_id": "1", "content": "sunny"}]) is None
    assert chat_tool_call({"messages": ASK, "tool_choice": "required"}, "w", "p") is None  # no tools


def test_messages_and_responses_read_their_own_tool_and_choice_forms() -> None:
    tools = [{"name": "get_weather", "input_schema": CITY}]
    for choice, called in (({"type": "any"}, True), ({"type": "tool", "name": "get_weather"}, True),
                           ({"type": "auto"}, False), ({"type": "none"}, False), (None, False)):
        body = {"tools": tools, "messages": ASK, **({"tool_choice": choice} if choice else {})}
        assert (messages_tool_call(body, "w", "p") is not None) is called, choice
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                           "content": "get_weather"}]}
    assert messages_tool_call({"tools": tools, "messages": [result]}, "w", "p") is None
    functions = [{"type": "function", "name": "get_weather", "parameters": CITY},
                 {"type": "web_search"}]
    for choice, called in (("required", True), ({"type": "function", "name": "get_weather"}, True),
                           ("auto", False), ("none", False)):
        call = responses_tool_call({"tools": functions, "input": "hi", "tool_choice": choice}, "w", "p")
        assert (call is not None) is called, choice
    call = responses_tool_call({"tools": functions, "input": "use get_weather"}, "w", "p")
    assert call is not None and call.function_call_item(done=True)["call_id"] == f"call_{call.id}"


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    write_weights(tmp_path / "t1.sim.json", "text", "T1", load_ms=10, context=512)
    (tmp_path / "all.kcpps").write_text(json.dumps({"model": str(tmp_path / "t1.sim.json")}))
    return tmp_path


FAMILIES = {
    "llama-server": lambda root: ["llama-server", "-m", str(root / "t1.sim.json")],
    "koboldcpp": lambda root: ["koboldcpp", "--config", str(root / "all.kcpps")],
    "vllm": lambda root: ["vllm", "serve", str(root / "t1.sim.json"), "--served-model-name", "chat"],
}


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest_twisted.ensureDeferred
async def test_every_familys_chat_route_answers_a_forced_tool_call(family: str, weights: Path) -> None:
    """The chat route KoboldCpp and vLLM share with llama-server answers ``tool_calls`` (``finish_reason``
    "tool_calls"), so routerd's Messages/Responses translation for them gets tool calls back."""
    sim = SimHarness.loaded(FAMILIES[family](weights))
    body = {"model": "chat", "messages": ASK, "tools": CHAT_TOOLS, "max_tokens": 8,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    response = await sim.settle(sim.stub.post(sim.url("/v1/chat/completions"), json=body))
    answer = json.loads(await sim.settle(response.content()))
    assert response.code == 200, answer
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == ""
    call = choice["message"]["tool_calls"][0]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    assert isinstance(json.loads(call["function"]["arguments"])["city"], str)
    assert answer["usage"]["completion_tokens"] == 2  # the arguments' two pieces
