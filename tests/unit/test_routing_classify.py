"""Request classification: route table, methods, error styles, stream defaults."""

from __future__ import annotations

import pytest

from routerd.routing.classify import (
    INFERENCE_PATHS,
    Route,
    allowed_methods,
    classify,
    error_style_for_path,
    normalize_path,
    wants_stream,
)

# path -> (kind, runtime, lane, family, model_required, streamable, error_style)
TABLE = {
    "/v1/chat/completions": ("chat", "text", "text", "openai", True, True, "openai"),
    "/v1/completions": ("completion", "text", "text", "openai", True, True, "openai"),
    "/v1/embeddings": ("embeddings", "text", "text", "openai", False, False, "openai"),
    "/v1/images/generations": ("image", "image", "image", "openai", False, False, "openai"),
    "/v1/audio/transcriptions": ("stt", "stt", None, "openai", False, False, "openai"),
    "/v1/audio/translations": ("stt", "stt", None, "openai", False, False, "openai"),
    "/v1/audio/speech": ("tts", "text", None, "openai", False, False, "openai"),
    "/api/chat": ("ollama_chat", "text", "text", "ollama", True, True, "ollama"),
    "/api/generate": ("ollama_generate", "text", "text", "ollama", True, True, "ollama"),
    "/api/embed": ("ollama_embed", "text", "text", "ollama", False, False, "ollama"),
    "/sdapi/v1/txt2img": ("sd_txt2img", "image", "image", "sdapi", False, False, "openai"),
    "/api/v1/generate": ("kobold_generate", "text", "text", "kobold", False, False, "openai"),
    "/completion": ("llama_completion", "text", "text", "llama", False, True, "openai"),
}


@pytest.mark.parametrize("path", sorted(TABLE))
def test_contract_inference_routes_classify_as_the_table_says(path: str) -> None:
    route = classify("POST", path)
    assert route is not None
    got = (
        route.kind,
        route.runtime,
        route.lane,
        route.family,
        route.model_required,
        route.streamable,
        route.error_style,
    )
    assert got == TABLE[path]


def test_every_contract_route_is_an_inference_path() -> None:
    assert set(TABLE) <= INFERENCE_PATHS


@pytest.mark.parametrize(
    "path",
    ["/v1/models", "/api/tags", "/api/ps", "/api/version", "/api/show", "/sdapi/v1/sd-models",
     "/health", "/metrics", "/router/v1/node/models", "/nope", "/", ""],
)
def test_non_inference_paths_are_not_classified(path: str) -> None:
    assert classify("POST", path) is None
    assert classify("GET", path) is None


def test_wrong_method_is_not_classified_but_allowed_methods_names_post() -> None:
    assert classify("GET", "/v1/chat/completions") is None
    assert allowed_methods("/v1/chat/completions") == ("POST",)
    assert allowed_methods("/v1/models") == ()


def test_method_is_case_insensitive_and_query_and_trailing_slash_are_ignored() -> None:
    expected = classify("POST", "/v1/chat/completions")
    assert classify("post", "/v1/chat/completions/") == expected
    assert classify("POST", "/v1/chat/completions?x=1") == expected


@pytest.mark.parametrize(
    ("path", "style"),
    [
        ("/api/chat", "ollama"),
        ("/api/tags", "ollama"),
        ("/api/unknown/thing", "ollama"),
        ("/api", "ollama"),
        ("/api/v1/generate", "openai"),
        ("/api/v1", "openai"),
        ("/api/extra/transcribe", "openai"),
        ("/api/extra", "openai"),
        ("/api/v1x", "ollama"),
        ("/v1/chat/completions", "openai"),
        ("/sdapi/v1/txt2img", "openai"),
        ("/apix", "openai"),
    ],
)
def test_error_style_is_ollama_for_api_paths_except_kobold(path: str, style: str) -> None:
    assert error_style_for_path(path) == style


def test_route_error_style_agrees_with_error_style_for_path() -> None:
    for path in INFERENCE_PATHS:
        route = classify("POST", path)
        assert route is not None
        assert route.error_style == error_style_for_path(path), path


def test_routes_are_frozen_values() -> None:
    route = classify("POST", "/api/chat")
    assert isinstance(route, Route)
    assert route == classify("POST", "/api/chat")
    with pytest.raises(AttributeError):
        route.kind = "chat"  # type: ignore[misc]


def test_ollama_streams_by_default_openai_does_not() -> None:
    ollama = classify("POST", "/api/chat")
    openai = classify("POST", "/v1/chat/completions")
    embed = classify("POST", "/v1/embeddings")
    assert ollama is not None and openai is not None and embed is not None
    assert wants_stream(ollama, {}) is True
    assert wants_stream(ollama, {"stream": False}) is False
    assert wants_stream(openai, {}) is False
    assert wants_stream(openai, None) is False
    assert wants_stream(openai, {"stream": True}) is True
    assert wants_stream(openai, {"stream": "yes"}) is False  # not a boolean: the default
    assert wants_stream(embed, {"stream": True}) is False  # route cannot stream


def test_kobold_stream_route_always_streams() -> None:
    route = classify("POST", "/api/extra/generate/stream")
    assert route is not None
    assert wants_stream(route, {"stream": False}) is True


@pytest.mark.parametrize("path", sorted(INFERENCE_PATHS))
@pytest.mark.parametrize("tail", ["", "/", "?stream=1", "#x", "/?a=b#c"])
@pytest.mark.parametrize("method", ["POST", "post", "Post"])
def test_a_listed_path_classifies_as_its_normalized_form(path: str, tail: str, method: str) -> None:
    """classify looks a listed path up as it is before normalizing: the same route either way."""
    assert normalize_path(path) == path
    assert classify(method, path + tail) is classify("POST", path) is not None
