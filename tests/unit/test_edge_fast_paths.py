"""The edge's fast paths against the general ones they skip, on the same random inputs.

- :class:`~routerd.api.lean_reply.LeanReply` renders its answer head itself: byte for byte what
  :func:`~routerd.api.access.answer_head` writes for the same status, headers, length, close and
  content type; its headers replace a name set again in any case, as a case-insensitive lookup does;
- :func:`~routerd.api.access.log_access` checks the four values a client chose in one pass: the
  event and its line are those of escaping each value with :func:`~routerd.api.access.printable`.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.testing import StringTransport
from twisted.logger import capturedLogs

from routerd.api.access import answer_head, log_access, printable
from routerd.api.head import build_head
from routerd.api.lean_reply import LeanReply
from routerd.logs import ACCESS_FORMAT, message

NAMES = st.sampled_from([b"content-type", b"Content-Type", b"x-routerd-node", b"X-Routerd-Node",
                         b"x-routerd-request-id", b"allow", b"Cache-Control", b"x-a", b"X-A"])
VALUES = st.binary(max_size=12)
STATUSES = st.sampled_from([200, 201, 204, 400, 404, 429, 503, 299, 599])


class _Server:
    def seconds(self) -> float:
        return 1_780_000_000.0

    def date(self, now: float) -> bytes:
        return b"Sun, 30 May 2026 00:00:00 GMT"

    def give_back(self, size: int, holder: str = "") -> None:
        pass


class _Channel:
    def __init__(self) -> None:
        self.transport = StringTransport()
        self.server = _Server()

    def answered(self, reply: LeanReply) -> None:
        pass


def _reply(close: bool) -> LeanReply:
    fields = [(b"Host", b"n")] + ([(b"Connection", b"close")] if close else [])
    head = build_head(b"POST", b"/v1/chat/completions", b"HTTP/1.1", fields)
    return LeanReply(_Channel(), head, "127.0.0.1", "openai", b"", 0.0)  # type: ignore[arg-type]


def _expected_headers(sets: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """What a case-insensitive header map keeps: the first position of a name, its last spelling
    and value (CR and LF made spaces)."""
    out: list[tuple[bytes, bytes]] = []
    for name, value in sets:
        value = value.replace(b"\r", b" ").replace(b"\n", b" ")
        for index, (known, _) in enumerate(out):
            if known.lower() == name.lower():
                out[index] = (name, value)
                break
        else:
            out.append((name, value))
    return out


@settings(max_examples=300, deadline=None)
@given(sets=st.lists(st.tuples(NAMES, VALUES), max_size=8), status=STATUSES,
       length=st.none() | st.integers(0, 10**9), close=st.booleans())
def test_the_lean_head_is_answer_head_byte_for_byte(sets: list[tuple[bytes, bytes]], status: int,
                                                   length: int | None, close: bool) -> None:
    reply = _reply(close)
    reply.set_status(status)
    for name, value in sets:
        reply.set_header(name, value)
    expected = _expected_headers(sets)
    assert reply.headers == [part for pair in expected for part in pair]
    typed = any(name.lower() == b"content-type" for name, _ in expected)
    now = 1_780_000_000.0
    assert reply._head_bytes(length, now) == answer_head(status, expected, length, close,
                                                         _Server().date(now), typed)


TEXT = st.text(st.characters(codec="utf-8"), max_size=10) | st.sampled_from(["chat-small", "/v1/x", "-"])


@settings(max_examples=300, deadline=None)
@given(method=TEXT, path=TEXT, model=TEXT, client=TEXT, status=STATUSES)
def test_the_access_line_escapes_as_printable_does_field_by_field(method: str, path: str, model: str,
                                                                  client: str, status: int) -> None:
    with capturedLogs() as events:
        log_access(method=method, path=path, status=status, bytes=3, ms=4, model=model, node="n",
                   lent_to="-", request_id="r", client=client)
    [event] = events
    expected: dict[str, Any] = {"method": printable(method), "path": printable(path), "status": status,
                                "bytes": 3, "ms": 4, "model": printable(model), "node": "n", "lent_to": "-",
                                "request_id": "r", "client": printable(client)}
    assert {key: event[key] for key in expected} == expected
    assert message(event) == ACCESS_FORMAT.format(**expected)
