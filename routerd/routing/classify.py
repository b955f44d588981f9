"""Request classification: which inference route a client path is (contract §5, cluster spec §4.1, §6.1).

Pure table lookups: no Twisted, no I/O.  ``classify`` answers ``None`` for anything that is
not a client *inference* route (listings such as ``GET /v1/models`` or ``/api/tags``, the
node/site APIs, unknown paths); the API layer answers those itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attrs

from routerd.catalog.model import RuntimeKind
from routerd.errors import ErrorStyle, is_anthropic_path
from routerd.lanes import Lane

RouteKind = Literal[
    "chat",
    "completion",
    "embeddings",
    "image",
    "sd_txt2img",
    "sd_img2img",
    "sd_vid_gen",
    "stt",
    "tts",
    "ollama_chat",
    "ollama_generate",
    "ollama_embed",
    "kobold_generate",
    "kobold_generate_stream",
    "kobold_transcribe",
    "kobold_tts",
    "kobold_music",
    "llama_completion",
    "messages",
    "count_tokens",
    "responses",
    "rerank",
]
# Lending lanes (lending spec §2.3).  STT and TTS requests are never lent: lane ``None``.
Family = Literal["openai", "ollama", "sdapi", "sdcpp", "kobold", "llama", "anthropic"]


@attrs.frozen
class Route:
    """What kind of inference request a (method, path) is and how to treat it.

    ``streamable``: the request may ask for a streamed answer (SSE, or NDJSON for Ollama).
    ``stream_default``: whether it streams when the body says nothing (Ollama streams by default;
    Kobold's ``/api/extra/generate/stream`` always streams).  Use :func:`wants_stream`.
    """

    kind: RouteKind
    runtime: RuntimeKind
    lane: Lane | None
    family: Family
    model_required: bool
    streamable: bool
    error_style: ErrorStyle
    stream_default: bool = False


def _route(
    kind: RouteKind,
    runtime: RuntimeKind,
    lane: Lane | None,
    family: Family,
    *,
    required: bool = False,
    streamable: bool = False,
    stream_default: bool = False,
    error_style: ErrorStyle = "openai",
) -> Route:
    return Route(
        kind=kind,
        runtime=runtime,
        lane=lane,
        family=family,
        model_required=required,
        streamable=streamable,
        error_style=error_style,
        stream_default=stream_default,
    )


# Every client inference route is a POST.
_ROUTES: Mapping[str, Route] = {
    # OpenAI
    "/v1/chat/completions": _route("chat", "text", "text", "openai", required=True, streamable=True),
    "/v1/completions": _route("completion", "text", "text", "openai", required=True, streamable=True),
    "/v1/embeddings": _route("embeddings", "text", "text", "openai"),
    "/v1/images/generations": _route("image", "image", "image", "openai"),
    "/v1/audio/transcriptions": _route("stt", "stt", None, "openai"),
    "/v1/audio/translations": _route("stt", "stt", None, "openai"),
    # Speech synthesis runs on the text runtime (cluster spec §4.1) but is never lent.
    "/v1/audio/speech": _route("tts", "text", None, "openai"),
    # Ollama
    "/api/chat": _route(
        "ollama_chat", "text", "text", "ollama",
        required=True, streamable=True, stream_default=True, error_style="ollama",
    ),
    "/api/generate": _route(
        "ollama_generate", "text", "text", "ollama",
        required=True, streamable=True, stream_default=True, error_style="ollama",
    ),
    "/api/embed": _route("ollama_embed", "text", "text", "ollama", error_style="ollama"),
    # SD WebUI
    "/sdapi/v1/txt2img": _route("sd_txt2img", "image", "image", "sdapi"),
    "/sdapi/v1/img2img": _route("sd_img2img", "image", "image", "sdapi"),
    # stable-diffusion.cpp's native video job (202 + a poll URL, routerd.routing.jobs): the image
    # runtime and its readiness (cluster spec "Registration and health"), never lent (lane None).
    "/sdcpp/v1/vid_gen": _route("sd_vid_gen", "image", None, "sdcpp"),
    # Kobold
    "/api/v1/generate": _route("kobold_generate", "text", "text", "kobold"),
    "/api/extra/generate/stream": _route(
        "kobold_generate_stream", "text", "text", "kobold", streamable=True, stream_default=True
    ),
    "/api/extra/transcribe": _route("kobold_transcribe", "stt", None, "kobold"),
    # Kobold speech synthesis: text side, never lent (like /v1/audio/speech).
    "/api/extra/tts": _route("kobold_tts", "text", None, "kobold"),
    # Kobold music (planner and generation): KoboldCpp's one process, text-side readiness (cluster
    # spec "Registration and health"), never lent.
    "/api/extra/music/prepare": _route("kobold_music", "text", None, "kobold"),
    "/api/extra/music/generate": _route("kobold_music", "text", None, "kobold"),
    # llama-server native
    "/completion": _route("llama_completion", "text", "text", "llama", streamable=True),
    # The APIs a backend speaks itself (its family's ``passes_through``; refused by a family that does
    # not): Anthropic's Messages and token counting, OpenAI's Responses, and rerank (embeddings-side
    # work on the text runtime, like /v1/embeddings).
    "/v1/messages": _route("messages", "text", "text", "anthropic", required=True, streamable=True,
                           error_style="anthropic"),
    "/v1/messages/count_tokens": _route("count_tokens", "text", "text", "anthropic", required=True,
                                        error_style="anthropic"),
    "/v1/responses": _route("responses", "text", "text", "openai", required=True, streamable=True),
    "/v1/rerank": _route("rerank", "text", "text", "openai", required=True),
    "/rerank": _route("rerank", "text", "text", "llama", required=True),
}

INFERENCE_PATHS: frozenset[str] = frozenset(_ROUTES)


def normalize_path(path: str) -> str:
    """The path without its query string or fragment, and without a trailing ``/`` (except ``/``)."""
    for sep in ("?", "#"):
        cut = path.find(sep)
        if cut >= 0:
            path = path[:cut]
    if len(path) > 1:
        path = path.rstrip("/") or "/"
    return path


def classify(method: str, path: str) -> Route | None:
    """The inference route for ``method path``, or ``None`` when it is not one.

    A known inference path with a method other than POST also gives ``None``; use
    :func:`allowed_methods` to answer 405 with an ``Allow`` header instead of 404.
    """
    if method != "POST" and method.upper() != "POST":
        return None
    # a path as it is listed needs no normalizing (normalize_path leaves every listed path alone)
    route = _ROUTES.get(path)
    return route if route is not None else _ROUTES.get(normalize_path(path))


def allowed_methods(path: str) -> tuple[str, ...]:
    """Methods accepted on an inference path (``("POST",)``), or ``()`` if it is not one."""
    return ("POST",) if normalize_path(path) in _ROUTES else ()


def error_style_for_path(path: str) -> ErrorStyle:
    """Ollama error envelope (``{"error": "..."}``) for ``/api/*``; Anthropic's for ``/v1/messages`` and
    under it; OpenAI style everywhere else.

    ``/api/v1/*`` and ``/api/extra/*`` are Kobold's API and use the OpenAI style.
    """
    p = normalize_path(path)
    if is_anthropic_path(p):
        return "anthropic"
    if p == "/api" or p.startswith("/api/"):
        for kobold in ("/api/v1", "/api/extra"):
            if p == kobold or p.startswith(kobold + "/"):
                return "openai"
        return "ollama"
    return "openai"


def wants_stream(route: Route, payload: Mapping[str, Any] | None) -> bool:
    """Whether this request asks for a streamed answer.

    ``payload`` is the parsed JSON body (or ``None``).  A boolean ``stream`` field decides;
    otherwise the route's default (Ollama: on; OpenAI, llama: off).
    """
    if not route.streamable:
        return False
    if route.kind == "kobold_generate_stream":
        return True
    value = payload.get("stream") if payload is not None else None
    if isinstance(value, bool):
        return value
    return route.stream_default
