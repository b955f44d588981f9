"""Non-streaming OpenAI answers and errors -> Ollama answers (routerd.routing.adapters.ollama)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import ollama
import pytest
from ollama._types import ChatResponse, EmbedResponse, GenerateResponse

from routerd.routing.adapters.ollama import (
    error_message_from_body,
    iso_utc,
    ollama_chat_to_openai,
    ollama_embed_to_openai,
    ollama_generate_to_openai,
    openai_chat_to_ollama,
    openai_completion_to_ollama_generate,
    openai_embeddings_to_ollama_embed,
    openai_error_to_ollama,
)

NOW = "2024-05-01T12:00:00.000000Z"


def chat_completion(content: Any = "Hello!", finish: str = "stop", **extra: Any) -> dict[str, Any]:
    resp: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1714564800,
        "model": "local-id",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}
        ],
        "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14},
    }
    resp.update(extra)
    return resp


def test_iso_utc_formats_epoch_seconds_as_rfc3339_utc() -> None:
    assert iso_utc(0) == "1970-01-01T00:00:00.000000Z"
    assert iso_utc(1714564800.25) == "2024-05-01T12:00:00.250000Z"


def test_chat_answer_becomes_ollama_chat_response_with_counts() -> None:
    out = openai_chat_to_ollama(chat_completion(), "public", NOW, 5_000_000)
    assert out["model"] == "public"
    assert out["created_at"] == NOW
    assert out["message"] == {"role": "assistant", "content": "Hello!"}
    assert out["done"] is True
    assert out["done_reason"] == "stop"
    assert out["total_duration"] == 5_000_000
    assert out["load_duration"] == 0
    assert out["prompt_eval_count"] == 11
    assert out["eval_count"] == 3
    parsed = ChatResponse(**out)
    assert parsed.message.content == "Hello!" and parsed.eval_count == 3


def test_chat_finish_length_gives_done_reason_length() -> None:
    out = openai_chat_to_ollama(chat_completion(finish="length"), "p", NOW, 1)
    assert out["done_reason"] == "length"
    out = openai_chat_to_ollama(chat_completion(finish="tool_calls"), "p", NOW, 1)
    assert out["done_reason"] == "stop"


def test_chat_durations_come_from_llama_server_timings_when_present() -> None:
    resp = chat_completion(
        timings={"prompt_n": 11, "prompt_ms": 12.5, "predicted_n": 3, "predicted_ms": 40.0}
    )
    out = openai_chat_to_ollama(resp, "p", NOW, 60_000_000)
    assert out["prompt_eval_duration"] == 12_500_000
    assert out["eval_duration"] == 40_000_000


def test_chat_counts_fall_back_to_timings_without_usage() -> None:
    resp = chat_completion(timings={"prompt_n": 4, "prompt_ms": 1, "predicted_n": 2, "predicted_ms": 1})
    del resp["usage"]
    out = openai_chat_to_ollama(resp, "p", NOW, 1)
    assert (out["prompt_eval_count"], out["eval_count"]) == (4, 2)


def test_chat_null_content_reasoning_and_tool_calls_are_mapped() -> None:
    resp = chat_completion(content=None, finish="tool_calls")
    resp["choices"][0]["message"]["reasoning_content"] = "thinking hard"
    resp["choices"][0]["message"]["tool_calls"] = [
        {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Oslo"}'}}
    ]
    out = openai_chat_to_ollama(resp, "p", NOW, 1)
    assert out["message"]["content"] == ""
    assert out["message"]["thinking"] == "thinking hard"
    assert out["message"]["tool_calls"] == [{"function": {"name": "weather", "arguments": {"city": "Oslo"}}}]
    parsed = ChatResponse(**out)
    assert parsed.message.tool_calls is not None
    assert parsed.message.tool_calls[0].function.arguments == {"city": "Oslo"}


def test_completion_answer_becomes_ollama_generate_response() -> None:
    resp = {
        "object": "text_completion",
        "choices": [{"index": 0, "text": "42", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 1},
    }
    out = openai_completion_to_ollama_generate(resp, "public", NOW, 9)
    assert out["response"] == "42"
    assert out["done"] is True
    assert out["done_reason"] == "length"
    assert out["context"] == []
    assert (out["prompt_eval_count"], out["eval_count"], out["total_duration"]) == (7, 1, 9)
    parsed = GenerateResponse(**out)
    assert parsed.response == "42" and parsed.model == "public"


def test_generate_accepts_chat_shaped_answer_from_image_requests() -> None:
    out = openai_completion_to_ollama_generate(chat_completion(content="a cat"), "p", NOW, 1)
    assert out["response"] == "a cat"


def test_embeddings_answer_becomes_ollama_embed_response_in_input_order() -> None:
    resp = {
        "object": "list",
        "data": [
            {"object": "embedding", "index": 1, "embedding": [0.3, 0.4]},
            {"object": "embedding", "index": 0, "embedding": [0.1, 0.2]},
        ],
        "usage": {"prompt_tokens": 6, "total_tokens": 6},
    }
    out = openai_embeddings_to_ollama_embed(resp, "public")
    assert out == {"model": "public", "embeddings": [[0.1, 0.2], [0.3, 0.4]], "prompt_eval_count": 6}
    parsed = EmbedResponse(**out)
    assert list(parsed.embeddings[1]) == [0.3, 0.4]
    timed = openai_embeddings_to_ollama_embed(resp, "public", total_ns=3)
    assert timed["total_duration"] == 3 and timed["load_duration"] == 0


def test_durations_carry_the_load_the_request_waited_for_within_its_total() -> None:
    """Ollama's ``load_duration`` is the model load inside ``total_duration`` (both nanoseconds)."""
    chat = openai_chat_to_ollama(chat_completion(), "p", NOW, 900_000_000, 600_000_000)
    generate = openai_completion_to_ollama_generate(chat_completion(), "p", NOW, 900_000_000, 600_000_000)
    embed = openai_embeddings_to_ollama_embed({"data": []}, "p", 900_000_000, 600_000_000)
    for out in (chat, generate, embed):
        assert (out["total_duration"], out["load_duration"]) == (900_000_000, 600_000_000)
    # without the backend's timings, the evaluation is what is left after the load
    untimed = openai_chat_to_ollama({"choices": []}, "p", NOW, 900_000_000, 600_000_000)
    assert (untimed["prompt_eval_duration"], untimed["eval_duration"]) == (0, 300_000_000)


def test_openai_error_object_becomes_ollama_error_string() -> None:
    body = json.dumps(
        {"error": {"message": "context too long", "type": "invalid_request_error", "code": 400}}
    )
    assert json.loads(openai_error_to_ollama(400, body.encode())) == {"error": "context too long"}


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (500, b'{"error": "already a string"}', "already a string"),
        (503, b'{"message": "Loading model"}', "Loading model"),
        (502, b"upstream exploded\n", "upstream exploded"),
        (504, b"", "backend returned HTTP 504"),
        (500, b"\xff\xfe", "\ufffd\ufffd"),
    ],
)
def test_error_bodies_of_any_shape_give_a_message(status: int, body: bytes, message: str) -> None:
    assert error_message_from_body(status, body) == message
    assert json.loads(openai_error_to_ollama(status, body)) == {"error": message}


def test_real_client_reads_converted_non_streaming_answers_and_errors() -> None:
    """The ollama python client, over a mock transport, accepts what the adapters produce."""

    def handler(request: httpx.Request) -> httpx.Response:
        sent = json.loads(request.content)
        if request.url.path == "/api/chat":
            if sent["messages"][0]["content"] == "fail":
                err = b'{"error": {"message": "model crashed", "type": "server_error"}}'
                return httpx.Response(500, content=openai_error_to_ollama(500, err))
            _, body = ollama_chat_to_openai(sent)
            assert body["stream"] is False
            return httpx.Response(200, json=openai_chat_to_ollama(chat_completion(), sent["model"], NOW, 1))
        if request.url.path == "/api/generate":
            ollama_generate_to_openai(sent)
            resp = {"choices": [{"index": 0, "text": "gen", "finish_reason": "stop"}]}
            return httpx.Response(200, json=openai_completion_to_ollama_generate(resp, sent["model"], NOW, 1))
        ollama_embed_to_openai(sent)
        resp = {"data": [{"index": 0, "embedding": [1.0]}], "usage": {"prompt_tokens": 1}}
        return httpx.Response(200, json=openai_embeddings_to_ollama_embed(resp, sent["model"]))

    client = ollama.Client(host="http://ollama.test", transport=httpx.MockTransport(handler))
    chat = client.chat(model="pub", messages=[{"role": "user", "content": "hi"}])
    assert chat.message.content == "Hello!" and chat.done_reason == "stop" and chat.model == "pub"
    assert client.generate(model="pub", prompt="x").response == "gen"
    assert list(client.embed(model="pub", input="x").embeddings[0]) == [1.0]
    with pytest.raises(ollama.ResponseError) as info:
        client.chat(model="pub", messages=[{"role": "user", "content": "fail"}])
    assert info.value.error == "model crashed"
    assert info.value.status_code == 500
