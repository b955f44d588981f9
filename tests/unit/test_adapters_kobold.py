"""Kobold /api/v1/generate <-> llama-server /completion (routerd.routing.adapters.kobold)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from routerd.routing.adapters import AdapterError
from routerd.routing.adapters.kobold import (
    COMPLETION_PATH,
    DEFAULT_MAX_LENGTH,
    kobold_generate_to_llama,
    llama_completion_to_kobold,
    llama_error_to_kobold,
)


def test_generate_maps_to_native_completion_with_renamed_sampling_fields() -> None:
    path, body = kobold_generate_to_llama(
        {
            "prompt": "Once upon",
            "max_length": 42,
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": 40,
            "rep_pen": 1.1,
            "rep_pen_range": 256,
            "typical": 0.95,
            "min_p": 0.05,
            "sampler_seed": 3,
            "stop_sequence": ["\nUser:"],
            "max_context_length": 4096,
            "trim_stop": True,
        }
    )
    assert path == COMPLETION_PATH == "/completion"
    assert body == {
        "prompt": "Once upon",
        "n_predict": 42,
        "temperature": 0.7,
        "top_p": 0.9,
        "min_p": 0.05,
        "typical_p": 0.95,
        "repeat_penalty": 1.1,
        "top_k": 40,
        "repeat_last_n": 256,
        "seed": 3,
        "stop": ["\nUser:"],
        "stream": False,
    }


def test_max_length_defaults_to_kobold_100() -> None:
    _, body = kobold_generate_to_llama({"prompt": "x"})
    assert body["n_predict"] == DEFAULT_MAX_LENGTH == 100


def test_memory_is_prepended_to_prompt_and_model_kept_for_routing() -> None:
    _, body = kobold_generate_to_llama({"prompt": "now", "memory": "[story] ", "model": "m"})
    assert body["prompt"] == "[story] now"
    assert body["model"] == "m"


def test_single_stop_string_becomes_list_and_grammar_is_kept() -> None:
    _, body = kobold_generate_to_llama({"prompt": "x", "stop_sequence": "END", "grammar": "root ::= [a-z]+"})
    assert body["stop"] == ["END"]
    assert body["grammar"] == "root ::= [a-z]+"


@pytest.mark.parametrize(
    "bad",
    [
        [],
        {},
        {"prompt": 1},
        {"prompt": "x", "max_length": "long"},
        {"prompt": "x", "temperature": "hot"},
        {"prompt": "x", "top_k": 1.5},
        {"prompt": "x", "stop_sequence": [1]},
        {"prompt": "x", "memory": 5},
    ],
)
def test_malformed_kobold_bodies_raise_adapter_error(bad: Any) -> None:
    with pytest.raises(AdapterError):
        kobold_generate_to_llama(bad)


def test_completion_answer_becomes_kobold_results() -> None:
    resp = {
        "content": " there was a cat.",
        "stop": True,
        "stop_type": "eos",
        "tokens_evaluated": 3,
        "tokens_predicted": 6,
        "model": "local",
    }
    assert llama_completion_to_kobold(resp) == {
        "results": [
            {
                "text": " there was a cat.",
                "finish_reason": "stop",
                "logprobs": None,
                "prompt_tokens": 3,
                "completion_tokens": 6,
            }
        ]
    }


@pytest.mark.parametrize(
    ("resp", "reason"),
    [
        ({"content": "a", "stop_type": "limit"}, "length"),
        ({"content": "a", "stop_type": "word", "stopping_word": "END"}, "stop"),
        ({"content": "a", "stopped_limit": True, "stopped_eos": False}, "length"),
        ({"content": "a", "stopped_eos": True}, "stop"),
    ],
)
def test_finish_reason_is_length_when_n_predict_was_hit(resp: dict[str, Any], reason: str) -> None:
    assert llama_completion_to_kobold(resp)["results"][0]["finish_reason"] == reason


def test_missing_content_gives_empty_text() -> None:
    assert llama_completion_to_kobold({})["results"][0]["text"] == ""


def test_errors_become_kobold_detail_objects() -> None:
    body = b'{"error": {"code": 400, "message": "prompt too long", "type": "invalid_request_error"}}'
    assert json.loads(llama_error_to_kobold(400, body)) == {
        "detail": {"msg": "prompt too long", "type": "bad_input"}
    }
    assert json.loads(llama_error_to_kobold(503, b"")) == {
        "detail": {"msg": "backend returned HTTP 503", "type": "service_unavailable"}
    }
