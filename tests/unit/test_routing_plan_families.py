"""How a request is planned per backend family: speech and Kobold routes."""

from __future__ import annotations

import json

import pytest

from routerd.errors import HTTPError
from routerd.routing.classify import classify
from routerd.routing.plan import plan_backend_call


def plan(path: str, body: dict[str, object], family: str) -> object:
    route = classify("POST", path)
    assert route is not None
    raw = json.dumps(body).encode()
    return plan_backend_call(route, path, body, raw, "application/json", "local-id", False, family)


@pytest.mark.parametrize("path", ["/v1/audio/speech", "/api/extra/tts"])
def test_speech_stays_unsupported_under_llama_sdcpp(path: str) -> None:
    with pytest.raises(HTTPError) as info:
        plan(path, {"model": "voice", "input": "hi"}, "llama_sdcpp")
    assert info.value.status == 501 and info.value.type == "unsupported_backend"
    assert info.value.message == "audio route is not supported by the selected split backend config"


@pytest.mark.parametrize("family", ["kobold", "vllm"])
def test_speech_passes_through_with_the_local_model_id(family: str) -> None:
    planned = plan("/v1/audio/speech", {"model": "public", "input": "hi"}, family)
    assert planned.path == "/v1/audio/speech"  # type: ignore[attr-defined]
    assert json.loads(planned.body)["model"] == "local-id"  # type: ignore[attr-defined]


def test_kobold_generate_goes_to_koboldcpp_unchanged_but_to_llama_as_completion() -> None:
    body = {"prompt": "hi", "max_length": 3}
    assert plan("/api/v1/generate", body, "kobold").path == "/api/v1/generate"  # type: ignore[attr-defined]
    assert plan("/api/v1/generate", body, "llama_sdcpp").path == "/completion"  # type: ignore[attr-defined]
    assert plan("/api/extra/tts", {"input": "x"}, "kobold").path == "/api/extra/tts"  # type: ignore[attr-defined]


@pytest.mark.parametrize("path", ["/api/v1/generate", "/api/extra/tts", "/completion"])
def test_vllm_refuses_routes_it_has_no_counterpart_for(path: str) -> None:
    with pytest.raises(HTTPError) as info:
        plan(path, {"prompt": "hi", "input": "x"}, "vllm")
    assert info.value.status == 501 and "vllm" in info.value.message


def test_kobold_transcribe_under_llama_sdcpp_becomes_a_whisper_form_with_the_decoded_audio() -> None:
    import base64

    planned = plan("/api/extra/transcribe", {"model": "ears", "audio_data": "data:audio/wav;base64,"
                                             + base64.b64encode(b"RIFFwav").decode(), "langcode": "de"},
                   "llama_sdcpp")
    assert planned.path == "/inference" and planned.answer_format == "whisper"  # type: ignore[attr-defined]
    body = planned.body  # type: ignore[attr-defined]
    assert b"RIFFwav" in body and b'name="language"' in body and b"\r\nde\r\n" in body


def test_kobold_transcribe_passes_through_on_kobold() -> None:
    planned = plan("/api/extra/transcribe", {"model": "ears", "audio_data": "UklGRg=="}, "kobold")
    assert planned.path == "/api/extra/transcribe" and planned.answer_format == "openai"  # type: ignore[attr-defined]
