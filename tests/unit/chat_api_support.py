"""Shared by the translation tests: chat answers and streamed chat chunks as a backend sends them, and the
official SDKs' own parsers run over a translated answer (an in-memory ``httpx2`` transport: no socket)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anthropic
import httpx2
import openai


def chat_answer(
    content: str | None = "Hello.",
    finish: str = "stop",
    tool_calls: list[dict[str, Any]] | None = None,
    prompt: int = 12,
    completion: int = 3,
    **choice: Any,
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "local-7",
        "choices": [{"index": 0, "message": message, "finish_reason": finish, **choice}],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


def chunk(
    delta: dict[str, Any] | None = None,
    finish: str | None = None,
    choice: dict[str, Any] | None = None,
    **extra: Any,
) -> bytes:
    choices = (
        []
        if delta is None and finish is None
        else [{"index": 0, "delta": delta or {}, "finish_reason": finish, **(choice or {})}]
    )
    return (
        b"data: "
        + json.dumps(
            {"id": "c", "object": "chat.completion.chunk", "model": "local-7", "choices": choices, **extra}
        ).encode()
        + b"\n\n"
    )


def usage_chunk(prompt: int, completion: int) -> bytes:
    return chunk(
        usage={"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    )


DONE = b"data: [DONE]\n\n"


def text_stream(words: list[str], finish: str = "stop", prompt: int = 9) -> list[bytes]:
    """A chat stream with ``include_usage``: a role chunk, one chunk per word, the finish, the usage."""
    return [
        chunk({"role": "assistant", "content": ""}),
        *[chunk({"content": w}) for w in words],
        chunk({}, finish),
        usage_chunk(prompt, len(words)),
        DONE,
    ]


def tool_stream(name: str, pieces: list[str], text: str = "", prompt: int = 20) -> list[bytes]:
    """A chat stream calling ``name`` with its arguments in ``pieces`` (after ``text``, if any)."""
    head = [chunk({"role": "assistant", "content": ""})] + ([chunk({"content": text})] if text else [])
    start = chunk(
        {
            "tool_calls": [
                {"index": 0, "id": "call_9", "type": "function", "function": {"name": name, "arguments": ""}}
            ]
        }
    )
    args = [chunk({"tool_calls": [{"index": 0, "function": {"arguments": p}}]}) for p in pieces]
    return [*head, start, *args, chunk({}, "tool_calls"), usage_chunk(prompt, 7), DONE]


def convert(
    feed: Callable[[bytes], bytes], flush: Callable[[], bytes], chunks: list[bytes], split: int = 0
) -> bytes:
    """A converter's whole output for ``chunks``; ``split`` > 0 re-cuts the input into pieces of that size."""
    data = b"".join(chunks)
    pieces = [data[i : i + split] for i in range(0, len(data), split)] if split else chunks
    return b"".join(feed(p) for p in pieces) + flush()


def _transport(body: bytes, content_type: str) -> httpx2.Client:
    """The SDKs' HTTP client (``httpx2``, what both pinned SDKs build on) answering every call ``body``."""
    return httpx2.Client(
        transport=httpx2.MockTransport(
            lambda _request: httpx2.Response(200, content=body, headers={"content-type": content_type})
        )
    )


def anthropic_client(body: bytes, content_type: str = "text/event-stream") -> anthropic.Anthropic:
    """An anthropic client whose every call is answered ``body``."""
    return anthropic.Anthropic(
        api_key="k", base_url="http://routerd.test", max_retries=0, http_client=_transport(body, content_type)
    )


def openai_client(body: bytes, content_type: str = "text/event-stream") -> openai.OpenAI:
    """An openai client whose every call is answered ``body``."""
    return openai.OpenAI(
        api_key="k",
        base_url="http://routerd.test/v1",
        max_retries=0,
        http_client=_transport(body, content_type),
    )
