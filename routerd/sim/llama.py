"""A stand-in for llama.cpp's ``llama-server`` (OpenAI-compatible and native routes); its app and program
are :mod:`routerd.sim.llama_app`."""

from __future__ import annotations

import argparse
import base64
import os
import struct
import uuid
from collections.abc import Callable

import attrs
from twisted.web.server import Request

from routerd.sim.flags import Flag, below_floor
from routerd.sim.llama_info import (
    AUTO_PARALLEL,
    AUTO_SLOTS,
    LlamaMetrics,
    SlotTable,
    models_body,
    props_body,
    slot_context,
    timings_body,
    usage_body,
)
from routerd.sim.outputs import embedding_vector, generate_tokens
from routerd.sim.prompts import chat_prompt, embedding_inputs, prompt_text
from routerd.sim.runtime import SimRuntime, WeightsServer
from routerd.sim.timing import count_tokens, requested_max_tokens, text_seconds
from routerd.sim.tokens import Vocabulary, apply_template_body
from routerd.sim.tools import chat_tool_call
from routerd.sim.web import (
    BadRequest,
    HttpError,
    SseStream,
    openai_bad_request,
    openai_error,
    openai_json_body,
    send_json,
    send_text,
)
from routerd.sim.weights import Weights

__all__ = ["FLAGS", "LlamaOptions", "LlamaServer", "chat_prompt", "options_from_args", "validate_args"]

FLAGS: tuple[Flag, ...] = (
    Flag(("--host",), "host", str, "127.0.0.1", "address to listen on", "HOST"),
    Flag(("--port",), "port", int, 8080, "port to listen on", "PORT"),
    Flag(("-m", "--model"), "model", str, None, "model weights (*.sim.json)", "PATH"),
    Flag(("-c", "--ctx-size"), "ctx_size", int, 0, "context size (0: from the weights)", "N"),
    Flag(("-np", "--parallel"), "parallel", int, AUTO_PARALLEL,
         f"requests served at once (default: {AUTO_SLOTS} slots sharing one context)", "N"),
    Flag(("-kvu", "--kv-unified"), "kv_unified", bool, False,
         "the slots share one context instead of splitting -c"),
    Flag(("--metrics",), "metrics", bool, False, "serve /metrics"),
    Flag(("--mmproj",), "mmproj", str, None, "multimodal projector: accept image input", "PATH"),
    Flag(("--no-mmproj",), "no_mmproj", bool, False,
         "do not load the multimodal projector (image input is refused, as llama-server does)"),
    Flag(("--embedding", "--embeddings"), "embedding", bool, False, "serve /v1/embeddings"),
    Flag(("-a", "--alias"), "alias", str, None, "model name shown to clients", "NAME"),
    Flag(("--rerank", "--reranking"), "reranking", bool, False, "serve /v1/rerank and /rerank"),
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
    #: llama-server's own context rules (the programs reusing these handlers keep theirs): each slot's
    #: context from ``-c`` split over ``-np`` (:func:`slot_context`); a request is refused only when its
    #: prompt fills the slot, and generation stops at the slot's end.
    llama_rules: bool = False
    kv_unified: bool = False
    metrics: bool = False
    reranking: bool = False

    @property
    def model_name(self) -> str:
        return self.alias or os.path.basename(self.model_path)

    @property
    def slots(self) -> int:
        return AUTO_SLOTS if self.parallel == AUTO_PARALLEL else self.parallel


def validate_args(ns: argparse.Namespace) -> str | None:
    if ns.parallel == AUTO_PARALLEL:
        return below_floor(ns, {"ctx_size": 0})
    return below_floor(ns, {"parallel": 1, "ctx_size": 0})


def options_from_args(ns: argparse.Namespace) -> LlamaOptions:
    return LlamaOptions(
        model_path=ns.model, ctx_size=ns.ctx_size, parallel=ns.parallel,
        mmproj=None if ns.no_mmproj else ns.mmproj, embedding=ns.embedding, alias=ns.alias,
        llama_rules=True, kv_unified=ns.kv_unified, metrics=ns.metrics, reranking=ns.reranking,
    )


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
        self.slot_table = SlotTable.of(options.slots)
        self.vocabulary = Vocabulary()
        self.counted = LlamaMetrics()

    @property
    def n_ctx(self) -> int:
        """The context of one slot."""
        if self.opts.llama_rules:
            unified = self.opts.kv_unified or self.opts.parallel == AUTO_PARALLEL
            return slot_context(self.opts.ctx_size, self.opts.slots, unified, self.weights.context)
        return self.opts.ctx_size or self.weights.context

    # -- common pieces -------------------------------------------------------------------------

    def _model(self, body: dict[str, object]) -> str:
        model = body.get("model")
        return model if isinstance(model, str) and model else self.opts.model_name

    def _check_context(self, prompt_tokens: int, gen_tokens: int) -> None:
        """Refuse a request the slot cannot hold: under llama-server's rules, one whose prompt fills the
        slot (the generation is cut at the slot's end instead, :meth:`_generated`); otherwise, one whose
        prompt and generation together overflow it."""
        needed = prompt_tokens + (0 if self.opts.llama_rules else gen_tokens)
        if needed > self.n_ctx or (self.opts.llama_rules and needed >= self.n_ctx):
            raise HttpError(400, openai_error(
                400,
                f"request ({needed} tokens) exceeds the available context size ({self.n_ctx} tokens), "
                "try increasing it",
                "exceed_context_size_error",
                n_prompt_tokens=prompt_tokens,
                n_ctx=self.n_ctx,
            ))

    def _generated(self, prompt_tokens: int, requested: int) -> int:
        """How many tokens a job generates: the requested count, cut at the slot's end under llama-server's
        rules (its ``finish_reason`` stays "length")."""
        return min(requested, self.n_ctx - prompt_tokens) if self.opts.llama_rules else requested

    def _job(self, body: dict[str, object], prompt: str, prompt_tokens: int, hash_input: str) -> _TextJob:
        gen = requested_max_tokens(body)
        self._check_context(prompt_tokens, gen)
        gen = self._generated(prompt_tokens, gen)
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
            slot = self.slot_table.take(job.prompt_tokens, len(job.tokens))
            try:
                prompt_s, gen_s = text_seconds(self.weights, job.prompt_tokens, len(job.tokens))
                started = self.rt.now()
                await self.rt.work(prompt_s)
                prompt_done = self.rt.now()
                if on_token is None:
                    await self.rt.work(gen_s)
                    slot.decoded = len(job.tokens)
                else:
                    if on_first is not None:
                        on_first()
                    per_token = gen_s / len(job.tokens) if job.tokens else 0.0
                    for index, token in enumerate(job.tokens):
                        await self.rt.work(per_token)
                        slot.decoded = index + 1
                        on_token(index, token)
                ended = self.rt.now()
            finally:
                slot.processing = False
        self.counted.add(job.prompt_tokens, prompt_done - started, len(job.tokens), ended - prompt_done)
        return timings_body(job.prompt_tokens, prompt_done - started, len(job.tokens), ended - prompt_done)

    # -- informational routes ------------------------------------------------------------------

    async def health(self, request: Request) -> bytes:
        return send_json(request, 200, {"status": "ok"})

    async def models(self, request: Request) -> bytes:
        return send_json(request, 200, models_body(self.opts.model_name, self.weights, self.n_ctx,
                                                   int(self.rt.now()), self.opts.mmproj is not None))

    async def props(self, request: Request) -> bytes:
        return send_json(request, 200, props_body(
            model=self.opts.model_name, model_path=self.opts.model_path, n_ctx=self.n_ctx,
            slots=self.opts.slots, vision=self.opts.mmproj is not None, metrics=self.opts.metrics,
            build_info=FINGERPRINT,
        ))

    async def slots(self, request: Request) -> bytes:
        return send_json(request, 200, self.slot_table.to_json(self.n_ctx))

    async def metrics(self, request: Request) -> bytes:
        if not self.opts.metrics:
            raise HttpError(501, openai_error(
                501, "This server does not support metrics endpoint. Start it with `--metrics`",
                "not_supported_error",
            ))
        counters = self.rt.counters
        text = self.counted.text(counters.running, counters.waiting)
        return send_text(request, 200, text, b"text/plain; version=0.0.4")

    # -- tokenizer -----------------------------------------------------------------------------

    async def tokenize(self, request: Request) -> bytes:
        return send_json(request, 200, self._parsed(self.vocabulary.tokenize_body, request))

    async def detokenize(self, request: Request) -> bytes:
        return send_json(request, 200, self._parsed(self.vocabulary.detokenize_body, request))

    async def apply_template(self, request: Request) -> bytes:
        return send_json(request, 200, self._parsed(apply_template_body, request))

    @staticmethod
    def _parsed(answer: Callable[[dict[str, object]], dict[str, object]],
                request: Request) -> dict[str, object]:
        try:
            return answer(openai_json_body(request))
        except BadRequest as exc:
            raise openai_bad_request(str(exc)) from None

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
        call = chat_tool_call(body, self.weights.label, hash_input)  # routerd.sim.tools: when and how
        if call is not None:
            job = attrs.evolve(job, tokens=call.pieces)
        finish = "length" if call is None else "tool_calls"
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(self.rt.now())

        def envelope(obj: str, choice: dict[str, object], **extra: object) -> dict[str, object]:
            return {
                "id": completion_id, "object": obj, "created": created, "model": job.model,
                "system_fingerprint": FINGERPRINT, "choices": [choice], **extra,
            }

        usage = usage_body(job.prompt_tokens, len(job.tokens))
        if not job.stream:
            timings = await self._generate(job)
            return send_json(request, 200, envelope(
                "chat.completion",
                {"index": 0, "finish_reason": finish,
                 "message": call.chat_message() if call else {"role": "assistant", "content": job.text}},
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
            on_token=lambda i, token: delta(call.chat_delta(i, token) if call else {"content": token}),
        )
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage") is True:
            # the usage comes in a chunk of its own, with no choices, after the one that finishes
            delta({}, finish)
            sse.send({**envelope("chat.completion.chunk", {}), "choices": [], "usage": usage,
                      "timings": timings})
        else:
            delta({}, finish, timings=timings)
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

        usage = usage_body(job.prompt_tokens, len(job.tokens))
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
            # a streamed token's chunk has its token ids, no model and no slot (-1); the final answer has a
            # model and a slot, and no token ids
            ids = [] if stop else [token for token, _piece in self.vocabulary.tokenize(content)]
            return {
                "index": 0, "content": content, "tokens": ids,
                "id_slot": 0 if stop else -1, "stop": stop, "tokens_predicted": predicted,
                "tokens_evaluated": job.prompt_tokens, **extra,
            }

        def final(content: str, timings: dict[str, object]) -> dict[str, object]:
            return result(
                content, True, len(job.tokens), model=job.model,
                generation_settings={"n_predict": len(job.tokens)},
                prompt=job.prompt, has_new_line="\n" in job.text, truncated=False, stop_type="limit",
                stopping_word="", tokens_cached=job.prompt_tokens + len(job.tokens), timings=timings,
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

    async def _embed(self, request: Request) -> tuple[dict[str, object], list[list[float]], int]:
        """(request body, a vector per input, prompt tokens) of an embeddings request."""
        if not self.opts.embedding:
            raise HttpError(501, openai_error(
                501, "This server does not support embeddings. Start it with `--embeddings`",
                "not_supported_error",
            ))
        body = openai_json_body(request)
        inputs = embedding_inputs(body.get("input", body.get("content")))
        for _text, tokens in inputs:
            if not self.opts.llama_rules:
                self._check_context(tokens, 0)
            elif tokens > self.n_ctx:
                raise HttpError(400, openai_error(
                    400, f"input ({tokens} tokens) is larger than the max context size ({self.n_ctx} "
                    "tokens). skipping", "exceed_context_size_error",
                    n_prompt_tokens=tokens, n_ctx=self.n_ctx))
        total = sum(tokens for _text, tokens in inputs)
        async with self.rt.slot():
            await self.rt.work(total / self.weights.prompt_tokens_per_s)
        dim = self.weights.embedding_dim
        return body, [embedding_vector(self.weights.label, text, dim) for text, _tokens in inputs], total

    async def embedding(self, request: Request) -> bytes:
        """llama-server's native ``/embedding``: per input, its pooled vector in a list of one."""
        _body, vectors, _total = await self._embed(request)
        pooled = [{"index": i, "embedding": [vector]} for i, vector in enumerate(vectors)]
        return send_json(request, 200, pooled)

    async def embeddings(self, request: Request) -> bytes:
        body, vectors, total = await self._embed(request)
        as_base64 = body.get("encoding_format") == "base64"
        data: list[dict[str, object]] = []
        for index, vector in enumerate(vectors):
            item: dict[str, object] = {"object": "embedding", "index": index, "embedding": vector}
            if as_base64:  # llama-server names the encoding in each item then
                packed = struct.pack(f"<{len(vector)}f", *vector)
                item.update(embedding=base64.b64encode(packed).decode("ascii"), encoding_format="base64")
            data.append(item)
        return send_json(request, 200, {
            "object": "list", "model": self._model(body), "data": data,
            "usage": {"prompt_tokens": total, "total_tokens": total},
        })
