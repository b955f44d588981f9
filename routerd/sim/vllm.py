"""A stand-in for ``vllm serve MODEL`` (vLLM's OpenAI-compatible server).

One process serves one model under its served name: generation (``/v1/chat/completions``,
``/v1/completions``), pooling (``/v1/embeddings`` with ``--runner pooling``), speech
(``/v1/audio/speech`` with tts weights) and transcription (``/v1/audio/transcriptions`` with stt
weights).  ``--max-num-seqs`` requests run at once, the rest wait; a request longer than
``--max-model-len`` is refused with vLLM's 400.  ``GET /health`` answers 200 with an empty body
once the model is loaded.

Like vLLM (``vllm/entrypoints/anthropic``, ``…/openai/responses``, ``…/pooling/score``), it also serves
Anthropic's ``/v1/messages`` and ``/v1/messages/count_tokens``, OpenAI's ``/v1/responses`` (a text model)
and ``/rerank``, ``/v1/rerank``, ``/v2/rerank`` (a pooling model), in the simulated llama-server's shapes
(:mod:`routerd.sim.llama_apis`: the same APIs' objects; the ids and the refusals' wording are
llama-server's).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import attrs
from klein import Klein
from twisted.web.server import Request

from routerd.sim.flags import Flag, below_floor
from routerd.sim.llama import LlamaOptions, LlamaServer
from routerd.sim.llama_apis import api_routes
from routerd.sim.outputs import speech_seconds, speech_wav, transcript
from routerd.sim.program import Family
from routerd.sim.routes import build_family_app, routes
from routerd.sim.runtime import Handler, SimRuntime
from routerd.sim.timing import stt_seconds
from routerd.sim.wav import wav_duration
from routerd.sim.web import BadRequest, HttpError, read_json, send_json, send_text, set_header
from routerd.sim.weights import Weights, WeightsError, load_weights

__all__ = ["FLAGS", "PROGRAM", "VllmServer", "build_app", "initial_weights", "prepare_argv", "validate_args"]

FLAGS: tuple[Flag, ...] = (
    Flag(("--host",), "host", str, "127.0.0.1", "address to listen on", "HOST"),
    Flag(("--port",), "port", int, 8000, "port to listen on", "PORT"),
    Flag(("--model",), "model", str, None, "model weights (*.sim.json); also `serve MODEL`", "PATH"),
    Flag(("--max-model-len",), "max_model_len", int, 0, "context window (0: from the weights)", "N"),
    Flag(("--max-num-seqs",), "max_num_seqs", int, 256, "sequences served at once", "N"),
    Flag(("--served-model-name",), "served_model_name", str, None, "model name clients use", "NAME"),
    Flag(("--runner",), "runner", str, "auto", "auto | generate | pooling", "KIND"),
    Flag(("--task",), "task", str, None, "older spelling: generate | embed | transcription", "KIND"),
)


def prepare_argv(argv: Sequence[str]) -> list[str]:
    """``serve MODEL [flags]`` (the real CLI) becomes ``--model MODEL [flags]``."""
    args = list(argv)
    if args[:1] == ["serve"]:
        args = args[1:]
        if args and not args[0].startswith("-"):
            args = ["--model", args[0], *args[1:]]
    return args


def validate_args(ns: argparse.Namespace) -> str | None:
    return below_floor(ns, {"max_num_seqs": 1, "max_model_len": 0})


def initial_weights(ns: argparse.Namespace) -> tuple[Weights, str]:
    """vLLM serves whatever model it is given: text, speech or transcription weights."""
    if not ns.model:
        raise WeightsError("no model given (use `vllm serve MODEL`)")
    return load_weights(ns.model), ns.model


def slots(ns: argparse.Namespace) -> int:
    return int(ns.max_num_seqs)


@attrs.frozen
class VllmError:
    status: int
    message: str
    type: str

    def body(self) -> dict[str, object]:
        return {"object": "error", "message": self.message, "type": self.type, "param": None,
                "code": self.status}


def _error(status: int, message: str, type_: str) -> HttpError:
    return HttpError(status, VllmError(status, message, type_).body())


class VllmServer(LlamaServer):
    """llama-server's handlers with vLLM's served name, context rule and error shape."""

    def __init__(self, runtime: SimRuntime, ns: argparse.Namespace) -> None:
        served: str = str(ns.served_model_name or ns.model)
        pooling = ns.runner == "pooling" or ns.task in ("embed", "embedding", "pooling")
        super().__init__(runtime, LlamaOptions(
            model_path=ns.model, ctx_size=ns.max_model_len, parallel=ns.max_num_seqs,
            embedding=pooling, alias=served,
        ))
        self.served = served
        self.pooling = pooling

    def _model(self, body: dict[str, object]) -> str:
        model = body.get("model")
        if model is None:
            return self.served
        if model != self.served:
            raise _error(404, f"The model `{model}` does not exist.", "NotFoundError")
        return self.served

    def _check_context(self, prompt_tokens: int, gen_tokens: int) -> None:
        if prompt_tokens + gen_tokens > self.n_ctx:
            raise _error(400, (
                f"This model's maximum context length is {self.n_ctx} tokens. However, you requested "
                f"{prompt_tokens + gen_tokens} tokens ({prompt_tokens} in the messages, {gen_tokens} in "
                "the completion). Please reduce the length of the messages or completion."),
                "BadRequestError")

    def _need_kind(self, kind: str, what: str) -> None:
        if self.weights.kind != kind:
            raise _error(404, f"The model does not support {what}", "NotFoundError")

    async def health(self, request: Request) -> bytes:
        request.setResponseCode(200)
        return b""

    async def models(self, request: Request) -> bytes:
        return send_json(request, 200, {"object": "list", "data": [{
            "id": self.served, "object": "model", "created": int(self.rt.now()), "owned_by": "vllm",
            "root": self.opts.model_path, "max_model_len": self.n_ctx,
            "weights": self.weights.label,
        }]})

    async def chat_completions(self, request: Request) -> bytes | None:
        self._need_kind("text", "the Chat Completions API")
        return await super().chat_completions(request)

    async def completions(self, request: Request) -> bytes | None:
        self._need_kind("text", "the Completions API")
        return await super().completions(request)

    async def embeddings(self, request: Request) -> bytes:
        if not self.pooling:
            raise _error(400, "The model does not support the Embeddings API (use --runner pooling)",
                         "BadRequestError")
        return await super().embeddings(request)

    def api_routes(self) -> dict[str, Handler]:
        """Messages, token counting and Responses (a text model), rerank (a pooling model)."""
        apis = api_routes(self, reranking=self.pooling)

        def text_only(handler: Handler, what: str) -> Handler:
            def checked(request: Request) -> Any:
                self._need_kind("text", what)
                return handler(request)
            return checked

        return {**{path: text_only(handler, f"the {path} API") for path, handler in apis.items()
                   if "rerank" not in path},
                "/rerank": apis["/rerank"], "/v1/rerank": apis["/v1/rerank"], "/v2/rerank": apis["/rerank"]}

    async def speech(self, request: Request) -> bytes:
        self._need_kind("tts", "the Speech API")
        try:
            body = read_json(request)
        except BadRequest as exc:
            raise _error(400, str(exc), "BadRequestError") from None
        self._model(body)
        text = body.get("input")
        if not isinstance(text, str) or not text.strip():
            raise _error(400, "'input' must be a non-empty string", "BadRequestError")
        voice = body.get("voice")
        async with self.rt.slot():
            await self.rt.work(speech_seconds(text) * self.weights.realtime_factor)
        request.setResponseCode(200)
        set_header(request, b"Content-Type", b"audio/wav")
        return speech_wav(self.weights.label, text, voice if isinstance(voice, str) else "")

    async def transcriptions(self, request: Request) -> bytes:
        self._need_kind("stt", "the Transcriptions API")
        args = request.args or {}
        files = args.get(b"file")
        if not files:
            raise _error(400, "no 'file' field in the request", "BadRequestError")
        try:
            duration = wav_duration(files[0])
        except ValueError as exc:
            raise _error(400, f"cannot read the audio: {exc}", "BadRequestError") from None
        async with self.rt.slot():
            await self.rt.work(stt_seconds(self.weights, duration))
        text = transcript(self.weights.label, files[0], duration)
        formats = args.get(b"response_format") or [b"json"]
        if formats[0] == b"text":
            return send_text(request, 200, text + "\n")
        return send_json(request, 200, {"text": text})


def _loading(request: Request) -> bytes:
    return send_json(request, 503, VllmError(503, "The server is loading the model",
                                             "ServiceUnavailableError").body())


def build_app(runtime: SimRuntime, ns: argparse.Namespace) -> Klein:
    server = VllmServer(runtime, ns)
    gets: dict[str, Handler] = {"/health": server.health, "/v1/models": server.models}
    posts: dict[str, Handler] = {
        "/v1/chat/completions": server.chat_completions,
        "/v1/completions": server.completions,
        "/v1/embeddings": server.embeddings,
        "/v1/audio/speech": server.speech,
        "/v1/audio/transcriptions": server.transcriptions,
        **server.api_routes(),
    }
    table = [*routes("GET", gets, work=False), *routes("POST", posts, work=True)]
    return build_family_app(runtime, table, loading_reply=_loading, error_body=_error_page)


def _error_page(code: int, message: str) -> object:
    return VllmError(code, message, "NotFoundError" if code == 404 else "BadRequestError").body()


PROGRAM = Family("vllm", "text", FLAGS, build_app, slots, validate_args, initial_weights, prepare_argv)
