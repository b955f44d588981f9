"""A family that does not speak Messages, count-tokens or Responses (kobold) gets them planned as chat
completions (or its tokenizer's request), and the backend's answer comes back in the client's API: the
model its public ID, errors in the caller's API's shape, the tokens counted once from the chat usage."""

from __future__ import annotations

import json
from typing import Any

import pytest

from routerd.errors import HTTPError
from routerd.inference.answers import convert_answer
from routerd.routing.adapters import AdapterError
from routerd.routing.call import Call
from routerd.routing.classify import classify
from routerd.routing.plan import BackendPlan, plan_backend_call
from tests.support import FakeReply
from tests.unit.chat_api_support import chat_answer

ASK: dict[str, Any] = {
    "model": "public",
    "max_tokens": 8,
    "stop_sequences": ["END"],
    "system": "Be brief.",
    "messages": [{"role": "user", "content": "hi"}],
    "input": "hi",
}


def plan(path: str, body: dict[str, Any], stream: bool = False, family: str = "kobold") -> BackendPlan:
    route = classify("POST", path)
    assert route is not None
    return plan_backend_call(
        route, path, body, json.dumps(body).encode(), "application/json", "local-7", stream, family
    )


def call(path: str, body: dict[str, Any] = ASK) -> Call:
    route = classify("POST", path)
    assert route is not None
    return Call(
        reply=FakeReply(),
        route=route,
        path=path,
        body=json.dumps(body).encode(),
        content_type="application/json",
        parsed=body,
        stream=False,
        request_id="r42",
        started=0.0,
        selector="public",
    )


def test_kobold_gets_messages_and_responses_as_chat_completions_with_the_local_model_and_stream_usage() -> (
    None
):
    messages = plan("/v1/messages", {**ASK, "stream": True}, stream=True)
    assert (messages.path, messages.answer_format, messages.stream) == (
        "/v1/chat/completions",
        "anthropic",
        True,
    )
    sent = json.loads(messages.body)
    assert sent["model"] == "local-7" and sent["stop"] == ["END"]
    assert sent["messages"][0] == {"role": "system", "content": "Be brief."}
    assert sent["stream_options"] == {"include_usage": True}
    responses = plan("/v1/responses", {"model": "public", "input": "hi", "max_output_tokens": 3})
    assert (responses.path, responses.answer_format) == ("/v1/chat/completions", "responses")
    assert json.loads(responses.body) == {
        "model": "local-7",
        "max_tokens": 3,
        "messages": [{"role": "user", "content": "hi"}],
    }
    counted = plan("/v1/messages/count_tokens", ASK)
    assert (counted.path, counted.answer_format) == ("/api/extra/tokencount", "token_count")
    assert json.loads(counted.body) == {"prompt": "Be brief.\nhi"}


def test_a_request_the_translation_cannot_carry_is_the_clients_mistake() -> None:
    with pytest.raises(AdapterError):  # LocalInference answers it 400, in the caller's API's shape
        plan("/v1/responses", {"model": "public", "input": "hi", "tools": [{"type": "web_search"}]})


def test_a_translated_messages_answer_names_the_public_model_and_is_counted_once_from_the_chat_usage() -> (
    None
):
    asked = call("/v1/messages")
    ctype, body = convert_answer(
        asked,
        plan("/v1/messages", ASK),
        "public",
        200,
        "application/json",
        json.dumps(chat_answer("Hi.", prompt=12, completion=3)).encode(),
        100.0,
    )
    answer = json.loads(body)
    assert ctype == "application/json" and answer["model"] == "public" and answer["id"] == "msg_r42"
    assert answer["content"] == [{"type": "text", "text": "Hi."}] and answer["stop_reason"] == "end_turn"
    assert asked.outcome.work == (12.0, 3.0)


def test_a_translated_response_names_the_public_model_and_is_counted_from_the_chat_usage() -> None:
    asked = call("/v1/responses", {"model": "public", "input": "hi"})
    _ctype, body = convert_answer(
        asked,
        plan("/v1/responses", {"model": "public", "input": "hi"}),
        "public",
        200,
        "application/json",
        json.dumps(chat_answer("Hi.", "length")).encode(),
        100.0,
    )
    answer = json.loads(body)
    assert answer["model"] == "public" and answer["id"] == "resp_r42" and answer["created_at"] == 100
    assert answer["status"] == "incomplete" and asked.outcome.work == (12.0, 3.0)


def test_backend_errors_come_back_in_the_callers_api_shape() -> None:
    error = b'{"error":{"message":"context full","type":"invalid_request_error","code":400}}'
    asked = call("/v1/messages")
    _ctype, body = convert_answer(
        asked, plan("/v1/messages", ASK), "public", 400, "application/json", error, 0.0
    )
    assert json.loads(body)["type"] == "error" and json.loads(body)["error"]["message"] == "context full"
    assert asked.outcome.work == ()
    _ctype, body = convert_answer(
        call("/v1/responses"),
        plan("/v1/responses", {"input": "hi"}),
        "public",
        400,
        "application/json",
        error,
        0.0,
    )
    assert json.loads(body)["error"] == {
        "message": "context full",
        "type": "invalid_request_error",
        "code": 400,
    }


def test_a_translated_token_count_answers_input_tokens_and_a_countless_tokenizer_is_a_502() -> None:
    counted = plan("/v1/messages/count_tokens", ASK)
    asked = call("/v1/messages/count_tokens")
    _ctype, body = convert_answer(
        asked, counted, "public", 200, "application/json", b'{"value":7,"ids":[]}', 0.0
    )
    assert json.loads(body) == {"input_tokens": 7} and asked.outcome.work == ()
    with pytest.raises(HTTPError) as failed:
        convert_answer(asked, counted, "public", 200, "application/json", b'{"value":-1}', 0.0)
    assert failed.value.status == 502
