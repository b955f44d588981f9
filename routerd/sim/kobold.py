"""A stand-in for KoboldCpp: one process serving text, embeddings, image, speech and music,
switched between configs with ``POST /api/admin/reload_config`` (reference cluster.md §7.1, §7.2).

Weights come from a ``.kcpps`` config (``--config``) or the per-lane flags (``--model``,
``--sdmodel``, ``--ttsmodel``, ``--whispermodel``, ``--embeddingsmodel``, ``--musicllm``,
``--musicdiffusion``); ``--nomodel`` starts with nothing loaded.  ``GET /api/extra/version``
reports which lanes the loaded config serves; ``POST /api/extra/tokencount`` counts a raw text's tokens
(``{"prompt", "special"}`` -> ``{"value", "ids"}``, as KoboldCpp's handler does; it serves no Messages,
Responses nor rerank route).  What a config loads is read by
:mod:`routerd.sim.kobold_models`; this module holds the server and its routes.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hmac
import json
import os
import uuid
from collections.abc import Mapping

import attrs
from klein import Klein
from twisted.internet.defer import Deferred
from twisted.web.server import Request

from routerd.sim.flags import Flag, below_floor
from routerd.sim.kobold_models import ModelSet, model_set_from_args, model_set_from_config
from routerd.sim.llama import LlamaOptions, LlamaServer, _TextJob
from routerd.sim.outputs import generate_tokens, music_plan, music_wav, speech_seconds, speech_wav, transcript
from routerd.sim.program import Family, one_slot
from routerd.sim.routes import build_family_app, openai_error_page, routes
from routerd.sim.runtime import Handler, SimRuntime
from routerd.sim.sd import SdOptions, SdServer
from routerd.sim.timing import count_tokens, stt_seconds
from routerd.sim.tokens import SPECIAL
from routerd.sim.wav import wav_duration
from routerd.sim.web import (
    BadRequest,
    HttpError,
    SseStream,
    openai_bad_request,
    openai_error,
    openai_json_body,
    read_json,
    send_json,
    set_header,
)
from routerd.sim.weights import Weights, WeightsError

__all__ = ["FLAGS", "PROGRAM", "ModelSet", "build_app", "initial_weights", "model_set_from_config",
           "validate_args"]

VERSION = "1.99-routerd-sim"
#: Kobold's default generation length (``max_length``).
DEFAULT_MAX_LENGTH = 100
DEFAULT_CONTEXT = 8192

FLAGS: tuple[Flag, ...] = (
    Flag(("--host",), "host", str, "127.0.0.1", "address to listen on", "HOST"),
    Flag(("--port",), "port", int, 5001, "port to listen on", "PORT"),
    Flag(("--config",), "config", str, None, "a .kcpps config to load", "PATH"),
    Flag(("--model",), "model", str, None, "text model weights (*.sim.json)", "PATH"),
    Flag(("--sdmodel",), "sdmodel", str, None, "image model weights", "PATH"),
    Flag(("--whispermodel",), "whispermodel", str, None, "speech-to-text weights", "PATH"),
    Flag(("--ttsmodel",), "ttsmodel", str, None, "text-to-speech weights", "PATH"),
    Flag(("--embeddingsmodel",), "embeddingsmodel", str, None, "embeddings weights", "PATH"),
    Flag(("--mmproj",), "mmproj", str, None, "multimodal projector", "PATH"),
    Flag(("--musicllm",), "musicllm", str, None, "music planner weights", "PATH"),
    Flag(("--musicdiffusion",), "musicdiffusion", str, None, "music generator weights", "PATH"),
    Flag(("--musicembeddings",), "musicembeddings", str, None, "music embeddings file", "PATH"),
    Flag(("--musicvae",), "musicvae", str, None, "music VAE file", "PATH"),
    Flag(("--contextsize",), "contextsize", int, 0, "context size (0: from the weights)", "N"),
    Flag(("--nomodel",), "nomodel", bool, False, "start with no model loaded"),
    Flag(("--admin",), "admin", bool, False, "enable the admin API (reload_config)"),
    Flag(("--adminpassword",), "adminpassword", str, None, "bearer password of the admin API", "PW"),
    Flag(("--admindir",), "admindir", str, None, "directory reload_config reads configs from", "DIR"),
    Flag(("--multiuser",), "multiuser", int, 1, "queue requests from several users", "N"),
    Flag(("--skiplauncher",), "skiplauncher", bool, False, "accepted; there is no launcher"),
    Flag(("--quiet",), "quiet", bool, False, "accepted"),
)

#: Kobold's default music length in seconds (``duration``), and the longest it accepts.
DEFAULT_MUSIC_SECONDS = 10.0
MAX_MUSIC_SECONDS = 600.0


def validate_args(ns: argparse.Namespace) -> str | None:
    return below_floor(ns, {"multiuser": 0, "contextsize": 0})


def initial_weights(ns: argparse.Namespace) -> tuple[Weights, str]:
    """The startup load (all the config's weights as one) and what it is called."""
    models = model_set_from_args(ns)
    ns.sim_models = models
    return models.combined, ns.config or ns.model or "nomodel"




class KoboldServer:
    def __init__(self, runtime: SimRuntime, ns: argparse.Namespace) -> None:
        self.rt = runtime
        self.admin = bool(ns.admin)
        self.password: str | None = ns.adminpassword
        self.admindir: str | None = ns.admindir
        self.models: ModelSet = ns.sim_models
        self.text = self._text_server()
        self.embed = self._embed_server()
        self.image = self._image_server()

    # -- lanes ---------------------------------------------------------------------------------

    def _lane(self, lane: str) -> Weights:
        weights = self.models.weights.get(lane)
        if weights is None:
            raise HttpError(503, openai_error(503, f"no {lane} model is loaded", "unavailable_error"))
        return weights

    def _text_server(self) -> LlamaServer:
        options = LlamaOptions(
            model_path=self.models.paths.get("text", "inactive"),
            ctx_size=self.models.context or DEFAULT_CONTEXT, mmproj=self.models.mmproj,
            alias=f"koboldcpp/{self.models.name}" if self.models.name else None,
        )
        return LlamaServer(self.rt, options, weights=lambda: self._lane("text"))

    def _embed_server(self) -> LlamaServer:
        options = LlamaOptions(model_path=self.models.paths.get("embeddings", "inactive"), embedding=True,
                               ctx_size=DEFAULT_CONTEXT)
        return LlamaServer(self.rt, options, weights=lambda: self._lane("embeddings"))

    def _image_server(self) -> SdServer:
        return SdServer(self.rt, SdOptions(self.models.paths.get("image", "inactive")),
                        weights=lambda: self._lane("image"))

    def _install(self, models: ModelSet) -> None:
        self.models = models
        self.text = self._text_server()
        self.embed = self._embed_server()
        self.image = self._image_server()

    # -- informational -------------------------------------------------------------------------

    async def version(self, request: Request) -> bytes:
        has = self.models.has
        return send_json(request, 200, {
            "result": "KoboldCpp", "version": VERSION, "protected": False,
            "txt2img": has("image"), "vision": self.models.mmproj is not None, "audio": False,
            "transcribe": has("stt"), "multiplayer": False, "websearch": False, "tts": has("tts"),
            "embeddings": has("embeddings"), "music": self.models.has_music, "admin": 1 if self.admin else 0,
            "weights": self.rt.weights.label, "config": self.models.name,
        })

    async def model(self, request: Request) -> bytes:
        name = f"koboldcpp/{self.models.name}" if self.models.has("text") else "inactive"
        return send_json(request, 200, {"result": name})

    async def models_list(self, request: Request) -> bytes:
        if not self.models.has("text"):
            return send_json(request, 200, {"object": "list", "data": [
                {"id": "inactive", "object": "model", "owned_by": "koboldcpp"}]})
        return await self.text.models(request)

    async def sd_models(self, request: Request) -> bytes:
        if not self.models.has("image"):
            return send_json(request, 200, [{"title": "inactive", "model_name": "inactive"}])
        return await self.image.sd_models(request)

    # -- admin ---------------------------------------------------------------------------------

    async def reload_config(self, request: Request) -> bytes:
        if not self.admin:
            raise HttpError(403, {"success": False, "error": "admin mode is not enabled"})
        if self.password:
            given = request.getHeader("authorization") or ""
            if not hmac.compare_digest(given.encode(), f"Bearer {self.password}".encode()):
                raise HttpError(401, {"success": False, "error": "wrong admin password"})
        try:
            body = read_json(request)
        except BadRequest as exc:
            raise HttpError(400, {"success": False, "error": str(exc)}) from None
        filename = body.get("filename")
        if not isinstance(filename, str) or not filename:
            raise HttpError(400, {"success": False, "error": "filename is required"})
        if os.path.basename(filename) != filename or self.admindir is None:
            raise HttpError(400, {"success": False, "error": "config must be a file in the admin directory"})
        path = os.path.join(self.admindir, filename)
        try:
            models = model_set_from_config(path)
        except WeightsError as exc:
            return send_json(request, 200, {"success": False, "error": str(exc)})
        # The process drops what it holds and loads the new config; until it has, every route
        # answers 503 (the liveness probe is what a router waits on).
        self.rt.loading = True
        self._install(models)
        self.rt.clock.callLater(0.0, self._load, models, path)
        return send_json(request, 200, {"success": True})

    def _load(self, models: ModelSet, path: str) -> None:
        Deferred.fromCoroutine(self.rt.load(models.combined, path))

    # -- generation ----------------------------------------------------------------------------

    def _kobold_job(self, body: Mapping[str, object]) -> _TextJob:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise openai_bad_request("prompt is required")
        memory = body.get("memory")
        text = (memory if isinstance(memory, str) else "") + prompt
        length = body.get("max_length", DEFAULT_MAX_LENGTH)
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise openai_bad_request("max_length must be a non-negative integer")
        weights = self._lane("text")
        return _TextJob(self.models.name, text, count_tokens(text),
                        generate_tokens(weights.label, text, length), False)

    async def generate(self, request: Request) -> bytes:
        body = openai_json_body(request)
        job = self._kobold_job(body)
        await self.text._generate(job)
        return send_json(request, 200, {"results": [{
            "text": job.text, "finish_reason": "length",
            "prompt_tokens": job.prompt_tokens, "completion_tokens": len(job.tokens),
        }]})

    async def generate_stream(self, request: Request) -> None:
        body = openai_json_body(request)
        job = self._kobold_job(body)
        sse = SseStream(request)

        def token(_index: int, text: str) -> None:
            sse.write(b"event: message\ndata: " + json.dumps({"token": text, "finish_reason": None})
                      .encode() + b"\n\n")

        await self.text._generate(job, on_first=sse.start, on_token=token)
        sse.write(b"event: message\ndata: " + json.dumps({"token": "", "finish_reason": "length"})
                  .encode() + b"\n\n")
        return None

    async def tokencount(self, request: Request) -> bytes:
        """KoboldCpp's token count of a raw text (no chat template); ``special`` (default true) adds
        the BOS token; a body it cannot read answers 400 ``{"value": -1}``."""
        try:
            body = read_json(request)
        except BadRequest:
            return send_json(request, 400, {"value": -1})
        prompt = body.get("prompt", "")
        if not isinstance(prompt, str):
            return send_json(request, 400, {"value": -1})
        self._lane("text")
        ids = [token for token, _piece in self.text.vocabulary.tokenize(prompt)]
        if body.get("special", True) is not False:
            ids.insert(0, SPECIAL.index("<s>"))
        return send_json(request, 200, {"value": len(ids), "ids": ids})

    async def _transcribe(self, audio: bytes) -> str:
        try:
            duration = wav_duration(audio)
        except ValueError as exc:
            raise openai_bad_request(f"failed to read audio data as WAV: {exc}") from None
        weights = self._lane("stt")
        async with self.rt.slot():
            await self.rt.work(stt_seconds(weights, duration))
        return transcript(weights.label, audio, duration)

    async def transcribe(self, request: Request) -> bytes:
        """``/api/extra/transcribe``: KoboldCpp's JSON shape, ``{"audio_data": <base64 WAV, or a
        data URI>, "prompt", "langcode", "suppress_non_speech"}`` -> ``{"text": ...}``."""
        body = openai_json_body(request)
        raw = body.get("audio_data")
        if not isinstance(raw, str) or not raw:
            raise openai_bad_request("'audio_data' must be a base64 WAV")
        if raw.startswith("data:"):
            raw = raw.split(",", 1)[-1]
        try:
            audio = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            raise openai_bad_request("'audio_data' is not valid base64") from None
        return send_json(request, 200, {"text": await self._transcribe(audio)})

    async def transcriptions(self, request: Request) -> bytes:
        """``/v1/audio/transcriptions`` (OpenAI multipart, ``file``) -> ``{"text": ...}``."""
        values = (request.args or {}).get(b"file")
        if not values:
            raise openai_bad_request("no 'file' field in the request")
        return send_json(request, 200, {"text": await self._transcribe(values[0])})

    async def speech(self, request: Request) -> bytes:
        """``/api/extra/tts`` and ``/v1/audio/speech``: a WAV of the text spoken."""
        body = openai_json_body(request)
        text = body.get("input", body.get("text"))
        if not isinstance(text, str) or not text.strip():
            raise openai_bad_request("'input' must be a non-empty string")
        voice = body.get("voice")
        weights = self._lane("tts")
        async with self.rt.slot():
            await self.rt.work(speech_seconds(text) * weights.realtime_factor)
        audio = speech_wav(weights.label, text, voice if isinstance(voice, str) else "")
        request.setResponseCode(200)
        set_header(request, b"Content-Type", b"audio/wav")
        set_header(request, b"X-Sim-Request", uuid.uuid4().hex.encode())
        return audio

    # -- music -----------------------------------------------------------------------------------

    def _music_weights(self) -> Weights:
        """The music weights: the generator's timing, labelled by every music weight loaded."""
        found = [self.models.weights[lane] for lane in ("music", "music_planner") if self.models.has(lane)]
        if not found:
            raise HttpError(503, openai_error(503, "no music model is loaded", "unavailable_error"))
        label = "+".join(w.label for w in found)
        return attrs.evolve(found[0], label=label)

    @staticmethod
    def _music_text(body: Mapping[str, object], key: str) -> str:
        value = body.get(key, "")
        if not isinstance(value, str):
            raise openai_bad_request(f"'{key}' must be a string")
        return value

    def _music_request(self, request: Request) -> tuple[dict[str, object], str, str]:
        """A music request's JSON body, caption and lyrics (400 when unreadable)."""
        body = openai_json_body(request)
        return body, self._music_text(body, "caption"), self._music_text(body, "lyrics")

    async def music_prepare(self, request: Request) -> bytes:
        """``/api/extra/music/prepare``: the planner fills in the request's musical fields; the
        answer is the request with them (JSON)."""
        body, caption, lyrics = self._music_request(request)
        if not caption.strip():
            raise openai_bad_request("'caption' is required")
        weights = self._music_weights()
        async with self.rt.slot():
            await self.rt.work(count_tokens(caption + lyrics) / weights.prompt_tokens_per_s
                               + 16 / weights.gen_tokens_per_s)
        return send_json(request, 200, {**body, **music_plan(weights.label, caption, lyrics)})

    async def music_generate(self, request: Request) -> bytes:
        """``/api/extra/music/generate``: a WAV for the caption and lyrics (``duration`` seconds
        of work at the weights' realtime factor; the clip itself stays short)."""
        body, caption, lyrics = self._music_request(request)
        if not caption.strip() and not lyrics.strip():
            raise openai_bad_request("'caption' or 'lyrics' is required")
        seconds = body.get("duration", DEFAULT_MUSIC_SECONDS)
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) \
                or not 0 < seconds <= MAX_MUSIC_SECONDS:
            raise openai_bad_request(f"'duration' must be a number of seconds in (0, {MAX_MUSIC_SECONDS:g}]")
        weights = self._music_weights()
        async with self.rt.slot():
            await self.rt.work(float(seconds) * weights.realtime_factor)
        fields = json.dumps({k: body.get(k) for k in ("caption", "lyrics", "bpm", "keyscale",
                                                      "timesignature", "audio_codes", "seed")},
                            sort_keys=True)
        audio = music_wav(weights.label, fields, float(seconds))
        request.setResponseCode(200)
        set_header(request, b"Content-Type", b"audio/wav")
        set_header(request, b"X-Sim-Request", uuid.uuid4().hex.encode())
        return audio


def _loading(request: Request) -> bytes:
    return send_json(request, 503, {"detail": {"msg": "Server is loading a model",
                                               "type": "service_unavailable"}})


def build_app(runtime: SimRuntime, ns: argparse.Namespace) -> Klein:
    server = KoboldServer(runtime, ns)
    gets: dict[str, Handler] = {
        "/api/extra/version": server.version,
        "/api/v1/model": server.model,
        "/v1/models": server.models_list,
        "/sdapi/v1/sd-models": server.sd_models,
    }
    posts: dict[str, Handler] = {
        "/api/v1/generate": server.generate,
        "/api/extra/generate/stream": server.generate_stream,
        "/api/extra/tokencount": server.tokencount,
        "/v1/chat/completions": lambda r: server.text.chat_completions(r),
        "/v1/completions": lambda r: server.text.completions(r),
        "/v1/embeddings": lambda r: server.embed.embeddings(r),
        "/api/extra/embeddings": lambda r: server.embed.embeddings(r),
        "/sdapi/v1/txt2img": lambda r: server.image.txt2img(r),
        "/v1/images/generations": lambda r: server.image.generations(r),
        "/api/extra/tts": server.speech,
        "/v1/audio/speech": server.speech,
        "/api/extra/transcribe": server.transcribe,
        "/v1/audio/transcriptions": server.transcriptions,
        "/v1/audio/translations": server.transcriptions,
        "/api/extra/music/prepare": server.music_prepare,
        "/api/extra/music/generate": server.music_generate,
    }
    table = [
        *routes("GET", gets, work=False),
        *routes("POST", {"/api/admin/reload_config": server.reload_config}, work=False),
        *routes("POST", posts, work=True),
    ]
    return build_family_app(runtime, table, loading_reply=_loading, error_body=openai_error_page)


PROGRAM = Family("koboldcpp", "text", FLAGS, build_app, one_slot, validate_args, initial_weights)
