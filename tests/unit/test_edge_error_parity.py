"""One error writer for both edges: the same refused request gets the same answer — status,
headers and body — from the lean channel and from twisted.web's channel, in its route's error
family (OpenAI's envelope, Ollama's, or Anthropic's on the Messages API), with ``Retry-After`` where
the refusal says when to retry."""

from __future__ import annotations

import json
from typing import Any

import pytest

from routerd.errors import HTTPError, Saturated, StatusError
from tests.unit.edge_support import Edges, request

#: Headers each edge writes in its own way, whatever the answer (the clock's rendering, the server).
_OWN = {b"date", b"server"}


def _answer(raw: bytes, edge: str, fail: StatusError | None = None,
            **options: Any) -> tuple[int, dict[bytes, bytes], bytes]:
    """(status, headers by lower-case name, body) of the answer to ``raw`` on a new connection
    (the route raising ``fail``, if given)."""
    edges = Edges(**options)
    edges.api.fail = fail
    protocol, transport = edges.connect(edge)
    protocol.dataReceived(raw)
    head, _, body = transport.value().partition(b"\r\n\r\n")
    status_line, *lines = head.split(b"\r\n")
    headers: dict[bytes, bytes] = {}
    for line in lines:
        name, _, value = line.partition(b":")
        if name.lower() not in _OWN:
            headers[name.lower()] = value.strip()
    return int(status_line.split(b" ")[1]), headers, body


CASES = [
    ("draining-openai", request(), {"phase": "draining"}, 503, {"error": {
        "message": "this node is draining; retry later", "type": "overloaded", "code": "draining"}}, b"1"),
    ("starting-ollama", request(b"/api/chat"), {"phase": "starting"}, 503,
     {"error": "this node is starting; retry later"}, b"1"),
    ("buffer-full-openai", request(body=b"x" * 600), {"buffer": 100}, 503, {"error": {
        "message": "this node's request buffer (limits.replay_buffer_mb) is full; retry later",
        "type": "overloaded", "code": "buffer_full"}}, b"1"),
    ("no-key-openai", request(fields=(b"Host: node",)), {}, 401, {"error": {
        "message": "a valid inference key is required", "type": "unauthorized",
        "code": "unauthorized"}}, None),
    ("no-key-ollama", request(b"/api/chat", fields=(b"Host: node",)), {}, 401,
     {"error": "a valid inference key is required"}, None),
    ("wrong-key-ollama", request(b"/api/chat", fields=(b"Host: node", b"Authorization: Bearer nope-000000")),
     {}, 401, {"error": "a valid inference key is required"}, None),
    ("no-key-anthropic", request(b"/v1/messages", fields=(b"Host: node",)), {}, 401, {
        "type": "error", "error": {"type": "authentication_error",
                                   "message": "a valid inference key is required", "code": "unauthorized"}},
     None),
    ("draining-anthropic-count-tokens", request(b"/v1/messages/count_tokens"), {"phase": "draining"}, 503,
     {"type": "error", "error": {"type": "overloaded_error", "message": "this node is draining; retry later",
                                 "code": "draining"}}, b"1"),
    ("no-key-responses", request(b"/v1/responses", fields=(b"Host: node",)), {}, 401, {"error": {
        "message": "a valid inference key is required", "type": "unauthorized", "code": "unauthorized"}},
     None),
]


@pytest.mark.parametrize("raw,options,status,envelope,retry_after", [case[1:] for case in CASES],
                         ids=[case[0] for case in CASES])
def test_the_same_refusal_gets_the_same_status_headers_and_body_on_both_edges(
        raw: bytes, options: dict[str, Any], status: int, envelope: object,
        retry_after: bytes | None) -> None:
    lean = _answer(raw, "lean", **options)
    web = _answer(raw, "twisted", **options)
    assert lean == web
    got_status, headers, body = lean
    assert got_status == status
    assert json.loads(body) == envelope
    assert headers.get(b"retry-after") == retry_after
    assert headers[b"content-type"] == b"application/json"
    assert headers[b"connection"] == b"close"
    assert int(headers[b"content-length"]) == len(body)


HANDLER_ERRORS = [
    ("saturated-openai", request(), Saturated(429, "model 'm' has 2 requests queued", "queue_full", 3),
     {"error": {"message": "model 'm' has 2 requests queued", "type": "overloaded",
                "code": "queue_full"}}, b"3"),
    ("saturated-ollama", request(b"/api/chat"), Saturated(503, "this node is draining", "draining"),
     {"error": "this node is draining"}, b"1"),
    ("not-found-ollama", request(b"/api/chat"), HTTPError(404, "model 'm' not found", "not_found"),
     {"error": "model 'm' not found"}, None),
    ("saturated-anthropic", request(b"/v1/messages"), Saturated(429, "model 'm' has 2 requests queued",
                                                                "queue_full", 3),
     {"type": "error", "error": {"type": "rate_limit_error", "message": "model 'm' has 2 requests queued",
                                 "code": "queue_full"}}, b"3"),
    ("unsupported-backend-anthropic", request(b"/v1/messages"),
     HTTPError(501, "/v1/messages is not supported by the vllm backend family", "unsupported_backend"),
     {"type": "error", "error": {"type": "api_error", "code": "unsupported_backend",
                                 "message": "/v1/messages is not supported by the vllm backend family"}},
     None),
    ("state-refused-responses", request(b"/v1/responses"),
     HTTPError(400, "store: true is not supported", "invalid_request_error", "unsupported_server_state"),
     {"error": {"message": "store: true is not supported", "type": "invalid_request_error",
                "code": "unsupported_server_state"}}, None),
    ("not-found-rerank", request(b"/rerank"), HTTPError(404, "model 'm' was not found", "not_found"),
     {"error": {"message": "model 'm' was not found", "type": "not_found", "code": "not_found"}}, None),
]


@pytest.mark.parametrize("raw,fail,envelope,retry_after", [case[1:] for case in HANDLER_ERRORS],
                         ids=[case[0] for case in HANDLER_ERRORS])
def test_an_error_a_route_raises_is_answered_alike_by_both_edges(
        raw: bytes, fail: StatusError, envelope: object, retry_after: bytes | None) -> None:
    """The lean channel answers it through its own reply, twisted.web's through the dispatcher:
    the same writer gives both the same status, headers and envelope."""
    lean = _answer(raw, "lean", fail)
    web = _answer(raw, "twisted", fail)
    assert lean == web
    status, headers, body = lean
    assert status == fail.status
    assert json.loads(body) == envelope
    assert headers.get(b"retry-after") == retry_after
    assert headers[b"content-type"] == b"application/json"
