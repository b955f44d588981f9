"""The least a body of a natively passed API must carry before it queues (README "APIs").

Anthropic's Messages (and its token count), OpenAI's Responses and rerank are passed to a backend that
speaks them (llama-server), which answers a body missing its main field with 500 ("'messages' is
required"): a client's mistake reported as a server fault, after it waited in the queue.  routerd
refuses such a body with 400 ``invalid_request_error`` at once, in the caller's API's error shape (the
edge's error writer picks it by path); everything else about the body is the backend's to judge.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from routerd.errors import HTTPError
from routerd.routing.classify import Route


def _bad(message: str) -> HTTPError:
    return HTTPError(400, message, "invalid_request_error", "invalid_request_error")


def refuse_malformed(route: Route, parsed: Mapping[str, Any] | None) -> None:
    """Raise 400 when a Messages, count-tokens, Responses or rerank body lacks what it is about."""
    kind = route.kind
    if parsed is None or kind not in ("messages", "count_tokens", "responses", "rerank"):
        return
    if kind in ("messages", "count_tokens"):
        messages = parsed.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, Mapping) and isinstance(m.get("role"), str) for m in messages):
            raise _bad("messages is required: a non-empty list of objects with a role")
    elif kind == "responses":
        if not isinstance(parsed.get("input"), (str, list)):
            raise _bad("input is required: a string or a list of input items")
    elif not isinstance(parsed.get("query"), str) or not isinstance(parsed.get("documents"), list):
        raise _bad("query (a string) and documents (a list) are required")
