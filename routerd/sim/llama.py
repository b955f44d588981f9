"""A stand-in for llama.cpp's ``llama-server`` (OpenAI-compatible and native routes)."""

from __future__ import annotations

import argparse
import base64
import os
import struct
import uuid
from collections.abc import Callable

import attrs
from klein import Klein
from twisted.web.server import Request

from routerd.sim.flags import Flag, below_floor
from routerd.sim.outputs import embedding_vector, generate_tokens
from routerd.sim.program import Family
from routerd.sim.routes import build_family_app, openai_error_page, routes
from routerd.sim.runtime import Handler, SimRuntime, WeightsServer
from routerd.sim.timing import count_tokens, requested_max_tokens, text_seconds
from routerd.sim.web import (
    BadRequest,
    HttpError,
    SseStream,
    openai_bad_request,
    openai_error,
    openai_json_body,
    send_json,
)
from routerd.sim.weights import Weights

__all__ = ["FLAGS", "PROGRAM", "LlamaOptions", "build_app", "chat_prompt", "options_from_args"]

FLAGS: tuple[Flag, ...] = (
    Flag(("--host",), "host", str, "127.0.0.1", "address to listen on", "HOST"),
    Flag(("--port",), "port", int, 8080, "port to listen on", "PORT"),
    Flag(("-m", "--model"), "model", str, None, "model weights (*.sim.json)", "PATH"),
    Flag(("-c", "--ctx-size"), "ctx_size", int, 0, "context size (0: from the weights)", "N"),
    Flag(("-np", "--parallel"), "parallel", int, 1, "requests served at once", "N"),
    Flag(("--mmproj",), "mmproj", str, None, "multimodal projector: accept image input", "PATH"),
    Flag(("--no-mmproj",), "no_mmproj", bool, False,
         "do not load the multimodal projector (image input is refused, as llama-server does)"),
    Flag(("--embedding", "--embeddings"), "embedding", bool, False, "serve /v1/embeddings"),
    Flag(("-a", "--alias"), "alias", str, None, "model name shown to clients", "NAME"),
)

FINGERPRINT = "routerd-sim"


@attrs.frozen
class LlamaOptions:
    model_path: str
    ctx_size: int = 0
    parallel: int = 1
    mmproj: str | None = None
    embedding: bool = False
    alias: str | None = None

    @property
    def model_name(self) -> str:
        return self.alias or os.path.basename(self.model_path)


def validate_args(ns: argparse.Namespace) -> str | None:
    return below_floor(ns, {"parallel": 1, "ctx_size": 0})


def options_from_args(ns: argparse.Namespace) -> LlamaOptions:
    return LlamaOptions(
        model_path=ns.model, ctx_size=ns.ctx_size, parallel=ns.parallel,
        mmproj=None if ns.no_mmproj else ns.mmproj, embedding=ns.embedding, alias=ns.alias,
    )


def chat_prompt(messages: object) -> tuple[str, list[str]]:
    """The prompt text of a chat (message contents joined by newlines) and its image URLs."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty array")
    texts: list[str] = []
    images: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            raise BadRequest("each message must be an object")
        content = message.get("content")
        if content is None:
            continue
        if isinstance(content, str):
            texts.append(content)
            continue
        if not isinstance(content, list):
            raise BadRequest("message 'content' must be a string or an array of parts")
        for part in content:
            if not isinstance(part, dict):
                raise BadRequest("content parts must be objects")
            kind = part.get("type")
            if kind == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise BadRequest("a text part needs a string 'text'")
                texts.append(text)
            elif kind == "image_url":
                image = part.get("image_url")
                url = image.get("url") if isinstance(image, dict) else image
                if not isinstance(url, str):
                    raise BadRequest("an image_url part needs a 'url'")
                images.append(url)
    return "\n".join(texts), images


def prompt_text(prompt: object) -> tuple[str, int]:
    """(text, token count) of a completion prompt: a string, strings, or token ids."""
    if isinstance(prompt, str):
        return prompt, count_tokens(prompt)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            text = "\n".join(prompt)
            return text, count_tokens(text)
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return " ".join(map(str, prompt)), len(prompt)
    raise BadRequest("'prompt' must be a string, an array of strings or an array of token ids")


def _timings(prompt_n: int, prompt_s: float, predicted_n: int, predicted_s: float) -> dict[str, object]:
    return {
        "prompt_n": prompt_n,
        "prompt_ms": round(prompt_s * 1000.0, 3),
        "prompt_per_second": prompt_n / prompt_s if prompt_s > 0 else None,
        "predicted_n": predicted_n,
        "predicted_ms": round(predicted_s * 1000.0, 3),
        "predicted_per_second": predicted_n / predicted_s if predicted_s > 0 else None,
    }


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }



@attrs.frozen
class _TextJob:
    model: str
    prompt: str
    prompt_tokens: int
    tokens: list[str]
    stream: bool

    @property
    def text(self) -> str:
        return "".join(self.tokens)


class LlamaServer(WeightsServer):
    """The request handlers; ``build_app`` wires them to routes."""

    def __init__(self, runtime: SimRuntime, options: LlamaOptions,
                 weights: Callable[[], Weights] | None = None) -> None:
        super().__init__(runtime, weights)
        self.opts = options

    @property
    def n_ctx(self) -> int:
        return self.opts.ctx_size or self.weights.context

    # -- common pieces -------------------------------------------------------------------------

    def _model(self, body: dict[str, object]) -> str:
        model = body.get("model")
        return model if isinstance(model, str) and model else self.opts.model_name

    def _check_context(self, prompt_tokens: int, gen_tokens: int) -> None:
        if prompt_tokens + gen_tokens > self.n_ctx:
            raise HttpError(400, openai_error(
                400,
                "the request exceeds the available context size, try increasing it",
                "exceed_context_size_error",
                n_prompt_tokens=prompt_tokens,
                n_ctx=self.n_ctx,
            ))

    def _job(self, body: dict[str, object], prompt: str, prompt_tokens: int, hash_input: str) -> _TextJob:
        gen = requested_max_tokens(body)
        self._check_context(prompt_tokens, gen)
        stream = body.get("stream") is True
        tokens = generate_tokens(self.weights.label, hash_input, gen)
        return _TextJob(self._model(body), prompt, prompt_tokens, tokens, stream)

    async def _generate(
        self,
        job: _TextJob,
        on_first: Callable[[], None] | None = None,
        on_token: Callable[[int, str], None] | None = None,
    ) -> dict[str, object]:
        """Hold a slot for prompt processing then generation; stream tokens as they are made."""
        async with self.rt.slot():
            prompt_s, gen_s = text_seconds(self.weights, job.prompt_tokens, len(job.tokens))
            started = self.rt.now()
            await self.rt.work(prompt_s)
            prompt_done = self.rt.now()
            if on_token is None:
                await self.rt.work(gen_s)
            else:
                if on_first is not None:
                    on_first()
                per_token = gen_s / len(job.tokens) if job.tokens else 0.0
                for index, token in enumerate(job.tokens):
                    await self.rt.work(per_token)
                    on_token(index, token)
            ended = self.rt.now()
        return _timings(job.prompt_tokens, prompt_done - started, len(job.tokens), ended - prompt_done)

    # -- informational routes ------------------------------------------------------------------

    async def health(self, request: Request) -> bytes:
        return send_json(request, 200, {"status": "ok"})

    async def models(self, request: Request) -> bytes:
        weights = self.weights
        return send_json(request, 200, {
            "object": "list",
            "data": [{
                "id": self.opts.model_name,
                "object": "model",
                "created": int(self.rt.now()),
                "owned_by": "llamacpp",
                "meta": {
                    "n_ctx_train": weights.context,
                    "n_embd": weights.embedding_dim,
                    "weights": weights.label,
                },
            }],
        })

    async def props(self, request: Request) -> bytes:
        return send_json(request, 200, {
            "default_generation_settings": {"n_ctx": self.n_ctx, "params": {"n_predict": -1}},
            "total_slots": self.opts.parallel,
            "model_path": self.opts.model_path,
            "model_alias": self.opts.model_name,
            "modalities": {"vision": self.opts.mmproj is not None, "audio": False},
            "embedding": self.opts.embedding,
            "build_info": FINGERPRINT,
        })

    # -- generation ----------------------------------------------------------------------------

    async def chat_completions(self, request: Request) -> bytes | None:
        body = openai_json_body(request)
        try:
            prompt, images = chat_prompt(body.get("messages"))
        except BadRequest as exc:
            raise openai_bad_request(str(exc)) from None
        if images and self.opts.mmproj is None:
            raise HttpError(500, openai_error(
                500,
                "image input is not supported - hint: if this is unexpected, you may need to provide "
                "the mmproj",
                "server_error",
            ))
        hash_input = "\n".join([prompt, *(f"[image:{url}]" for url in images)])
        job = self._job(body, prompt, count_tokens(prompt), hash_input)
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(self.rt.now())

        def envelope(obj: str, choice: dict[str, object], **extra: object) -> dict[str, object]:
            return {
                "id": completion_id, "object": obj, "created": created, "model": job.model,
                "system_fingerprint": FINGERPRINT, "choices": [choice], **extra,
            }

        usage = _usage(job.prompt_tokens, len(job.tokens))
        if not job.stream:
            timings = await self._generate(job)
            return send_json(request, 200, envelope(
                "chat.completion",
                {"index": 0, "message": {"role": "assistant", "content": job.text},
                 "finish_reason": "length"},
                usage=usage, timings=timings,
            ))
        sse = SseStream(request)

        def delta(content: dict[str, object], finish: str | None = None, **extra: object) -> None:
            sse.send(envelope(
                "chat.completion.chunk",
                {"index": 0, "delta": content, "finish_reason": finish}, **extra,
            ))

        timings = await self._generate(
            job,
            on_first=lambda: delta({"role": "assistant", "content": None}),
            on_token=lambda _i, token: delta({"content": token}),
        )
        delta({}, "length", usage=usage, timings=timings)
        sse.done()
        return None

    async def completions(self, request: Request) -> bytes | None:
        body = openai_json_body(request)
        job = self._prompt_job(body)
        completion_id = f"cmpl-{uuid.uuid4().hex}"
        created = int(self.rt.now())

        def envelope(text: str, finish: str | None, **extra: object) -> dict[str, object]:
            return {
                "id": completion_id, "object": "text_completion", "created": created,
                "model": job.model, "system_fingerprint": FINGERPRINT,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
                **extra,
            }

        usage = _usage(job.prompt_tokens, len(job.tokens))
        if not job.stream:
            timings = await self._generate(job)
            return send_json(request, 200, envelope(job.text, "length", usage=usage, timings=timings))
        sse = SseStream(request)
        timings = await self._generate(
            job, on_first=sse.start, on_token=lambda _i, token: sse.send(envelope(token, None))
        )
        sse.send(envelope("", "length", usage=usage, timings=timings))
        sse.done()
        return None

    def _prompt_job(self, body: dict[str, object]) -> _TextJob:
        if "prompt" not in body:
            raise openai_bad_request("\"prompt\" must be provided")
        try:
            text, tokens = prompt_text(body["prompt"])
        except BadRequest as exc:
            raise openai_bad_request(str(exc)) from None
        return self._job(body, text, tokens, text)

    async def completion(self, request: Request) -> bytes | None:
        """llama.cpp's native ``POST /completion``."""
        body = openai_json_body(request)
        job = self._prompt_job(body)

        def result(content: str, stop: bool, predicted: int, **extra: object) -> dict[str, object]:
            return {
                "index": 0, "content": content, "id_slot": 0, "stop": stop, "model": job.model,
                "tokens_predicted": predicted, "tokens_evaluated": job.prompt_tokens, **extra,
            }

        def final(content: str, timings: dict[str, object]) -> dict[str, object]:
            return result(
                content, True, len(job.tokens),
                generation_settings={"n_ctx": self.n_ctx, "n_predict": len(job.tokens)},
                prompt=job.prompt, truncated=False, stop_type="limit", stopping_word="",
                tokens_cached=0, timings=timings,
            )

        if not job.stream:
            timings = await self._generate(job)
            return send_json(request, 200, final(job.text, timings))
        sse = SseStream(request)
        timings = await self._generate(
            job, on_first=sse.start,
            on_token=lambda i, token: sse.send(result(token, False, i + 1)),
        )
        sse.send(final("", timings))
        return None

    async def embeddings(self, request: Request) -> bytes:
        if not self.opts.embedding:
            raise HttpError(501, openai_error(
                501, "This server does not support embeddings. Start it with `--embeddings`",
                "not_supported_error",
            ))
        body = openai_json_body(request)
        inputs = _embedding_inputs(body.get("input", body.get("content")))
        for _text, tokens in inputs:
            self._check_context(tokens, 0)
        as_base64 = body.get("encoding_format") == "base64"
        total = sum(tokens for _text, tokens in inputs)
        async with self.rt.slot():
            await self.rt.work(total / self.weights.prompt_tokens_per_s)
        data = []
        for index, (text, _tokens) in enumerate(inputs):
            vector = embedding_vector(self.weights.label, text, self.weights.embedding_dim)
            encoded: object = vector
            if as_base64:
                encoded = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
            data.append({"object": "embedding", "index": index, "embedding": encoded})
        return send_json(request, 200, {
            "object": "list", "model": self._model(body), "data": data,
            "usage": {"prompt_tokens": total, "total_tokens": total},
        })


def _embedding_inputs(raw: object) -> list[tuple[str, int]]:
    """(text, tokens) per input: a string, a token-id array, or an array of either."""
    if isinstance(raw, list) and raw and all(isinstance(item, str | list) for item in raw):
        items: list[object] = list(raw)
    else:
        items = [raw]
    try:
        return [prompt_text(item) if not isinstance(item, str) else (item, count_tokens(item))
                for item in items]
    except BadRequest:
        raise openai_bad_request(
            "'input' must be a string, an array of strings or an array of token arrays") from None


def _loading(request: Request) -> bytes:
    return send_json(request, 503, openai_error(503, "Loading model", "unavailable_error"))


def build_app(runtime: SimRuntime, options: LlamaOptions) -> Klein:
    server = LlamaServer(runtime, options)
    gets: dict[str, Handler] = {
        "/health": server.health, "/v1/health": server.health,
        "/v1/models": server.models, "/models": server.models,
        "/props": server.props,
    }
    posts: dict[str, Handler] = {
        "/v1/chat/completions": server.chat_completions,
        "/chat/completions": server.chat_completions,
        "/v1/completions": server.completions,
        "/completions": server.completions,
        "/completion": server.completion,
        "/v1/embeddings": server.embeddings, "/embeddings": server.embeddings,
        "/embedding": server.embeddings,
    }
    table = [*routes("GET", gets, work=False), *routes("POST", posts, work=True)]
    return build_family_app(runtime, table, loading_reply=_loading, error_body=openai_error_page)


def _build(runtime: SimRuntime, ns: argparse.Namespace) -> Klein:
    return build_app(runtime, options_from_args(ns))


def _slots(ns: argparse.Namespace) -> int:
    return int(ns.parallel)


PROGRAM = Family("llama-server", "text", FLAGS, _build, _slots, validate_args)
