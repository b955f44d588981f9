"""OpenAI audio transcription/translation forms <-> whisper-server /inference."""

from __future__ import annotations

import json

import pytest

from routerd.routing.adapters import AdapterError
from routerd.routing.adapters.whisper import (
    INFERENCE_PATH,
    FormField,
    WhisperError,
    openai_transcription_to_whisper,
    requested_response_format,
    whisper_error_to_openai,
    whisper_to_openai,
)

WAV = b"RIFF\x24\x00\x00\x00WAVEfmt "
FILE: FormField = ("file", "clip.wav", "audio/wav", WAV)


def as_dict(fields: list[FormField]) -> dict[str, FormField]:
    return {f[0]: f for f in fields}


def test_inference_path_is_whisper_server_endpoint() -> None:
    assert INFERENCE_PATH == "/inference"


def test_transcription_keeps_file_language_temperature_prompt_and_drops_model() -> None:
    fields: list[FormField] = [
        ("model", None, None, b"whisper-1"),
        FILE,
        ("language", None, None, b"de"),
        ("temperature", None, None, b"0.2"),
        ("prompt", None, None, b"Vokabeln"),
        ("response_format", None, None, b"verbose_json"),
        ("timestamp_granularities[]", None, None, b"word"),
    ]
    out = openai_transcription_to_whisper(fields)
    assert out[0] == FILE
    assert as_dict(out) == {
        "file": FILE,
        "language": ("language", None, None, b"de"),
        "temperature": ("temperature", None, None, b"0.2"),
        "prompt": ("prompt", None, None, b"Vokabeln"),
        "response_format": ("response_format", None, None, b"verbose_json"),
    }


def test_response_format_defaults_to_json_and_is_sent_explicitly() -> None:
    out = as_dict(openai_transcription_to_whisper([FILE]))
    assert out["response_format"][3] == b"json"
    assert "translate" not in out


@pytest.mark.parametrize("fmt", ["json", "text", "verbose_json", "srt", "vtt"])
def test_every_openai_response_format_is_passed_as_is(fmt: str) -> None:
    out = as_dict(openai_transcription_to_whisper([FILE, ("response_format", None, None, fmt.encode())]))
    assert out["response_format"][3] == fmt.encode()
    assert requested_response_format([FILE, ("response_format", None, None, fmt.encode())]) == fmt


def test_translation_adds_translate_true() -> None:
    out = as_dict(openai_transcription_to_whisper([FILE, ("model", None, None, b"w")], translate=True))
    assert out["translate"] == ("translate", None, None, b"true")
    assert "model" not in out


def test_file_without_name_or_type_gets_defaults() -> None:
    out = openai_transcription_to_whisper([("file", None, None, WAV)])
    assert out[0] == ("file", "audio.wav", "application/octet-stream", WAV)


@pytest.mark.parametrize(
    "fields",
    [
        [("model", None, None, b"w")],
        [("file", "a.wav", None, b"")],
        [FILE, ("response_format", None, None, b"mp3")],
        [FILE, ("temperature", None, None, b"warm")],
        [FILE, ("language", None, None, b"\xff")],
    ],
)
def test_bad_forms_raise_adapter_error(fields: list[FormField]) -> None:
    with pytest.raises(AdapterError):
        openai_transcription_to_whisper(fields)


def test_requested_response_format_defaults_to_json() -> None:
    assert requested_response_format([FILE]) == "json"


def test_json_answer_becomes_openai_text_object() -> None:
    ctype, body = whisper_to_openai(b'{"text": " Hello world.\\n"}', "json")
    assert ctype == "application/json"
    assert json.loads(body) == {"text": "Hello world."}


def test_verbose_json_answer_is_passed_through() -> None:
    verbose = {"task": "transcribe", "language": "english", "duration": 1.5, "text": " Hi", "segments": []}
    ctype, body = whisper_to_openai(json.dumps(verbose).encode(), "verbose_json")
    assert ctype == "application/json"
    assert json.loads(body) == verbose


@pytest.mark.parametrize("fmt", ["text", "srt", "vtt"])
def test_text_formats_are_returned_as_text_plain(fmt: str) -> None:
    payload = b"1\n00:00:00,000 --> 00:00:01,000\nHi\n"
    assert whisper_to_openai(payload, fmt) == ("text/plain; charset=utf-8", payload)


@pytest.mark.parametrize(
    ("body", "fmt"),
    [
        (b'{"error": "failed to read audio data"}', "json"),
        (b'{"error": "failed to read audio data"}', "text"),
        (b"not json", "json"),
        (b"[1, 2]", "verbose_json"),
    ],
)
def test_whisper_errors_and_unreadable_answers_raise_whisper_error(body: bytes, fmt: str) -> None:
    with pytest.raises(WhisperError):
        whisper_to_openai(body, fmt)


def test_whisper_error_body_becomes_openai_error_object() -> None:
    out = json.loads(whisper_error_to_openai(400, b'{"error": "no file"}'))
    assert out == {
        "error": {"message": "no file", "type": "invalid_request_error", "code": "invalid_request_error"}
    }
    out = json.loads(whisper_error_to_openai(500, b""))
    assert out["error"]["message"] == "backend returned HTTP 500"
    assert out["error"]["type"] == "server_error"
