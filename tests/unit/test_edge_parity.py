"""Path parity (issue 20): the same bytes through the lean channel and through twisted.web's channel
get the same status and error code, and the one the rules call for.  Every row of the issue's table
that a head decides is here."""

from __future__ import annotations

from typing import Any

import pytest

from routerd.config.schema import ServerConfig
from tests.unit.edge_support import ADMIN, KEY, NATIVE_API_PATHS, Edges, request

AUTH = b"Authorization: Bearer " + KEY.encode()
WRONG = b"Authorization: Bearer not-the-key-000"
HOST = b"Host: node"
NATIVE = [path.encode() for path in NATIVE_API_PATHS]

#: (id, raw request, peer, Edges options, expected (status, code))
ROWS: list[tuple[str, bytes, str, dict[str, Any], tuple[int, str]]] = [
    ("served", request(), "127.0.0.1", {}, (200, "")),
    ("no-key", request(fields=(HOST,)), "127.0.0.1", {}, (401, "unauthorized")),
    ("admin-key-opens-inference", request(fields=(HOST, b"Authorization: Bearer " + ADMIN.encode())),
     "127.0.0.1", {}, (200, "")),
    ("authorization-twice-valid-then-wrong", request(fields=(HOST, AUTH, WRONG)), "127.0.0.1", {},
     (400, "bad_request")),
    ("authorization-twice-wrong-then-valid", request(fields=(HOST, WRONG, AUTH)), "127.0.0.1", {},
     (400, "bad_request")),
    ("outside-allowed-cidrs", request(), "192.0.2.7", {}, (403, "forbidden")),
    ("forwarded-from-trusted-proxy-allowed", request(fields=(HOST, AUTH, b"X-Forwarded-For: 10.1.2.3")),
     "127.0.0.2", {}, (200, "")),
    ("forwarded-lines-join-last-untrusted-entry-is-the-client",
     request(fields=(HOST, AUTH, b"X-Forwarded-For: 10.1.2.3", b"X-Forwarded-For: 203.0.113.9")),
     "127.0.0.2", {}, (403, "forbidden")),
    ("forwarded-from-untrusted-peer-ignored", request(fields=(HOST, AUTH, b"X-Forwarded-For: 10.1.2.3")),
     "192.0.2.7", {}, (403, "forbidden")),
    ("http11-without-host", request(fields=(AUTH,)), "127.0.0.1", {}, (400, "bad_request")),
    ("two-host-lines", request(fields=(HOST, b"Host: other", AUTH)), "127.0.0.1", {}, (400, "bad_request")),
    ("content-type-twice", request(fields=(HOST, AUTH, b"Content-Type: text/plain")), "127.0.0.1", {},
     (400, "bad_request")),
    ("content-length-5000-digits",
     b"POST /v1/chat/completions HTTP/1.1\r\nHost: n\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n",
     "127.0.0.1", {}, (400, "bad_request")),
    ("content-length-and-transfer-encoding",
     b"POST /v1/chat/completions HTTP/1.1\r\nHost: n\r\nContent-Length: 3\r\nTransfer-Encoding: chunked"
     b"\r\n\r\n", "127.0.0.1", {}, (400, "bad_request")),
    ("transfer-coding-not-chunked",
     b"POST /v1/chat/completions HTTP/1.1\r\nHost: n\r\nTransfer-Encoding: gzip\r\n\r\n", "127.0.0.1", {},
     (501, "not_implemented")),
    ("control-byte-in-target", request(path=b"/v1/chat/completions\x01x"), "127.0.0.1", {},
     (400, "bad_request")),
    ("del-in-target", request(path=b"/v1/chat\x7fcompletions"), "127.0.0.1", {}, (400, "bad_request")),
    ("byte-over-0x80-in-target", request(path=b"/v1/chat/completions\xc3\xa9"), "127.0.0.1", {},
     (400, "bad_request")),
    ("bare-cr-in-target", request(path=b"/router/v1/node/inference/v1\rx"), "127.0.0.1", {},
     (400, "bad_request")),
    ("absolute-form-target", request(path=b"http://node/v1/chat/completions"), "127.0.0.1", {},
     (400, "bad_request")),
    ("field-name-not-a-token", request(fields=(HOST, AUTH, b"Bad Header: x")), "127.0.0.1", {},
     (400, "bad_request")),
    ("obs-fold-continuation-line", request(fields=(HOST, AUTH, b"X-Note: a", b" folded")), "127.0.0.1", {},
     (400, "bad_request")),
    ("field-line-without-a-colon", request(fields=(HOST, AUTH, b"Accept")), "127.0.0.1", {},
     (400, "bad_request")),
    ("control-byte-in-a-field-value", request(fields=(HOST, AUTH, b"X-Note: a\x01b")), "127.0.0.1", {},
     (400, "bad_request")),
    ("101-header-fields", request(fields=(HOST, AUTH, *(b"X-F%d: v" % i for i in range(99)))),
     "127.0.0.1", {}, (431, "request_header_fields_too_large")),
    ("4000-header-lines", request(fields=(HOST, AUTH, *(b"X-F%d: v" % i for i in range(4000)))),
     "127.0.0.1", {}, (431, "request_header_fields_too_large")),
    ("http-2-version", request(version=b"HTTP/2.0"), "127.0.0.1", {}, (505, "http_version_not_supported")),
    ("body-over-the-limit", request(body=b"x" * 2000), "127.0.0.1", {}, (413, "request_too_large")),
    ("body-over-the-replay-budget", request(body=b"x" * 900), "127.0.0.1", {"buffer": 512},
     (503, "buffer_full")),
    ("no-key-and-body-over-the-limit-is-401-first", request(fields=(HOST,), body=b"x" * 2000), "127.0.0.1",
     {}, (401, "unauthorized")),
    ("draining", request(), "127.0.0.1", {"phase": "draining"}, (503, "draining")),
    ("borrowed-while-draining", request(fields=(HOST, AUTH, b"X-Routerd-Offload: 1")), "127.0.0.1",
     {"phase": "draining"}, (409, "offload_returned")),
    ("cluster-path-needs-the-cluster-token", request(path=b"/router/v1/node/inference/v1/chat/completions"),
     "127.0.0.1", {}, (401, "unauthorized")),
    # the native APIs' routes: served, refused and limited by the same head rules as chat on both edges
    *[(f"served-{p.decode().strip('/').replace('/', '-')}", request(path=p), "127.0.0.1", {}, (200, ""))
      for p in NATIVE],
    *[(f"no-key-{p.decode().strip('/').replace('/', '-')}", request(path=p, fields=(HOST,)), "127.0.0.1", {},
       (401, "unauthorized")) for p in NATIVE],
    *[(f"body-over-the-limit-{p.decode().strip('/').replace('/', '-')}", request(path=p, body=b"x" * 2000),
       "127.0.0.1", {}, (413, "request_too_large")) for p in NATIVE],
    ("cluster-path-of-messages-needs-the-cluster-token",
     request(path=b"/router/v1/node/inference/v1/messages"), "127.0.0.1", {}, (401, "unauthorized")),
]


@pytest.mark.parametrize("raw,peer,options,expected", [row[1:] for row in ROWS], ids=[row[0] for row in ROWS])
def test_both_edges_give_the_same_status_and_code_and_the_one_the_rules_call_for(
        raw: bytes, peer: str, options: dict[str, Any], expected: tuple[int, str]) -> None:
    lean = Edges(**options).answer(raw, "lean", peer)
    web = Edges(**options).answer(raw, "twisted", peer)
    assert lean == web == expected


@pytest.mark.parametrize("raw,peer,options,expected", [row[1:] for row in ROWS if row[4][0] >= 400],
                         ids=[row[0] for row in ROWS if row[4][0] >= 400])
def test_a_refusal_before_the_body_closes_the_connection_on_both_edges(
        raw: bytes, peer: str, options: dict[str, Any], expected: tuple[int, str]) -> None:
    for edge in ("lean", "twisted"):
        edges = Edges(**options)
        protocol, transport = edges.connect(edge, peer)
        protocol.dataReceived(raw)
        assert b"connection: close" in transport.value().lower(), edge
        assert transport.disconnecting, edge
        assert not edges.api.served, edge
        assert edges.site.buffer is None or edges.site.buffer.used == 0, edge


def test_a_refused_request_keeps_nothing_of_the_body_that_follows_on_either_edge() -> None:
    """Issue 20 row 2: 8 MB bodies from outside allowed_cidrs are never buffered."""
    head = request(body=None)[:-2] + b"Content-Type: application/json\r\nContent-Length: 8000000\r\n\r\n"
    for edge in ("lean", "twisted"):
        edges = Edges(limit=16_000_000, buffer=16_000_000)
        protocol, transport = edges.connect(edge, "192.0.2.7")
        protocol.dataReceived(head)
        for _ in range(20):
            protocol.dataReceived(b"x" * 65536)
        assert transport.value().startswith(b"HTTP/1.1 403 ")
        assert edges.site.buffer is not None and edges.site.buffer.used == 0
        if edge == "lean":
            assert protocol._inner is None and protocol._have == 0  # answered by the lean edge itself
        else:
            assert protocol.refused and getattr(protocol.requests[-1], "content", None) is None


def test_cors_preflight_and_answers_carry_the_same_headers_on_both_edges() -> None:
    preflight = (b"OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: n\r\nOrigin: http://ui.example\r\n"
                 b"Access-Control-Request-Method: POST\r\n\r\n")
    for edge in ("lean", "twisted"):
        edges = Edges(cors=("http://ui.example",))
        protocol, transport = edges.connect(edge)
        protocol.dataReceived(preflight)
        out = transport.value()
        assert out.startswith(b"HTTP/1.1 204 "), edge
        assert b"Access-Control-Allow-Origin: http://ui.example" in out, edge
        other = Edges(cors=("http://ui.example",))
        assert other.answer(preflight.replace(b"ui.example", b"evil.example"), edge) == (403, "forbidden")


def test_the_server_limits_default_to_documented_values() -> None:
    limits = ServerConfig()
    assert (limits.head_timeout, limits.body_timeout, limits.send_timeout, limits.max_connections) == \
        (30.0, 60.0, 60.0, 4096)
