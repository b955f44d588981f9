"""OpenAI's Responses API over a chat-only backend (KoboldCpp): the request as chat completions, the chat
answer (plain and streamed) as a Response the openai SDK parses, function calls both ways, images, the
incomplete status, and usage the key limits count."""

from __future__ import annotations

import json
from typing import Any

import pytest

from routerd.routing.adapters import AdapterError
from routerd.routing.adapters.chat_apis import responses
from routerd.routing.adapters.chat_apis.responses_stream import ResponsesStream
from routerd.routing.work import usage_from_json, usage_from_tail
from tests.unit.chat_api_support import chat_answer, chunk, convert, openai_client, text_stream, tool_stream

WEATHER = {
    "type": "function",
    "name": "weather",
    "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def test_a_responses_request_becomes_chat_with_instructions_items_images_calls_and_outputs() -> None:
    body = {
        "model": "public",
        "instructions": "Be brief.",
        "max_output_tokens": 40,
        "temperature": 0.5,
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "name": "weather"},
        "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}},
        "input": [
            {"role": "developer", "content": "Use tools."},
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Weather here?"},
                    {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
                ],
            },
            {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": '{"city":"Oslo"}'},
            {"type": "function_call", "call_id": "call_2", "name": "weather", "arguments": '{"city":"Rome"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "-3 C"},
            {"type": "function_call_output", "call_id": "call_2", "output": "18 C"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
        ],
    }
    chat = responses.responses_to_chat(body, "local-7", stream=True)
    assert chat["model"] == "local-7" and chat["max_tokens"] == 40 and chat["temperature"] == 0.5
    assert chat["stream_options"] == {"include_usage": True}
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "description": "Weather of a city",
                "parameters": WEATHER["parameters"],
            },
        }
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "weather"}}
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "w", "schema": {"type": "object"}},
    }
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Use tools."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Weather here?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city":"Oslo"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city":"Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "-3 C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "18 C"},
    ]
    assert responses.responses_to_chat({"input": "hi"}, "m", False) == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
    }


@pytest.mark.parametrize(
    "bad",
    [
        {"input": "hi", "tools": [{"type": "web_search"}]},
        {"input": [{"type": "input_file", "file_id": "f"}]},
        {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
        {"input": [{"role": "tool", "content": "x"}]},
        {"input": "hi", "tool_choice": {"type": "file_search"}},
    ],
)
def test_what_a_chat_backend_cannot_take_is_refused_as_the_clients_mistake(bad: dict[str, Any]) -> None:
    with pytest.raises(AdapterError):
        responses.responses_to_chat(bad, "m", stream=False)


def test_a_chat_answer_becomes_a_response_with_a_message_and_function_calls_the_sdk_parses() -> None:
    calls = [
        {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Oslo"}'}}
    ]
    answer = responses.chat_to_response(
        chat_answer("Checking.", "tool_calls", calls, prompt=30, completion=8),
        "public",
        "resp_r1",
        1700000000,
        {"tools": [WEATHER]},
    )
    assert answer["model"] == "public" and answer["status"] == "completed" and answer["id"] == "resp_r1"
    assert [item["type"] for item in answer["output"]] == ["message", "function_call"]
    assert answer["usage"]["input_tokens"] == 30 and answer["usage"]["total_tokens"] == 38
    assert usage_from_json(answer) == (30, 8)
    parsed = openai_client(json.dumps(answer).encode(), "application/json").responses.create(
        model="public", input="hi"
    )
    assert parsed.output_text == "Checking."
    call = parsed.output[1]
    assert (
        call.type == "function_call"
        and call.call_id == "call_1"
        and json.loads(call.arguments) == {"city": "Oslo"}
    )


def test_an_answer_cut_at_its_token_limit_is_incomplete_for_max_output_tokens() -> None:
    answer = responses.chat_to_response(chat_answer("Hel", "length"), "public", "resp_r1", 0)
    assert answer["status"] == "incomplete" and answer["incomplete_details"] == {
        "reason": "max_output_tokens"
    }


# -- streams ---------------------------------------------------------------------------------------


def _events(out: bytes) -> list[dict[str, Any]]:
    return [json.loads(block.split("\ndata: ", 1)[1]) for block in out.decode().split("\n\n") if block]


@pytest.mark.parametrize("split", [0, 5])
def test_a_streamed_text_answer_becomes_the_responses_events_that_the_sdk_accumulates(split: int) -> None:
    stream = ResponsesStream("public", "resp_r1", 1700000000, {"input": "hi"})
    out = convert(stream.feed, stream.flush, text_stream(["Hel", "lo"], prompt=9), split)
    events = _events(out)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    with openai_client(out).responses.stream(model="public", input="hi") as sdk_stream:
        final = sdk_stream.get_final_response()
    assert final.model == "public" and final.output_text == "Hello" and final.status == "completed"
    assert final.usage is not None and (final.usage.input_tokens, final.usage.output_tokens) == (9, 2)
    assert usage_from_tail(out) == (9, 2)


def test_a_streamed_function_call_becomes_a_function_call_item_with_argument_deltas() -> None:
    stream = ResponsesStream("public", "resp_r1", 0)
    out = convert(
        stream.feed, stream.flush, tool_stream("weather", ['{"city":', ' "Oslo"}'], text="Checking.")
    )
    kinds = [e["type"] for e in _events(out)]
    assert kinds.count("response.function_call_arguments.delta") == 2
    assert "response.function_call_arguments.done" in kinds and kinds[-1] == "response.completed"
    with openai_client(out).responses.stream(model="public", input="hi") as sdk_stream:
        final = sdk_stream.get_final_response()
    assert [item.type for item in final.output] == ["message", "function_call"]
    call = final.output[1]
    assert call.type == "function_call" and call.name == "weather" and call.call_id == "call_9"
    assert json.loads(call.arguments) == {"city": "Oslo"}


def test_a_stream_cut_at_its_token_limit_ends_incomplete_and_a_failing_one_failed() -> None:
    stream = ResponsesStream("public", "resp_r1", 0)
    events = _events(convert(stream.feed, stream.flush, text_stream(["a", "b"], "length")))
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    stream = ResponsesStream("public", "resp_r1", 0)
    events = _events(
        convert(
            stream.feed,
            stream.flush,
            [chunk({"content": "a"}), b'data: {"error": {"message": "slot died"}}\n\n'],
        )
    )
    assert (
        events[-1]["type"] == "response.failed" and events[-1]["response"]["error"]["message"] == "slot died"
    )


def test_function_call_arguments_an_object_in_the_chat_answer_are_json_text_in_the_response() -> None:
    calls = [{"id": "x", "type": "function", "function": {"name": "weather", "arguments": {"city": "Oslo"}}}]
    answer = responses.chat_to_response(chat_answer(None, "stop", calls), "public", "resp_r1", 0)
    assert answer["output"] == [responses.call_item("fc_x", "x", "weather", '{"city": "Oslo"}')]
    assert (
        responses.responses_to_chat({"input": "hi", "tools": [WEATHER]}, "m", False)["tool_choice"] == "auto"
    )
