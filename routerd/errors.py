"""Errors with an HTTP status, and their envelopes per path family (contract §4).

Every layer raises :class:`StatusError` (or a subclass) for a failure a caller must see; every
answer to one is built by :func:`error_answer` (status, headers, envelope), whichever edge or handler
writes it.  OpenAI-style paths answer ``{"error": {"message", "type", "code"}}``; Ollama paths
(``/api/*`` apart from Kobold's ``/api/v1`` and ``/api/extra``) answer ``{"error": "..."}``; Anthropic's
Messages API (``/v1/messages`` and under it) answers ``{"type": "error", "error": {"type", "message",
"code"}}`` with Anthropic's error type for the status (:data:`ANTHROPIC_TYPES`).
"""

from __future__ import annotations

import json
from typing import Literal

ErrorStyle = Literal["openai", "ollama", "anthropic"]

#: The paths of Anthropic's Messages API (and every path under it): their errors are Anthropic's.
ANTHROPIC_PATH = "/v1/messages"

#: Anthropic's error ``type`` for an HTTP status (its API's documented set); any other status is an
#: ``api_error`` (5xx) or an ``invalid_request_error`` (4xx).
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                   500: "api_error", 503: "overloaded_error", 529: "overloaded_error"}


class StatusError(Exception):
    """An error the API answers with ``status`` and an error envelope (``type``, ``code``).

    The HTTP edge answers every one the same way; ``reason`` (also ``message``) is the
    human-readable text.
    """

    #: Seconds a client should wait before it retries (``Retry-After``), or None.
    retry_after: int | None = None

    def __init__(self, status: int, reason: str, type_: str, code: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.message = reason
        self.type = type_
        self.code = code


class HTTPError(StatusError):
    """An error with an HTTP status, a machine-readable type/code and a reason.

    Every ``StatusError`` (the cluster and registry errors too) is answered
    the same way by the API layer.
    """

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 code: str | None = None) -> None:
        super().__init__(status, message, type_, code or type_)


class Saturated(HTTPError):
    """A node or model cannot take the request now: 429 (queue bound) or 503 (buffer bound),
    answered with ``Retry-After: retry_after`` seconds (contract §5)."""

    def __init__(self, status: int, message: str, code: str, retry_after: int = 1) -> None:
        super().__init__(status, message, "overloaded", code)
        self.retry_after = retry_after


def draining() -> Saturated:
    """503 for an own request a draining node will never run (``Retry-After``: another node, or this
    one restarted, takes it)."""
    return Saturated(503, "this node is draining (shutting down); retry on another node", "draining")


def queue_full(public_id: str, depth: int, limit: int) -> Saturated:
    """429 for a request that would queue past ``limits.max_queued_per_model`` (waiting for the
    backend slot, or held in the router for a linked model)."""
    return Saturated(429, f"model {public_id!r} has {depth} requests queued (the limit is {limit}); "
                          "retry later", "queue_full")


def is_anthropic_path(path: str) -> bool:
    """Whether ``path`` (without its query) is Anthropic's Messages API: ``/v1/messages`` or under it."""
    return path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/")


def style_for_path(path: str) -> ErrorStyle:
    if is_anthropic_path(path.split("?", 1)[0]):
        return "anthropic"
    if path.startswith("/api/") and not path.startswith(("/api/v1/", "/api/extra/")):
        return "ollama"
    return "openai"


def anthropic_type(status: int) -> str:
    """Anthropic's error ``type`` for ``status``."""
    return ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_body(style: ErrorStyle, message: str, type_: str, code: str, status: int = 400) -> bytes:
    """The envelope of an error in ``style``; ``status`` chooses Anthropic's error type (routerd's own
    ``code`` is kept beside it, for a client that reads it)."""
    if style == "ollama":
        return json.dumps({"error": message}).encode()
    if style == "anthropic":
        return json.dumps({"type": "error", "error": {"type": anthropic_type(status), "message": message,
                                                      "code": code}}).encode()
    return json.dumps({"error": {"message": message, "type": type_, "code": code}}).encode()


def stream_error(style: ErrorStyle, err: StatusError) -> bytes:
    """The last bytes of a streamed answer that fails after it started (its status and headers have
    gone out, so the error can only be said in the stream): ``err``'s envelope in ``style`` as one
    NDJSON line (Ollama's streams; Ollama itself ends a failed stream so), else as one SSE ``error``
    event (what OpenAI's and Anthropic's SDKs raise on), after a blank line that ends any event the
    stream was in the middle of.  The answer's chunked body then ends as usual: the client reads an
    error, not a connection that broke."""
    body = error_body(style, err.message, err.type, err.code, err.status)
    if style == "ollama":
        return body + b"\n"
    return b"\nevent: error\ndata: " + body + b"\n\n"


#: The content type of every error envelope.
_JSON = (b"content-type", b"application/json")


def error_answer(err: StatusError, style: ErrorStyle) -> tuple[int, tuple[tuple[bytes, bytes], ...], bytes]:
    """The answer to ``err`` in the error family ``style``: its status, its headers (the JSON
    content type, and ``Retry-After`` when the error says when to retry) and its envelope.  The one
    place both HTTP edges and every handler take an error's answer from."""
    body = error_body(style, err.message, err.type, err.code, err.status)
    if err.retry_after is None:
        return err.status, (_JSON,), body
    return err.status, (_JSON, (b"Retry-After", str(err.retry_after).encode())), body
