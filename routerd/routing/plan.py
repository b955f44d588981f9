"""How one client request is put to a backend of the model's family (pure).

``plan_backend_call`` turns (route, parsed request, family) into the backend path,
body and the way its answer is converted back for the client, so the HTTP
code only performs what the plan says.  Which routes a family passes through as
sent and which it refuses are the family's declared facts (:mod:`routerd.families`);
the translations below serve the rest.

* ``llama_sdcpp``: Kobold generate becomes llama-server ``/completion``; transcription (OpenAI
  form or Kobold's base64 JSON) becomes whisper-server ``/inference``; speech and Kobold music are
  501 ``unsupported_backend``.
* ``kobold``: KoboldCpp serves every route itself (OpenAI, Kobold, speech, music), so requests
  pass through with the model rewritten to the local ID; Anthropic's Messages and OpenAI's Responses,
  which it does not speak, are translated to its chat completions.
* ``vllm``: OpenAI routes pass through (speech and transcription included), and so do Messages,
  Responses and rerank; Kobold and
  llama-server native routes are 501 ``unsupported_backend``.

Anthropic's Messages and token counting, OpenAI's Responses and rerank (:data:`NATIVE_APIS`) pass
through to a family whose program speaks them (llama-server, vLLM); a family that declares it
``translates`` one gets it as a chat completions request (``adapters.chat_apis``; token counting as its
``token_count_path`` request), answered back in the client's API (``anthropic``, ``responses``,
``token_count``); any other family refuses them (501 ``unsupported_backend``).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Mapping
from typing import Any, Literal

import attrs

from routerd.errors import HTTPError
from routerd.families import DEFAULT_MODE, declared
from routerd.routing.adapters import kobold, ollama, whisper
from routerd.routing.adapters.chat_apis import anthropic, responses
from routerd.routing.classify import Route
from routerd.routing.multipart import Part, build_form, make_boundary, parse_form

AnswerFormat = Literal["openai", "ollama_chat", "ollama_generate", "ollama_embed", "kobold", "whisper", "job",
                       "anthropic", "responses", "token_count"]

SECTIONS: Mapping[str, str] = {
    "chat": "llm", "completion": "llm", "ollama_chat": "llm", "ollama_generate": "llm",
    "kobold_generate": "llm", "kobold_generate_stream": "llm", "llama_completion": "llm",
    "embeddings": "embeddings", "ollama_embed": "embeddings",
    "image": "image", "sd_txt2img": "image", "sd_img2img": "image",
    "stt": "stt", "kobold_transcribe": "stt", "tts": "tts", "kobold_tts": "tts",
    "kobold_music": "music", "sd_vid_gen": "video",
    # the APIs a backend speaks itself run on the model's text runtime and count as text work
    "messages": "llm", "count_tokens": "llm", "responses": "llm", "rerank": "llm",
}

# Which capability a route needs from the model it names.
NEEDS: Mapping[str, str] = {
    "llm": "llm", "embeddings": "embeddings", "image": "image", "stt": "stt", "tts": "tts",
    "music": "music", "video": "image",
}


#: The route kinds of the APIs a backend may serve itself: a family passes them through, translates
#: them (to chat completions) or refuses them.
NATIVE_APIS = frozenset({"messages", "count_tokens", "responses", "rerank"})


@attrs.frozen
class BackendPlan:
    path: str
    body: bytes
    content_type: str
    #: The form the backend's answer comes in, which says how it is turned into the client's (not
    #: a backend mode: every family's answers come in one of these).
    answer_format: AnswerFormat
    stream: bool
    #: The transcription format the client asked whisper for (its ``response_format`` field).
    response_format: str = "json"


#: An ollama route's converter to its OpenAI call, the format its answer is read in, and whether it
#: may stream.
_ToOpenAI = Callable[[Mapping[str, Any]], tuple[str, dict[str, Any]]]
_OLLAMA_TO_OPENAI: Mapping[str, tuple[_ToOpenAI, AnswerFormat, bool]] = {
    "ollama_chat": (ollama.ollama_chat_to_openai, "ollama_chat", True),
    "ollama_generate": (ollama.ollama_generate_to_openai, "ollama_generate", True),
    "ollama_embed": (ollama.ollama_embed_to_openai, "ollama_embed", False),
}


def _json(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def plan_backend_call(route: Route, path: str, parsed: Mapping[str, Any] | None, raw: bytes,
                      content_type: str, local_id: str, stream: bool,
                      family: str = DEFAULT_MODE) -> BackendPlan:
    """Plan the backend request for a route whose model resolved to ``local_id`` in ``family``."""
    kind = route.kind
    facts = declared(family)
    if kind in facts.refuses:
        raise HTTPError(501, f"{path} is not supported by the {family} backend family",
                        "unsupported_backend", "unsupported_backend")
    if kind == "sd_vid_gen":
        if not facts.video:  # KoboldCpp renders video through its image routes; vLLM none
            raise HTTPError(501, f"{path} is served by stable-diffusion.cpp's sd-server only, not by the "
                            f"{family} backend family", "unsupported_backend", "unsupported_backend")
        return BackendPlan(path, raw, "application/json", "job", False)
    if kind in facts.passes_through:
        return _pass_through(path, parsed, raw, content_type, local_id, stream)
    if kind in facts.translates:
        return _translated(kind, path, parsed or {}, local_id, stream, facts.token_count_path, family)
    if kind in ("tts", "kobold_tts"):
        raise HTTPError(501, "audio route is not supported by the selected split backend config",
                        "unsupported_backend", "unsupported_backend")
    if kind == "kobold_music":
        raise HTTPError(501, "music route is not supported by the selected split backend config",
                        "unsupported_backend", "unsupported_backend")
    if kind == "kobold_transcribe":
        return _plan_kobold_transcribe(parsed, raw)
    if kind == "stt":
        return _plan_stt(path, raw, content_type)
    assert parsed is not None
    if kind in ("chat", "completion", "embeddings", "llama_completion"):
        if parsed.get("model") == local_id:  # the body as it came: no copy, no encoding
            return BackendPlan(path, raw, "application/json", "openai", stream)
        return BackendPlan(path, _json({**parsed, "model": local_id}), "application/json", "openai", stream)
    body = dict(parsed)
    if kind in ("image", "sd_txt2img", "sd_img2img"):
        return BackendPlan(path, raw, "application/json", "openai", False)
    if kind in _OLLAMA_TO_OPENAI:
        to_openai, answer, streams = _OLLAMA_TO_OPENAI[kind]
        backend_path, out = to_openai(body)
        out["model"] = local_id
        if answer == "ollama_generate" and backend_path.endswith("/chat/completions"):
            answer = "ollama_chat"  # a generate call with images goes to the chat route
        return BackendPlan(backend_path, _json(out), "application/json", answer, stream and streams)
    if kind == "kobold_generate":
        backend_path, out = kobold.kobold_generate_to_llama(body)
        return BackendPlan(backend_path, _json(out), "application/json", "kobold", False)
    raise HTTPError(404, f"route {path} is not served by this node", "not_found", "not_found")


def _pass_through(path: str, parsed: Mapping[str, Any] | None, raw: bytes, content_type: str,
                  local_id: str, stream: bool) -> BackendPlan:
    """The request as the client sent it, with a JSON body's ``model`` set to the local ID."""
    if parsed is None or parsed.get("model") in (None, local_id):
        return BackendPlan(path, raw, content_type or "application/json", "openai", stream)
    return BackendPlan(path, _json({**parsed, "model": local_id}), "application/json", "openai", stream)


def _translated(kind: str, path: str, parsed: Mapping[str, Any], local_id: str, stream: bool,
                token_count_path: str, family: str) -> BackendPlan:
    """A Messages, Responses or count-tokens request for a family that does not speak it: as chat
    completions (a stream asks for its usage), or as its tokenizer's request."""
    if kind == "messages":
        return BackendPlan(ollama.CHAT_PATH, _json(anthropic.messages_to_chat(parsed, local_id, stream)),
                           "application/json", "anthropic", stream)
    if kind == "responses":
        return BackendPlan(ollama.CHAT_PATH, _json(responses.responses_to_chat(parsed, local_id, stream)),
                           "application/json", "responses", stream)
    if kind == "count_tokens" and token_count_path:
        return BackendPlan(token_count_path, _json(anthropic.count_tokens_request(parsed)),
                           "application/json", "token_count", False)
    raise HTTPError(501, f"{path} cannot be translated for the {family} backend family",
                    "unsupported_backend", "unsupported_backend")


def _plan_kobold_transcribe(parsed: Mapping[str, Any] | None, raw: bytes) -> BackendPlan:
    """Split mode: Kobold's ``/api/extra/transcribe`` (JSON, ``audio_data`` base64 WAV or data URI,
    ``langcode``, ``prompt``) goes to whisper-server as a form; its ``{"text"}`` answer is
    Kobold's shape too (reference §4.3: STT routes use the transcription runtime)."""
    body = parsed
    if body is None:
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
    if not isinstance(body, Mapping):
        raise HTTPError(400, "request body must be a JSON object")
    audio_b64 = body.get("audio_data")
    if not isinstance(audio_b64, str) or not audio_b64:
        raise HTTPError(400, "audio_data must be a base64 WAV")
    try:
        audio = base64.b64decode(audio_b64.split(",", 1)[-1], validate=True)
    except (binascii.Error, ValueError):
        raise HTTPError(400, "audio_data is not valid base64") from None
    fields: list[tuple[str, str | None, str | None, bytes]] = [("file", "audio.wav", "audio/wav", audio)]
    for key, name in (("langcode", "language"), ("prompt", "prompt")):
        value = body.get(key)
        if isinstance(value, str) and value:
            fields.append((name, None, None, value.encode()))
    return _whisper_plan(fields, translate=False)


def _plan_stt(path: str, raw: bytes, content_type: str) -> BackendPlan:
    parts = parse_form(raw, content_type)
    fields = [(p.name, p.filename, p.content_type, p.data) for p in parts]
    return _whisper_plan(fields, translate=path.endswith("/translations"))


def _whisper_plan(fields: list[tuple[str, str | None, str | None, bytes]], *, translate: bool) -> BackendPlan:
    adapted = whisper.openai_transcription_to_whisper(fields, translate=translate)
    fmt = "json"
    for name, _filename, _ctype, data in adapted:
        if name == "response_format":
            fmt = data.decode("utf-8", "replace").strip() or "json"
    boundary = make_boundary().decode("ascii")
    body = build_form([Part(name=n, filename=f, content_type=c, data=d) for n, f, c, d in adapted], boundary)
    return BackendPlan("/inference", body, f"multipart/form-data; boundary={boundary}", "whisper", False, fmt)
