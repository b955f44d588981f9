"""Differential test of the lean channel's head parsing against h11 (issue 20).

For any bytes, split at any points, the lean channel either hands the whole connection to
twisted.web, refuses the request before its body, or serves exactly the request h11 parses from the
same bytes: same method, target, joined field values and body.  It never serves bytes h11 calls
malformed.  Hypothesis generates heads from a grammar that includes the bad cases (control bytes,
repeated fields, odd lengths, bare CR/LF, obs-fold, spaces before the colon); the corpus adds every
row of the issue's table.
"""

from __future__ import annotations

import h11
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.edge_support import KEY, Edges, handed_over
from tests.unit.test_edge_parity import ROWS

#: Mostly names that repeat harmlessly (list fields), some singletons and hand-over fields.
_NAMES = [b"X-Forwarded-For", b"Accept", b"X-Routerd-Model", b"User-Agent", b"X-Note", b"Accept",
          b"X-Note", b"Connection", b"Host", b"Authorization", b"Content-Type", b"Content-Length",
          b"Transfer-Encoding", b"Origin"]
_CLEAN = st.sampled_from([b"node", b"application/json", b"10.1.2.3", b"*/*", b"m", b"keep-alive", b"close",
                          b"", b" padded ", b"\tx", b"a, b", b"\xe9t\xe9"])
#: Nine in ten values are well-formed (so many requests get served), one in ten any bytes at all.
_VALUES = st.integers(0, 9).flatmap(lambda i: _CLEAN if i else st.binary(max_size=12))
_TARGETS = st.one_of(
    st.sampled_from([b"/v1/chat/completions"] * 4 + [b"/v1/chat/completions?x=1&model=a", b"/v1/embeddings",
                     b"/health", b"*", b"http://h/v1/chat/completions"]),
    st.builds(lambda tail: b"/v1/chat/completions" + tail, st.binary(max_size=6)),
)


@st.composite
def raw_requests(draw: st.DrawFn) -> bytes:
    method = draw(st.sampled_from([b"POST"] * 8 + [b"GET", b"P OST"]))
    target = draw(_TARGETS)
    version = draw(st.sampled_from([b"HTTP/1.1"] * 8 + [b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.1 "]))
    body = draw(st.binary(max_size=40))
    fields = draw(st.lists(st.tuples(st.sampled_from(_NAMES), _VALUES), max_size=6))
    lines = [method + b" " + target + b" " + version]
    if draw(st.integers(0, 9)):
        lines.append(b"Host: node")
    for name, value in fields:
        sep = draw(st.sampled_from([b": "] * 6 + [b":", b" : ", b":\t"]))
        lines.append(name + sep + value)
    length = draw(st.sampled_from([len(body), len(body), len(body), None, len(body) + 1000]))
    if length is not None:
        lines.append(b"Content-Length: %d" % length)
    if draw(st.integers(0, 9)):
        lines.insert(1, b"Authorization: Bearer " + KEY.encode())
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def h11_parse(raw: bytes) -> tuple[str, bytes, dict[str, str], bytes] | None:
    """(method, target, fields joined as RFC 9110 §5.3 says, body) of the first request, or None
    when h11 refuses the bytes or the request is incomplete."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(raw)
    try:
        event = conn.next_event()
        if not isinstance(event, h11.Request):
            return None
        fields: dict[str, str] = {}
        for name, value in event.headers:
            key = name.decode("ascii")
            text = value.decode("latin-1")
            known = fields.get(key)
            if known is None or not known:
                fields[key] = text if known is None or text else known
            elif text:
                fields[key] = f"{known}, {text}"
        body = b""
        while True:
            part = conn.next_event()
            if isinstance(part, h11.Data):
                body += bytes(part.data)
            elif isinstance(part, h11.EndOfMessage):
                return event.method.decode(), bytes(event.target), fields, body
            else:
                return None
    except h11.RemoteProtocolError:
        return None


def feed(raw: bytes, cuts: list[int]) -> tuple[Edges, object, bytes]:
    edges = Edges(limit=1 << 20, buffer=1 << 20)
    channel, transport = edges.connect()
    start = 0
    for cut in sorted(set(cuts)):
        channel.dataReceived(raw[start:cut])
        start = cut
    channel.dataReceived(raw[start:])
    return edges, channel, transport.value()


def check(raw: bytes, cuts: list[int]) -> None:
    edges, channel, out = feed(raw, cuts)
    parsed = h11_parse(raw)
    if handed_over(channel):
        return  # twisted.web's channel has the whole connection, from the first byte
    if not edges.api.served:
        # refused (answered before the body and closed), or still waiting for bytes; never served
        # something h11 would have parsed differently
        assert out == b"" or out.startswith(b"HTTP/1.1 4") or out.startswith(b"HTTP/1.1 5")
        return
    assert parsed is not None, f"served bytes h11 refuses: {raw!r}"
    method, target, fields, body = parsed
    facts = edges.api.served[0]
    assert method == "POST"
    assert target.partition(b"?")[0].decode() == facts.path
    assert {k: v for k, v in facts.headers.items()} == fields
    assert facts.body == body


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=raw_requests(), cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=5))
def test_the_lean_edge_serves_exactly_what_h11_parses_or_hands_over_or_refuses(
        raw: bytes, cuts: list[int]) -> None:
    check(raw, cuts)


def test_the_corpus_of_the_issue_table_holds_the_same_property() -> None:
    for _, raw, *_ in ROWS:
        for cuts in ([], [1], [len(raw) // 2], list(range(0, len(raw), 7))):
            check(raw, cuts)


@st.composite
def clean_requests(draw: st.DrawFn) -> bytes:
    """Well-formed requests the lean channel serves: list fields repeated, values with odd spacing,
    bytes over 0x7f in values, any body, any query."""
    body = draw(st.binary(max_size=64))
    query = draw(st.sampled_from([b"", b"?model=a", b"?x=1&x=2", b"?a=%20b"]))
    lines = [b"POST /v1/chat/completions" + query + b" HTTP/1.1", b"Host: node",
             b"Authorization: Bearer " + KEY.encode()]
    for name, value in draw(st.lists(st.tuples(st.sampled_from([b"X-Forwarded-For", b"Accept", b"X-Note",
                                                                b"User-Agent", b"x-note"]), _CLEAN),
                                     max_size=6)):
        lines.append(name + draw(st.sampled_from([b": ", b":", b":\t", b":  "])) + value)
    lines.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


@settings(max_examples=400, deadline=None)
@given(raw=clean_requests(), cuts=st.lists(st.integers(min_value=0, max_value=300), max_size=6))
def test_a_well_formed_request_split_anywhere_is_served_once_with_the_fields_h11_reads(
        raw: bytes, cuts: list[int]) -> None:
    edges, channel, _ = feed(raw, cuts)
    assert not handed_over(channel) and len(edges.api.served) == 1
    check(raw, cuts)
