"""Error envelopes per path family (contract §4).

OpenAI-style paths answer ``{"error": {"message", "type", "code"}}``; Ollama
paths (``/api/*`` apart from Kobold's ``/api/v1`` and ``/api/extra``) answer
``{"error": "..."}``.  Every error a node sends goes through ``send_error`` so
the shape is decided in one place.
"""

from __future__ import annotations

import json
from typing import Literal

from twisted.web.iweb import IRequest

from routerd.cluster.wire import StatusError

ErrorStyle = Literal["openai", "ollama"]


class HTTPError(StatusError):
    """An error with an HTTP status, a machine-readable type/code and a reason.

    Every ``StatusError`` (the cluster and registry errors too) is answered
    the same way by the API layer.
    """

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 code: str | None = None) -> None:
        super().__init__(status, message, type_, code or type_)


def style_for_path(path: str) -> ErrorStyle:
    if path.startswith("/api/") and not path.startswith(("/api/v1/", "/api/extra/")):
        return "ollama"
    return "openai"


def error_body(style: ErrorStyle, message: str, type_: str, code: str) -> bytes:
    if style == "ollama":
        return json.dumps({"error": message}).encode()
    return json.dumps({"error": {"message": message, "type": type_, "code": code}}).encode()


def send_error(request: IRequest, err: StatusError, style: ErrorStyle | None = None) -> bytes:
    """Set status and headers for ``err`` and return the body to write."""
    if style is None:
        style = style_for_path(request.path.decode("utf-8", "replace"))
    request.setResponseCode(err.status)
    request.setHeader(b"content-type", b"application/json")
    return error_body(style, err.message, err.type, err.code)
