"""Reading JSON request bodies and writing JSON answers: one place for every route module."""

from __future__ import annotations

import json
from typing import Any

from twisted.web.iweb import IRequest

from routerd.errors import HTTPError
from routerd.routing.call import Reply
from routerd.routing.selector import SelectorError, parse_json_object


def json_response(request: IRequest, payload: Any, status: int = 200) -> bytes:
    request.setResponseCode(status)
    request.setHeader(b"content-type", b"application/json")
    return json.dumps(payload).encode()


def json_reply(reply: Reply, payload: Any, status: int = 200) -> bytes:
    """:func:`json_response` for a :class:`~routerd.routing.call.Reply` (a lean route)."""
    reply.set_status(status)
    reply.set_header(b"content-type", b"application/json")
    return json.dumps(payload).encode()


def read_json(request: IRequest, *, optional: bool = False) -> dict[str, Any]:
    """The request body as a JSON object; 400 otherwise.

    With ``optional`` an empty body reads as ``{}`` (``POST /router/v1/unload`` with no body
    means "everything"); otherwise it is refused.
    """
    content = request.content
    return parse_json_body(content.read() if content is not None else b"", optional=optional)


def parse_json_body(raw: bytes, *, optional: bool = False) -> dict[str, Any]:
    """A request body already read (a lean route's ``Incoming.body``) as :func:`read_json` reads it."""
    if not raw.strip():
        if optional:
            return {}
        raise HTTPError(400, "a JSON object body is required")
    try:
        return parse_json_object(raw)
    except SelectorError as exc:
        raise HTTPError(400, str(exc)) from None
