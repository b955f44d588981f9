"""Tool calls driven by the official SDKs, one flow per API, shared by the simulator's and the real
llama-server's tests (:mod:`tests.integration.test_sdk_tools`, :mod:`tests.integration.test_real_tools`).

Each flow forces a call of ``get_weather`` (plain, then streamed), checks what every backend must give (the
tool's name, arguments that are a JSON object with a string ``city``, a stream whose argument deltas join to
the final call's arguments, the public model ID), then sends the call's result back as the API's own tool
result and returns both turns for the backend's own checks (the simulator answers a tool result with text;
the tool-calling tiny GGUF calls again).  The clients are synchronous: run a flow in a worker thread.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import attrs
import openai

__all__ = ["ASK_WEATHER", "CHAT_TOOLS", "MESSAGES_TOOLS", "RESPONSES_TOOLS", "Turns", "chat_tool_flow",
           "messages_tool_flow", "responses_tool_flow"]

WEATHER: dict[str, Any] = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
MESSAGES_TOOLS: list[Any] = [{"name": "get_weather", "description": "Weather of a city",
                              "input_schema": WEATHER}]
RESPONSES_TOOLS: list[Any] = [{"type": "function", "name": "get_weather", "description": "Weather of a city",
                               "parameters": WEATHER, "strict": False}]
CHAT_TOOLS: list[Any] = [{"type": "function", "function": {"name": "get_weather",
                                                           "description": "Weather of a city",
                                                           "parameters": WEATHER}}]
ASK_WEATHER = "What is the weather in Paris?"
RESULT = "sunny, 21 C"


@attrs.frozen
class Turns:
    """The first (a forced call) and the second turn (after the tool's result): usage and what came back."""

    first_input: int
    second_input: int
    second: Any


def _city_of(arguments: object) -> None:
    assert isinstance(arguments, dict) and isinstance(arguments.get("city"), str), arguments


def messages_tool_flow(client: anthropic.Anthropic, model: str) -> Turns:
    ask: list[Any] = [{"role": "user", "content": ASK_WEATHER}]
    reply = client.messages.create(model=model, max_tokens=64, messages=ask, tools=MESSAGES_TOOLS,
                                   tool_choice={"type": "any"})
    assert reply.model == model and reply.stop_reason == "tool_use", reply
    call = reply.content[-1]
    assert call.type == "tool_use" and call.name == "get_weather" and call.id
    _city_of(call.input)
    with client.messages.stream(model=model, max_tokens=64, messages=ask, tools=MESSAGES_TOOLS,
                                tool_choice={"type": "tool", "name": "get_weather"}) as stream:
        events = list(stream)
        final = stream.get_final_message()
    started = [e for e in events if e.type == "content_block_start"]
    assert started and started[-1].content_block.type == "tool_use"
    partial = "".join(e.delta.partial_json for e in events
                      if e.type == "content_block_delta" and e.delta.type == "input_json_delta")
    streamed = final.content[-1]
    assert streamed.type == "tool_use" and json.loads(partial) == streamed.input
    assert final.stop_reason == "tool_use" and final.model == model
    _city_of(streamed.input)
    second = client.messages.create(model=model, max_tokens=8, tools=MESSAGES_TOOLS, messages=[
        *ask, {"role": "assistant", "content": [block.model_dump() for block in reply.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": RESULT}]}])
    assert second.model == model
    return Turns(_messages_input(reply.usage), _messages_input(second.usage), second)


def _messages_input(usage: Any) -> int:
    return int(usage.input_tokens) + int(usage.cache_read_input_tokens or 0)


def responses_tool_flow(client: openai.OpenAI, model: str) -> Turns:
    reply = client.responses.create(model=model, input=ASK_WEATHER, tools=RESPONSES_TOOLS,
                                    tool_choice="required", max_output_tokens=64)
    assert reply.model == model
    call = reply.output[-1]
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id
    _city_of(json.loads(call.arguments))
    events = list(client.responses.create(model=model, input=ASK_WEATHER, tools=RESPONSES_TOOLS,
                                          tool_choice={"type": "function", "name": "get_weather"},
                                          max_output_tokens=64, stream=True))
    added = [e for e in events if e.type == "response.output_item.added"]
    assert added and added[-1].item.type == "function_call"
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = events[-1]
    assert done.type == "response.completed" and done.response.model == model
    streamed = done.response.output[-1]
    assert streamed.type == "function_call" and streamed.arguments == deltas
    _city_of(json.loads(deltas))
    assert reply.usage is not None
    second = client.responses.create(model=model, tools=RESPONSES_TOOLS, max_output_tokens=8, input=[
        {"role": "user", "content": ASK_WEATHER},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": RESULT}])
    assert second.model == model and second.usage is not None
    return Turns(reply.usage.input_tokens, second.usage.input_tokens, second)


def chat_tool_flow(client: openai.OpenAI, model: str) -> Turns:
    ask: list[Any] = [{"role": "user", "content": ASK_WEATHER}]
    reply = client.chat.completions.create(model=model, messages=ask, tools=CHAT_TOOLS,
                                           tool_choice="required", max_tokens=64)
    choice = reply.choices[0]
    assert reply.model == model and choice.finish_reason == "tool_calls", reply
    assert choice.message.tool_calls
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    _city_of(json.loads(call.function.arguments))
    chunks = list(client.chat.completions.create(model=model, messages=ask, tools=CHAT_TOOLS,
                                                 tool_choice="required", max_tokens=64, stream=True))
    pieces = [tool for chunk in chunks if chunk.choices for tool in chunk.choices[0].delta.tool_calls or []]
    assert pieces and pieces[0].id and pieces[0].function and pieces[0].function.name == "get_weather"
    _city_of(json.loads("".join(p.function.arguments or "" for p in pieces if p.function)))
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert {chunk.model for chunk in chunks} == {model}
    assert reply.usage is not None
    second = client.chat.completions.create(model=model, tools=CHAT_TOOLS, max_tokens=8, messages=[
        *ask, {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": RESULT}])
    assert second.model == model and second.usage is not None
    return Turns(reply.usage.prompt_tokens, second.usage.prompt_tokens, second)
