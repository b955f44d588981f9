"""Anthropic's Messages API over a chat-only backend (KoboldCpp): the request as chat completions, the chat
answer (plain and streamed) as a Messages answer the anthropic SDK parses, stop reasons, tool calls both
ways, images, errors in Anthropic's shape, and token counting through a raw-text tokenizer."""

from __future__ import annotations

import json

import pytest

from routerd.routing.adapters import AdapterError
from routerd.routing.adapters.chat_apis import anthropic
from routerd.routing.adapters.chat_apis.anthropic_stream import MessagesStream
from routerd.routing.work import usage_from_json, usage_from_tail
from tests.unit.chat_api_support import (
    anthropic_client,
    chat_answer,
    chunk,
    convert,
    text_stream,
    tool_stream,
)

WEATHER = {
    "name": "weather",
    "description": "Weather of a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def test_a_messages_request_becomes_chat_with_system_images_sampling_stops_and_stream_usage() -> None:
    body = {
        "model": "public",
        "max_tokens": 50,
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 40,
        "stop_sequences": ["END"],
        "stream": True,
        "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/jpeg", "data": "AAAA"},
                    },
                    {"type": "image", "source": {"type": "url", "url": "https://x.test/cat.png"}},
                ],
            },
            {"role": "assistant", "content": "A cat."},
            {"role": "user", "content": "Sure?"},
        ],
    }
    chat = anthropic.messages_to_chat(body, "local-7", stream=True)
    assert chat == {
        "model": "local-7",
        "max_tokens": 50,
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 40,
        "stop": ["END"],
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [
            {"role": "system", "content": "Be brief.\nBe kind."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,AAAA"}},
                    {"type": "image_url", "image_url": {"url": "https://x.test/cat.png"}},
                ],
            },
            {"role": "assistant", "content": "A cat."},
            {"role": "user", "content": "Sure?"},
        ],
    }
    assert "stream" not in anthropic.messages_to_chat({**body, "stream": False}, "m", stream=False)


def test_tools_tool_choice_tool_use_and_tool_result_become_chat_tools_tool_calls_and_tool_messages() -> None:
    body = {
        "max_tokens": 9,
        "tools": [WEATHER],
        "tool_choice": {"type": "tool", "name": "weather", "disable_parallel_tool_use": True},
        "messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [{"type": "text", "text": "-3 C"}],
                    },
                    {"type": "text", "text": "And tomorrow?"},
                ],
            },
        ],
    }
    chat = anthropic.messages_to_chat(body, "m", stream=False)
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "description": "Weather of a city",
                "parameters": WEATHER["input_schema"],
            },
        }
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "weather"}}
    assert chat["parallel_tool_calls"] is False
    assert chat["messages"][1:] == [
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "-3 C"},
        {"role": "user", "content": [{"type": "text", "text": "And tomorrow?"}]},
    ]
    for given, wanted in (
        ({"type": "auto"}, "auto"),
        ({"type": "any"}, "required"),
        ({"type": "none"}, "none"),
    ):
        assert anthropic.messages_to_chat({**body, "tool_choice": given}, "m", False)["tool_choice"] == wanted


@pytest.mark.parametrize(
    "bad",
    [
        {"messages": [{"role": "system", "content": "x"}]},
        {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
        {
            "messages": [
                {"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]}
            ]
        },
        {"messages": [], "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        {"messages": [], "tool_choice": {"type": "sometimes"}},
        {"messages": [], "stop_sequences": "END"},
    ],
)
def test_what_a_chat_backend_cannot_take_is_refused_as_the_clients_mistake(bad: dict[str, object]) -> None:
    with pytest.raises(AdapterError):
        anthropic.messages_to_chat(bad, "m", stream=False)


@pytest.mark.parametrize(
    ("finish", "choice", "stops", "reason", "sequence"),
    [
        ("stop", {}, ("END",), "end_turn", None),
        ("length", {}, (), "max_tokens", None),
        ("tool_calls", {}, (), "tool_use", None),
        ("stop", {"stop_reason": "END"}, ("END",), "stop_sequence", "END"),  # vLLM names the stop string
        ("stop", {"stop_reason": 2}, ("END",), "end_turn", None),  # an EOS token id is no stop sequence
    ],
)
def test_finish_reasons_become_stop_reasons(
    finish: str, choice: dict[str, object], stops: tuple[str, ...], reason: str, sequence: str | None
) -> None:
    answer = anthropic.chat_to_messages(chat_answer(finish=finish, **choice), "public", "msg_r1", stops)
    assert (answer["stop_reason"], answer["stop_sequence"]) == (reason, sequence)


def test_a_chat_answer_becomes_a_message_with_text_tool_use_usage_and_the_public_model() -> None:
    calls = [
        {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Oslo"}'}}
    ]
    chat = chat_answer("Let me check.", "tool_calls", calls, prompt=30, completion=8)
    chat["usage"]["prompt_tokens_details"] = {"cached_tokens": 10}
    answer = anthropic.chat_to_messages(chat, "public", "msg_r1")
    assert answer == {
        "id": "msg_r1",
        "type": "message",
        "role": "assistant",
        "model": "public",
        "content": [
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Oslo"}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 20,
            "cache_read_input_tokens": 10,
            "cache_creation_input_tokens": 0,
            "output_tokens": 8,
        },
    }
    assert usage_from_json(answer) == (30, 8)  # key limits charge the whole prompt, as for chat
    parsed = anthropic_client(json.dumps(answer).encode(), "application/json").messages.create(
        model="public", max_tokens=9, messages=[{"role": "user", "content": "hi"}]
    )
    assert parsed.content[1].type == "tool_use" and parsed.content[1].input == {"city": "Oslo"}


def test_a_backend_error_comes_back_in_anthropics_error_shape_with_its_message() -> None:
    body = json.loads(
        anthropic.error_to_anthropic(400, b'{"error":{"message":"prompt too long","type":"x"}}')
    )
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"] == "prompt too long"
    assert json.loads(anthropic.error_to_anthropic(503, b"busy"))["error"]["type"] == "overloaded_error"


def test_count_tokens_counts_the_requests_text_with_a_raw_text_tokenizer() -> None:
    body = {
        "system": "Be brief.",
        "tools": [WEATHER],
        "messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t", "name": "weather", "input": {"city": "Oslo"}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "-3 C"}]},
        ],
    }
    prompt = anthropic.count_tokens_request(body)["prompt"]
    lines = prompt.split("\n")
    assert lines[:4] == ["Be brief.", "Weather in Oslo?", 'weather {"city": "Oslo"}', "-3 C"]
    assert json.loads(lines[4])["function"]["name"] == "weather"
    assert anthropic.count_tokens_answer({"value": 17, "ids": [1] * 17}) == {"input_tokens": 17}
    assert anthropic.count_tokens_answer({"count": 5, "tokens": []}) == {"input_tokens": 5}
    assert anthropic.count_tokens_answer({"value": -1}) is None


# -- streams ---------------------------------------------------------------------------------------


def _events(out: bytes) -> list[tuple[str, dict[str, object]]]:
    found = []
    for block in out.decode().split("\n\n"):
        if block:
            name, data = block.split("\n", 1)
            found.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return found


@pytest.mark.parametrize("split", [0, 1, 7])
def test_a_streamed_text_answer_becomes_anthropics_events_that_the_sdk_accumulates(split: int) -> None:
    out = convert(*_converter(), text_stream(["Hel", "lo", " there"], "length", prompt=9), split)
    names = [name for name, _ in _events(out)]
    assert names == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    with anthropic_client(out).messages.stream(
        model="public", max_tokens=3, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        final = stream.get_final_message()
    assert final.model == "public" and final.id == "msg_r1" and final.content[0].text == "Hello there"
    assert final.stop_reason == "max_tokens"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (9, 3)
    assert usage_from_tail(out) == (9, 3)  # a master relaying it reads the usage from its last events


def _converter(stops: tuple[str, ...] = ()) -> tuple[object, object]:
    stream = MessagesStream("public", "msg_r1", stops)
    return stream.feed, stream.flush


def test_a_streamed_tool_call_becomes_a_tool_use_block_with_input_json_deltas() -> None:
    feed, flush = _converter()
    out = convert(feed, flush, tool_stream("weather", ['{"ci', 'ty": "Os', 'lo"}'], text="Checking."))  # type: ignore[arg-type]
    events = _events(out)
    starts = [data["content_block"] for name, data in events if name == "content_block_start"]
    assert [s["type"] for s in starts] == ["text", "tool_use"]  # type: ignore[index]
    assert starts[1] == {"type": "tool_use", "id": "call_9", "name": "weather", "input": {}}
    partial = [
        data["delta"]
        for name, data in events
        if name == "content_block_delta" and data["delta"]["type"] == "input_json_delta"
    ]  # type: ignore[index]
    assert "".join(d["partial_json"] for d in partial) == '{"city": "Oslo"}'  # type: ignore[index]
    with anthropic_client(out).messages.stream(
        model="public", max_tokens=30, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert final.content[0].type == "text" and final.content[0].text == "Checking."
    assert final.content[1].type == "tool_use" and final.content[1].input == {"city": "Oslo"}
    assert (final.usage.input_tokens, final.usage.output_tokens) == (20, 7)


def test_a_stream_stopped_at_a_named_stop_sequence_reports_it() -> None:
    stream = MessagesStream("public", "msg_r1", ("END",))
    out = convert(
        stream.feed,
        stream.flush,
        [chunk({"content": "a"}), chunk({}, "stop", {"stop_reason": "END"}), b"data: [DONE]\n\n"],
    )
    delta = next(data for name, data in _events(out) if name == "message_delta")
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}


@pytest.mark.parametrize(
    "chunks",
    [
        [chunk({"content": "a"}), b'data: {"error": {"message": "slot died"}}\n\n'],
        [chunk({"content": "a"}), b'error: {"message": "slot died"}\n\n'],
        [chunk({"content": "a"})],  # cut before it finished
    ],
)
def test_a_failing_or_cut_stream_ends_with_one_error_event(chunks: list[bytes]) -> None:
    stream = MessagesStream("public", "msg_r1")
    events = _events(convert(stream.feed, stream.flush, chunks))
    assert events[-1][0] == "error" and [name for name, _ in events].count("error") == 1
    assert "message_stop" not in [name for name, _ in events]


def test_a_stream_without_a_usage_chunk_reports_one_output_token_a_delta_chunk() -> None:
    """KoboldCpp v1.76 ignores ``stream_options.include_usage``: its stream carries one token a chunk and
    no usage, so the output is counted from the chunks (the prompt unknown: 0)."""
    stream = MessagesStream("public", "msg_r1")
    chunks = [
        chunk({"role": "assistant", "content": "a"}),
        chunk({"content": " b"}),
        chunk({"content": " c"}),
        chunk({}, "length"),
        b"data: [DONE]\n\n",
    ]
    delta = next(
        data for name, data in _events(convert(stream.feed, stream.flush, chunks)) if name == "message_delta"
    )
    assert delta["usage"]["output_tokens"] == 3 and delta["usage"]["input_tokens"] == 0


def test_tools_without_a_tool_choice_ask_for_auto_as_koboldcpp_offers_tools_only_then() -> None:
    body = {"max_tokens": 9, "tools": [WEATHER], "messages": [{"role": "user", "content": "Oslo?"}]}
    assert anthropic.messages_to_chat(body, "m", stream=False)["tool_choice"] == "auto"
    assert "tool_choice" not in anthropic.messages_to_chat({**body, "tools": None}, "m", stream=False)


def test_a_koboldcpp_tool_call_with_object_arguments_that_finished_stop_is_a_tool_use() -> None:
    """KoboldCpp v1.76 answers tool calls as the JSON its model wrote (``arguments`` an object) and
    ``finish_reason`` ``stop``: the client still gets a ``tool_use`` block and ``stop_reason``
    ``tool_use``."""
    calls = [{"id": "x", "type": "function", "function": {"name": "weather", "arguments": {"city": "Oslo"}}}]
    answer = anthropic.chat_to_messages(chat_answer(None, "stop", calls), "public", "msg_r1")
    assert answer["stop_reason"] == "tool_use"
    assert answer["content"] == [
        {"type": "tool_use", "id": "x", "name": "weather", "input": {"city": "Oslo"}}
    ]
