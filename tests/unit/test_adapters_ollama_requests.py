"""Ollama request bodies -> OpenAI request bodies (routerd.routing.adapters.ollama)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import ollama
import pytest

from routerd.routing.adapters import AdapterError
from routerd.routing.adapters.ollama import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    EMBEDDINGS_PATH,
    image_data_url,
    is_ollama_load_request,
    ollama_chat_to_openai,
    ollama_embed_to_openai,
    ollama_generate_to_openai,
    ollama_load_response,
)

PNG_B64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGBgAAAABQABXvMqGgAAAABJRU5ErkJggg=="
JPEG_B64 = "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDAAgGBgcGBQgHBwcJCQgKDBQNDAsLDBkSEw8UHRofHh0aHBwgJC4nICIs"


def test_chat_maps_to_chat_completions_path_and_keeps_model_and_messages() -> None:
    path, body = ollama_chat_to_openai(
        {
            "model": "m",
            "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        }
    )
    assert path == CHAT_PATH == "/v1/chat/completions"
    assert body["model"] == "m"
    assert body["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def test_chat_streams_by_default_and_asks_backend_for_usage() -> None:
    _, body = ollama_chat_to_openai({"model": "m", "messages": []})
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


def test_chat_stream_false_is_not_streamed_and_has_no_stream_options() -> None:
    _, body = ollama_chat_to_openai({"model": "m", "messages": [], "stream": False})
    assert body["stream"] is False
    assert "stream_options" not in body


def test_chat_stream_null_means_default_true() -> None:
    _, body = ollama_chat_to_openai({"model": "m", "messages": [], "stream": None})
    assert body["stream"] is True


def test_chat_images_become_text_and_image_url_data_url_parts() -> None:
    _, body = ollama_chat_to_openai(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "what is this?", "images": [PNG_B64, JPEG_B64]}],
        }
    )
    assert body["messages"][0]["content"] == [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}"}},
        {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{JPEG_B64}"}},
    ]


def test_image_data_url_defaults_to_png_and_keeps_existing_data_urls() -> None:
    assert image_data_url("AAAA") == "data:image/png;base64,AAAA"
    assert image_data_url("data:image/webp;base64,UklGR") == "data:image/webp;base64,UklGR"
    assert image_data_url("iVBO\nRw0KGgo=") == "data:image/png;base64,iVBORw0KGgo="


def test_chat_image_without_text_gives_only_image_parts() -> None:
    _, body = ollama_chat_to_openai({"model": "m", "messages": [{"role": "user", "images": [PNG_B64]}]})
    assert body["messages"][0]["content"] == [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}"}}
    ]


def test_options_map_to_openai_sampling_fields() -> None:
    _, body = ollama_chat_to_openai(
        {
            "model": "m",
            "messages": [],
            "options": {
                "num_predict": 64,
                "temperature": 0.2,
                "top_p": 0.9,
                "top_k": 40,
                "seed": 7,
                "stop": ["\n\n", "END"],
                "repeat_penalty": 1.1,
                "min_p": 0.05,
                "num_ctx": 8192,
                "num_gpu": 99,
            },
        }
    )
    assert body["max_tokens"] == 64
    assert body["temperature"] == 0.2
    assert body["top_p"] == 0.9
    assert body["top_k"] == 40
    assert body["seed"] == 7
    assert body["stop"] == ["\n\n", "END"]
    assert body["repeat_penalty"] == 1.1
    assert body["min_p"] == 0.05
    assert "num_ctx" not in body and "num_gpu" not in body and "options" not in body


def test_num_predict_negative_means_no_limit() -> None:
    for n in (-1, -2):
        _, body = ollama_chat_to_openai({"model": "m", "messages": [], "options": {"num_predict": n}})
        assert "max_tokens" not in body


def test_stop_string_becomes_list() -> None:
    _, body = ollama_chat_to_openai({"model": "m", "messages": [], "options": {"stop": "###"}})
    assert body["stop"] == ["###"]


def test_format_json_becomes_json_object_response_format() -> None:
    _, body = ollama_chat_to_openai({"model": "m", "messages": [], "format": "json"})
    assert body["response_format"] == {"type": "json_object"}


def test_format_schema_becomes_json_schema_response_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    _, body = ollama_chat_to_openai({"model": "m", "messages": [], "format": schema})
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "response", "schema": schema},
    }


def test_tools_pass_through_and_tool_calls_round_trip_with_ids() -> None:
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    _, body = ollama_chat_to_openai(
        {
            "model": "m",
            "tools": tools,
            "messages": [
                {"role": "user", "content": "weather?"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"function": {"name": "weather", "arguments": {"city": "Oslo"}}}],
                },
                {"role": "tool", "tool_name": "weather", "content": "sunny"},
            ],
        }
    )
    assert body["tools"] == tools
    call = body["messages"][1]["tool_calls"][0]
    assert call["type"] == "function"
    assert call["function"] == {"name": "weather", "arguments": '{"city": "Oslo"}'}
    assert body["messages"][2]["tool_call_id"] == call["id"]
    assert body["messages"][2]["role"] == "tool"


@pytest.mark.parametrize(
    "bad",
    [
        [],
        {"messages": []},
        {"model": "", "messages": []},
        {"model": "m", "messages": "hi"},
        {"model": "m", "messages": [{"content": "no role"}]},
        {"model": "m", "messages": [{"role": "user", "content": 3}]},
        {"model": "m", "messages": [{"role": "user", "images": "notalist"}]},
        {"model": "m", "messages": [], "stream": "yes"},
        {"model": "m", "messages": [], "options": {"temperature": "hot"}},
        {"model": "m", "messages": [], "options": {"num_predict": 1.5}},
        {"model": "m", "messages": [], "options": []},
        {"model": "m", "messages": [], "format": "xml"},
    ],
)
def test_malformed_chat_bodies_raise_adapter_error(bad: Any) -> None:
    with pytest.raises(AdapterError):
        ollama_chat_to_openai(bad)


def test_generate_maps_to_completions_with_system_prefix() -> None:
    path, body = ollama_generate_to_openai({"model": "m", "prompt": "Say hi", "system": "You are terse."})
    assert path == COMPLETIONS_PATH == "/v1/completions"
    assert body["model"] == "m"
    assert body["prompt"] == "You are terse.\n\nSay hi"


def test_generate_without_system_sends_prompt_unchanged_and_raw_ignores_system() -> None:
    _, body = ollama_generate_to_openai({"model": "m", "prompt": "p"})
    assert body["prompt"] == "p"
    _, raw = ollama_generate_to_openai({"model": "m", "prompt": "p", "system": "s", "raw": True})
    assert raw["prompt"] == "p"


def test_generate_streams_by_default_and_maps_options_and_format() -> None:
    _, body = ollama_generate_to_openai(
        {"model": "m", "prompt": "p", "format": "json", "options": {"num_predict": 5, "temperature": 0}}
    )
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 5
    assert body["temperature"] == 0
    assert body["response_format"] == {"type": "json_object"}


def test_generate_with_images_uses_chat_completions_with_image_parts() -> None:
    path, body = ollama_generate_to_openai(
        {"model": "m", "prompt": "describe", "system": "sys", "images": [PNG_B64], "stream": False}
    )
    assert path == CHAT_PATH
    assert "prompt" not in body
    assert body["messages"] == [
        {"role": "system", "content": "sys"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "describe"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}"}},
            ],
        },
    ]
    assert body["stream"] is False


def test_embed_accepts_string_or_list_input() -> None:
    path, body = ollama_embed_to_openai({"model": "e", "input": "hello"})
    assert path == EMBEDDINGS_PATH == "/v1/embeddings"
    assert body == {"model": "e", "input": "hello"}
    _, body = ollama_embed_to_openai({"model": "e", "input": ["a", "b"], "truncate": True})
    assert body == {"model": "e", "input": ["a", "b"]}


@pytest.mark.parametrize(
    "bad", [{"model": "e"}, {"model": "e", "input": 3}, {"input": "x"}, {"model": "e", "input": [1]}]
)
def test_malformed_embed_bodies_raise_adapter_error(bad: dict[str, Any]) -> None:
    with pytest.raises(AdapterError):
        ollama_embed_to_openai(bad)


def test_load_only_requests_are_recognised_and_answered_with_done_reason_load() -> None:
    assert is_ollama_load_request("chat", {"model": "m"})
    assert is_ollama_load_request("chat", {"model": "m", "messages": []})
    assert not is_ollama_load_request("chat", {"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert is_ollama_load_request("generate", {"model": "m", "prompt": ""})
    assert not is_ollama_load_request("generate", {"model": "m", "prompt": "", "images": [PNG_B64]})
    chat = ollama_load_response("chat", "m", "2024-01-01T00:00:00Z")
    assert ollama.ChatResponse(**chat).done_reason == "load"
    gen = ollama_load_response("generate", "m", "2024-01-01T00:00:00Z")
    assert ollama.GenerateResponse(**gen).done is True


def _captured_request(call: Any) -> dict[str, Any]:
    """Run a real ollama-client call against a mock transport and return the JSON it sent."""
    seen: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(500, json={"error": "stop here"})

    client = ollama.Client(host="http://ollama.test", transport=httpx.MockTransport(handler))
    with pytest.raises(ollama.ResponseError):
        call(client)
    return seen[0]


def test_real_client_chat_request_with_image_bytes_translates_to_data_url() -> None:
    import base64

    raw_png = base64.b64decode(PNG_B64)
    sent = _captured_request(
        lambda c: c.chat(model="m", messages=[{"role": "user", "content": "hi", "images": [raw_png]}])
    )
    path, body = ollama_chat_to_openai(sent)
    assert path == CHAT_PATH
    assert body["stream"] is False  # the python client sends stream=false explicitly
    url = body["messages"][0]["content"][1]["image_url"]["url"]
    assert url == f"data:image/png;base64,{PNG_B64}"


def test_real_client_generate_and_embed_requests_translate() -> None:
    sent = _captured_request(lambda c: c.generate(model="m", prompt="p", options={"num_predict": 3}))
    path, body = ollama_generate_to_openai(sent)
    assert (path, body["prompt"], body["max_tokens"]) == (COMPLETIONS_PATH, "p", 3)
    sent = _captured_request(lambda c: c.embed(model="e", input=["a", "b"]))
    assert ollama_embed_to_openai(sent) == (EMBEDDINGS_PATH, {"model": "e", "input": ["a", "b"]})
