"""Chunked framing on twisted.web's edge (:mod:`routerd.api.chunked`): a bare LF or CR where the
trailer section needs CRLF is refused (400, connection closed), so no later request is read as
trailer fields of an earlier one; well-formed chunked bodies, trailers included, are served."""

from __future__ import annotations

import pytest

from routerd.api.chunked import StrictChunkedDecoder
from tests.unit.edge_support import KEY, Edges, status_and_code

HEAD = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: node\r\nAuthorization: Bearer " + KEY.encode()
        + b"\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
BODY = b'd\r\n{"model":"m"}\r\n'
SECOND = b"GET /health HTTP/1.1\r\nHost: node\r\n\r\n"


@pytest.mark.parametrize("end", [b"0\r\n\n", b"0\r\n\r\r\n", b"0\r\nX-T: 1\n\r\n", b"0\r\nX-T: 1\r\n\n"],
                         ids=["bare-lf-ends-the-body", "bare-cr", "bare-lf-in-a-trailer",
                              "bare-lf-after-a-trailer"])
@pytest.mark.parametrize("edge", ["lean", "twisted"])
def test_a_bare_line_end_in_the_trailer_section_is_refused_and_the_connection_closed(
        edge: str, end: bytes) -> None:
    edges = Edges()
    protocol, transport = edges.connect(edge)
    protocol.dataReceived(HEAD + BODY + end + SECOND)
    out = transport.value()
    assert status_and_code(out) == (400, "bad_request")
    assert out.count(b"HTTP/1.1 ") == 1 and transport.disconnecting
    assert not edges.api.served


@pytest.mark.parametrize("end", [b"0\r\n\r\n", b"0\r\nX-Trailer: 1\r\n\r\n"], ids=["plain", "with-a-trailer"])
@pytest.mark.parametrize("edge", ["lean", "twisted"])
def test_a_well_formed_chunked_body_is_served_and_the_next_request_too(edge: str, end: bytes) -> None:
    edges = Edges()
    protocol, transport = edges.connect(edge)
    protocol.dataReceived(HEAD + BODY + end + SECOND)
    out = transport.value()
    assert out.startswith(b"HTTP/1.1 200 ") and out.count(b"HTTP/1.1 200 ") == 2, out
    assert [facts.body for facts in edges.api.served] == [b'{"model":"m"}']


def test_the_channel_reads_a_chunked_body_with_the_strict_decoder() -> None:
    edges = Edges()
    protocol, _ = edges.connect("twisted")
    protocol.dataReceived(HEAD)
    assert type(protocol._transferDecoder) is StrictChunkedDecoder
