"""HTTP helpers shared by the simulated servers: JSON bodies, error shapes, SSE streams."""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure
from twisted.web.server import Request

__all__ = [
    "BadRequest",
    "HttpError",
    "SseStream",
    "dumps",
    "openai_bad_request",
    "openai_error",
    "openai_json_body",
    "read_json",
    "send_json",
    "send_text",
    "set_header",
    "write",
]


class BadRequest(ValueError):
    """The request body cannot be used; the message is shown to the client."""


class HttpError(Exception):
    """Raised by a handler to answer with ``status`` and the JSON ``body``."""

    def __init__(self, status: int, body: object) -> None:
        super().__init__(status, body)
        self.status = status
        self.body = body


def dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def set_header(request: Request, name: bytes, value: bytes) -> None:
    untyped: Any = request  # twisted.web's Request.setHeader carries no annotations
    untyped.setHeader(name, value)


def write(request: Request, data: bytes) -> None:
    untyped: Any = request
    untyped.write(data)


def send_json(request: Request, status: int, obj: object) -> bytes:
    request.setResponseCode(status)
    set_header(request, b"Content-Type", b"application/json; charset=utf-8")
    return dumps(obj)


def send_text(request: Request, status: int, text: str, content_type: bytes = b"text/plain") -> bytes:
    request.setResponseCode(status)
    set_header(request, b"Content-Type", content_type + b"; charset=utf-8")
    return text.encode("utf-8")


def openai_error(status: int, message: str, type_: str, **extra: object) -> dict[str, object]:
    """The llama-server / OpenAI error shape ``{"error": {"code", "message", "type"}}``."""
    return {"error": {"code": status, "message": message, "type": type_, **extra}}


def read_json(request: Request) -> dict[str, object]:
    """The request body as a JSON object; ``BadRequest`` if it is not one."""
    content = request.content
    raw = content.read() if content is not None else b""
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadRequest(f"invalid JSON in request body: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def openai_bad_request(message: str) -> HttpError:
    """A 400 in the OpenAI error shape."""
    return HttpError(400, openai_error(400, message, "invalid_request_error"))


def openai_json_body(request: Request) -> dict[str, object]:
    """The request body as a JSON object; a 400 in the OpenAI error shape when it is not one."""
    try:
        return read_json(request)
    except BadRequest as exc:
        raise openai_bad_request(str(exc)) from None


class SseStream:
    """Server-sent events written to a request as they happen."""

    def __init__(self, request: Request) -> None:
        self._request = request
        self._started = False
        self.closed = False
        finished: Deferred[None] = request.notifyFinish()
        finished.addBoth(self._on_finish)

    def _on_finish(self, result: None | Failure) -> None:
        self.closed = True

    def start(self) -> None:
        if self._started:
            return
        self._started = True
        self._request.setResponseCode(200)
        set_header(self._request, b"Content-Type", b"text/event-stream")
        set_header(self._request, b"Cache-Control", b"no-cache")

    def send(self, obj: object) -> None:
        self.write(b"data: " + dumps(obj) + b"\n\n")

    def done(self) -> None:
        self.write(b"data: [DONE]\n\n")

    def write(self, data: bytes) -> None:
        self.start()
        if not self.closed:
            write(self._request, data)
