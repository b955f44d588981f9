"""The simulated llama-server's Anthropic Messages (and token counting), OpenAI Responses and rerank routes,
in llama-server b11434's shapes (``tests/integration/conformance.py`` holds them to the real server).

* ``POST /v1/messages``: a Messages object (``content[{type: text, text}]``, ``stop_reason``,
  ``usage {cache_read_input_tokens, input_tokens, output_tokens}``); streamed as Anthropic's named events
  (``message_start`` … ``message_stop``, no ``[DONE]``).
* ``POST /v1/messages/count_tokens``: ``{"input_tokens"}``.
* ``POST /v1/responses``: a Response object (``output[{type: message, content[{type: output_text}]}]``,
  ``usage {input_tokens, output_tokens, total_tokens, input_tokens_details}``); streamed as the Responses
  API's named events (``response.created`` … ``response.completed``, no ``[DONE]``);
  ``previous_response_id`` is refused (400) as llama-server does.
* ``POST /v1/rerank`` and ``/rerank``: 501 unless started with ``--reranking``; else ``results[{index,
  relevance_score}]`` with ``usage``.

Tools: a request with ``tools`` may be answered with a tool call (``tool_use`` blocks, ``function_call``
items), by :mod:`routerd.sim.tools`'s rule and in its shapes; tool results (``tool_result`` blocks,
``function_call_output`` items) are read as prompt text.

Each generation runs as the chat route's does (:meth:`LlamaServer._generate`: a slot, the model's timing).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable

import attrs
from twisted.web.server import Request

from routerd.sim.llama import LlamaServer, _TextJob
from routerd.sim.runtime import Handler
from routerd.sim.timing import count_tokens, requested_max_tokens
from routerd.sim.tools import ToolCall, messages_tool_call, responses_tool_call
from routerd.sim.web import (
    HttpError,
    SseStream,
    openai_bad_request,
    openai_error,
    openai_json_body,
    send_json,
)

__all__ = ["api_routes"]

#: The tokens llama-server's chat template adds around a Messages or Responses prompt (the tiny model's
#: template; the count is a fact of the template, not of the text).
TEMPLATE_TOKENS = 4


def _text_of(content: object, text_types: tuple[str, ...]) -> list[str]:
    """The texts of a message's content: a string, or the parts of ``text_types`` and the texts of
    ``tool_result`` blocks (others skipped)."""
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    texts: list[str] = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "tool_result":
            texts += _text_of(part.get("content"), text_types)
        elif isinstance(part, dict) and part.get("type") in text_types and isinstance(part.get("text"), str):
            texts.append(part["text"])
    return texts


def messages_prompt(body: dict[str, object]) -> str:
    """The prompt text of a Messages request: its ``system`` and every message's text blocks."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise HttpError(500, openai_error(500, "'messages' is required", "server_error"))
    texts = _text_of(body.get("system"), ("text",))
    for message in messages:
        if isinstance(message, dict):
            texts += _text_of(message.get("content"), ("text",))
    return "\n".join(texts)


def responses_prompt(body: dict[str, object]) -> str:
    """The prompt text of a Responses request: its ``instructions`` and ``input`` (a string or items)."""
    given = body.get("input")
    if given is None:
        raise openai_bad_request("'input' is required")
    if body.get("previous_response_id") is not None:
        raise openai_bad_request("llama.cpp does not support 'previous_response_id'.")
    texts = _text_of(body.get("instructions"), ())
    if isinstance(given, str):
        texts.append(given)
    elif isinstance(given, list):
        for item in given:
            if isinstance(item, dict):
                content = item.get("content", item.get("output"))  # a function_call_output's "output"
                texts += _text_of(content, ("input_text", "output_text", "text"))
    return "\n".join(texts)


def _named(sse: SseStream, name: str, data: dict[str, object]) -> None:
    sse.write(f"event: {name}\ndata: ".encode() + json.dumps({"type": name, **data}).encode() + b"\n\n")


class NativeApis:
    """The handlers, over a :class:`LlamaServer`'s generation."""

    def __init__(self, server: LlamaServer, reranking: bool) -> None:
        self.server = server
        self.reranking = reranking

    # -- Anthropic Messages ----------------------------------------------------------------------

    async def count_tokens(self, request: Request) -> bytes:
        body = openai_json_body(request)
        tokens = count_tokens(messages_prompt(body)) + TEMPLATE_TOKENS
        return send_json(request, 200, {"input_tokens": tokens})

    async def messages(self, request: Request) -> bytes | None:
        body = openai_json_body(request)
        prompt = messages_prompt(body)
        job = self.server._job({**body, "max_tokens": requested_max_tokens(body)}, prompt,
                               count_tokens(prompt) + TEMPLATE_TOKENS, prompt)
        call = messages_tool_call(body, self.server.weights.label, prompt)
        if call is not None:
            job = attrs.evolve(job, tokens=call.pieces)
        stop = "max_tokens" if call is None else "tool_use"
        message_id = f"chatcmpl-{uuid.uuid4().hex}"
        head: dict[str, object] = {"id": message_id, "type": "message", "role": "assistant"}
        if not job.stream:
            await self.server._generate(job)
            block = {"type": "text", "text": job.text} if call is None else call.tool_use_block()
            return send_json(request, 200, {
                **head, "content": [block], "model": job.model, "stop_reason": stop, "stop_sequence": None,
                "usage": {"cache_read_input_tokens": 0, "input_tokens": job.prompt_tokens,
                          "output_tokens": len(job.tokens)}})
        sse = SseStream(request)

        def first() -> None:
            _named(sse, "message_start", {"message": {
                **head, "content": [], "model": job.model, "stop_reason": None, "stop_sequence": None,
                "usage": {"cache_read_input_tokens": 0, "input_tokens": job.prompt_tokens,
                          "output_tokens": 0}}})
            _named(sse, "content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}
                                                if call is None else call.tool_use_start()})

        def delta(token: str) -> dict[str, object]:
            if call is None:
                return {"type": "text_delta", "text": token}
            return {"type": "input_json_delta", "partial_json": token}

        await self.server._generate(job, on_first=first, on_token=lambda _i, token: _named(
            sse, "content_block_delta", {"index": 0, "delta": delta(token)}))
        _named(sse, "content_block_stop", {"index": 0})
        _named(sse, "message_delta", {"delta": {"stop_reason": stop, "stop_sequence": None},
                                      "usage": {"output_tokens": len(job.tokens)}})
        _named(sse, "message_stop", {})
        return None

    # -- OpenAI Responses ------------------------------------------------------------------------

    async def responses(self, request: Request) -> bytes | None:
        body = openai_json_body(request)
        prompt = responses_prompt(body)
        limit = body.get("max_output_tokens")
        job = self.server._job({**body, "max_tokens": limit if isinstance(limit, int) else -1}, prompt,
                               count_tokens(prompt) + TEMPLATE_TOKENS, prompt)
        call = responses_tool_call(body, self.server.weights.label, prompt)
        if call is not None:
            job = attrs.evolve(job, tokens=call.pieces)
        response_id, item_id = f"resp_{uuid.uuid4().hex}", f"msg_{uuid.uuid4().hex}"
        created = int(self.server.rt.now())

        def part(text: str) -> dict[str, object]:
            return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}

        def usage() -> dict[str, object]:
            return {"input_tokens": job.prompt_tokens, "output_tokens": len(job.tokens),
                    "total_tokens": job.prompt_tokens + len(job.tokens),
                    "input_tokens_details": {"cached_tokens": 0}}

        if not job.stream:
            await self.server._generate(job)
            return send_json(request, 200, {
                "completed_at": int(self.server.rt.now()), "created_at": created, "id": response_id,
                "model": job.model, "object": "response",
                "output": [{"content": [part(job.text)], "id": item_id, "role": "assistant",
                            "status": "completed", "type": "message"} if call is None
                           else call.function_call_item(done=True)],
                "status": "completed", "usage": usage()})
        sse = SseStream(request)
        started: dict[str, object] = {"id": response_id, "object": "response", "status": "in_progress"}
        if call is not None:
            await self._stream_call(sse, job, call, started, created, usage)
            return None

        def first() -> None:
            _named(sse, "response.created", {"response": started})
            _named(sse, "response.in_progress", {"response": started})
            _named(sse, "response.output_item.added", {"item": {
                "content": [], "id": item_id, "role": "assistant", "status": "in_progress",
                "type": "message"}})
            _named(sse, "response.content_part.added", {"item_id": item_id,
                                                        "part": {"type": "output_text", "text": ""}})

        timings = await self.server._generate(job, on_first=first, on_token=lambda _i, token: _named(
            sse, "response.output_text.delta", {"item_id": item_id, "delta": token}))
        _named(sse, "response.output_text.done", {"item_id": item_id, "text": job.text})
        _named(sse, "response.content_part.done", {"item_id": item_id, "part": part(job.text)})
        item = {"type": "message", "status": "completed", "id": item_id, "content": [part(job.text)],
                "role": "assistant"}
        _named(sse, "response.output_item.done", {"item": item})
        _named(sse, "response.completed", {"response": {
            "id": response_id, "object": "response", "created_at": created, "status": "completed",
            "model": job.model, "output": [item], "usage": usage()}, "timings": timings})
        return None

    async def _stream_call(self, sse: SseStream, job: _TextJob, call: ToolCall, started: dict[str, object],
                           created: int, usage: Callable[[], dict[str, object]]) -> None:
        """A streamed Responses answer that is a tool call: its ``function_call`` item, its arguments'
        deltas (no ``response.function_call_arguments.done``: llama-server sends none)."""

        def first() -> None:
            _named(sse, "response.created", {"response": started})
            _named(sse, "response.in_progress", {"response": started})
            _named(sse, "response.output_item.added", {"item": call.function_call_item(done=False)})

        timings = await self.server._generate(job, on_first=first, on_token=lambda _i, token: _named(
            sse, "response.function_call_arguments.delta", {"delta": token, "item_id": call.item_id}))
        item = call.function_call_item(done=True)
        _named(sse, "response.output_item.done", {"item": item})
        _named(sse, "response.completed", {"response": {
            **started, "created_at": created, "status": "completed", "model": job.model,
            "output": [item], "usage": usage()}, "timings": timings})

    # -- rerank ----------------------------------------------------------------------------------

    async def rerank(self, request: Request) -> bytes:
        if not self.reranking:
            raise HttpError(501, openai_error(
                501, "This server does not support reranking. Start it with `--reranking`",
                "not_supported_error"))
        body = openai_json_body(request)
        query, documents = body.get("query"), body.get("documents")
        if not isinstance(query, str) or not isinstance(documents, list) \
                or not all(isinstance(d, str) for d in documents):
            raise openai_bad_request("\"query\" must be a string and \"documents\" an array of strings")
        tokens = sum(count_tokens(query + d) for d in documents)
        async with self.server.rt.slot():
            await self.server.rt.work(tokens / self.server.weights.prompt_tokens_per_s)
        results: list[dict[str, object]] = [{"index": i, "relevance_score": _score(query, d)}
                                            for i, d in enumerate(documents)]
        top = body.get("top_n")
        if isinstance(top, int) and not isinstance(top, bool) and top >= 0:
            results = sorted(results, key=lambda r: -float(str(r["relevance_score"])))[:top]
        return send_json(request, 200, {"model": self.server._model(body), "object": "list",
                                        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
                                        "results": results})


def _score(query: str, document: str) -> float:
    """A relevance in [0, 1) that the same pair always gets."""
    digest = hashlib.sha256(f"{query}\0{document}".encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32


def api_routes(server: LlamaServer, reranking: bool) -> dict[str, Handler]:
    """The POST routes of these APIs, by path."""
    apis = NativeApis(server, reranking)
    table: dict[str, Handler] = {
        "/v1/messages": apis.messages, "/v1/messages/count_tokens": apis.count_tokens,
        "/v1/responses": apis.responses, "/v1/rerank": apis.rerank, "/rerank": apis.rerank,
    }
    return table
