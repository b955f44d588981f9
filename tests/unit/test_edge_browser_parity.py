"""Path parity for what a web page could make a browser send (:mod:`routerd.api.browser`): the same
bytes through the lean channel and through twisted.web's channel get the same status and error
code, and the one the rules call for.  A keyless node (inference needs no key) answering to
``node``; curl, scripts and same-origin pages are served, drive-by pages are refused."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from routerd.api.browser import BrowserRules
from tests.unit.edge_support import KEY, Edges

CHAT = b"/v1/chat/completions"
JSON = b"Content-Type: application/json"
TEXT = b"Content-Type: text/plain;charset=UTF-8"
AUTH = b"Authorization: Bearer " + KEY.encode()
BODY = b'{"model":"m"}'


def raw(*fields: bytes, path: bytes = CHAT, method: bytes = b"POST", body: bytes | None = BODY) -> bytes:
    lines = [method + b" " + path + b" HTTP/1.1", *fields]
    if body is not None:
        lines.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n" + (body or b"")


def edges(keys: tuple[str, ...] = (), cors: tuple[str, ...] = ()) -> Edges:
    """A node's edge with the node's browser rules (names: ``node``, and what every node answers to)."""
    built = Edges(keys=keys, cors=cors)
    built.guard.rules = attrs.evolve(built.guard.rules, browser=BrowserRules.build(("node",)))
    return built


#: (id, raw request, Edges options, expected (status, code))
ROWS: list[tuple[str, bytes, dict[str, Any], tuple[int, str]]] = [
    ("curl-json-keyless", raw(b"Host: node", JSON), {}, (200, "")),
    ("curl-no-content-type", raw(b"Host: node"), {}, (200, "")),
    ("loopback-ip-host", raw(b"Host: 127.0.0.1:8080", JSON), {}, (200, "")),
    ("localhost-host", raw(b"Host: localhost:8080", JSON), {}, (200, "")),
    ("ipv6-loopback-host", raw(b"Host: [::1]:8080", JSON), {}, (200, "")),
    ("same-origin-page", raw(b"Host: 127.0.0.1:8080", b"Origin: http://127.0.0.1:8080",
                             b"Sec-Fetch-Site: same-origin", JSON), {}, (200, "")),
    ("drive-by-text-plain-from-another-origin",
     raw(b"Host: 127.0.0.1:8080", b"Origin: https://evil.example", b"Sec-Fetch-Site: cross-site", TEXT),
     {}, (403, "cross_origin")),
    ("foreign-origin-without-fetch-metadata",
     raw(b"Host: 127.0.0.1:8080", b"Origin: https://evil.example", JSON), {}, (403, "cross_origin")),
    ("other-port-same-host", raw(b"Host: localhost:8080", b"Origin: http://localhost:3000", JSON),
     {}, (403, "cross_origin")),
    ("opaque-origin-null", raw(b"Host: 127.0.0.1:8080", b"Origin: null", TEXT), {}, (403, "cross_origin")),
    ("cross-site-fetch-metadata-alone", raw(b"Host: node", b"Sec-Fetch-Site: cross-site", JSON), {},
     (403, "cross_origin")),
    ("listed-cors-origin", raw(b"Host: node", b"Origin: https://ui.example", JSON),
     {"cors": ("https://ui.example",)}, (200, "")),
    ("text-plain-without-origin", raw(b"Host: node", TEXT), {}, (415, "unsupported_media_type")),
    ("curl-d-form-urlencoded-label", raw(b"Host: node", b"Content-Type: application/x-www-form-urlencoded"),
     {}, (200, "")),
    ("form-urlencoded-label-from-another-origin",
     raw(b"Host: node", b"Origin: https://evil.example", b"Content-Type: application/x-www-form-urlencoded"),
     {}, (403, "cross_origin")),
    ("multipart-on-a-json-route", raw(b"Host: node", b"Content-Type: multipart/form-data; boundary=x"), {},
     (415, "unsupported_media_type")),
    ("multipart-on-an-upload-route-is-taken",
     raw(b"Host: node", b"Content-Type: multipart/form-data; boundary=x", path=b"/v1/audio/transcriptions"),
     {}, (404, "not_found")),  # past admission: this test API declares no upload route
    ("rebound-host-name", raw(b"Host: rebound.evil.example", JSON), {}, (421, "unknown_host")),
    ("rebound-host-name-same-origin-page",
     raw(b"Host: rebound.evil.example:8080", b"Origin: http://rebound.evil.example:8080", JSON), {},
     (421, "unknown_host")),
    ("rebound-host-get", raw(b"Host: rebound.evil.example", path=b"/v1/models", method=b"GET", body=None), {},
     (421, "unknown_host")),
    ("health-keyless-shows-details-so-host-checked",
     raw(b"Host: rebound.evil.example", path=b"/health", method=b"GET", body=None), {},
     (421, "unknown_host")),
    ("keyed-request-is-not-a-drive-by",
     raw(b"Host: rebound.evil.example", b"Origin: https://evil.example", AUTH, TEXT), {"keys": (KEY,)},
     (200, "")),
    ("keyed-node-without-the-key", raw(b"Host: node", b"Origin: https://evil.example", TEXT),
     {"keys": (KEY,)}, (401, "unauthorized")),
    ("host-not-a-name", raw(b"Host: \xff", JSON), {}, (400, "bad_request")),
    ("host-not-a-name-on-a-get", raw(b"Host: \xff", path=b"/health", method=b"GET", body=None), {},
     (400, "bad_request")),
    ("host-not-a-name-with-a-key", raw(b"Host: \xff", AUTH, JSON), {"keys": (KEY,)}, (400, "bad_request")),
    ("path-escape-not-utf8", raw(b"Host: node", JSON, path=CHAT + b"%ff"), {}, (400, "bad_request")),
    ("path-escape-not-utf8-on-a-get", raw(b"Host: node", path=b"/ui/%ff", method=b"GET", body=None), {},
     (400, "bad_request")),
]


@pytest.mark.parametrize("request_bytes,options,expected", [row[1:] for row in ROWS],
                         ids=[row[0] for row in ROWS])
def test_both_edges_refuse_what_a_web_page_could_send_and_serve_the_rest_alike(
        request_bytes: bytes, options: dict[str, Any], expected: tuple[int, str]) -> None:
    lean = edges(**options).answer(request_bytes, "lean")
    web = edges(**options).answer(request_bytes, "twisted")
    assert lean == web == expected


def test_an_edge_built_without_the_node_rules_applies_none() -> None:
    """A bare edge (tests, tools) keeps the plain head and auth rules; the node's edge adds these."""
    plain = Edges(keys=())
    assert plain.answer(raw(b"Host: rebound.evil.example", JSON)) == (200, "")
