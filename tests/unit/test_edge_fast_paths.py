"""The edge's fast paths against the general ones they skip, on the same random inputs.

- :class:`~routerd.api.lean_reply.LeanReply` keeps its headers as one flat list that
  :func:`~routerd.api.access.answer_head` renders in one format: byte for byte the head HTTP/1.1
  asks for the same status, headers, length, close and content type; its headers replace a name set
  again in any case, as a case-insensitive lookup does (found by an exact search while every name
  is lower-case, also when a value is spelled as a name), and its access line reads them so too;
- :func:`~routerd.api.head.clean_head` builds a clean head in a few calls: what
  :func:`~routerd.api.head.build_head` builds, or None (never where it refuses);
- :class:`~routerd.api.budget.BufferBudget`: the bytes and holders of its max/min formulas, as
  written out here, after any steps;
- :func:`~routerd.api.access.log_access` checks the four values a client chose in one pass: the
  event and its line are those of escaping each value with :func:`~routerd.api.access.printable`.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.testing import StringTransport
from twisted.logger import capturedLogs
from twisted.web.http import RESPONSES

from routerd.api.access import answer_head, log_access, printable
from routerd.api.budget import BufferBudget
from routerd.api.head import build_head, clean_head, head_of_lines
from routerd.api.lean_reply import LeanReply
from routerd.errors import HTTPError
from routerd.logs import ACCESS_FORMAT, message
from tests.unit.test_api_channel import Served, post

NAMES = st.sampled_from([b"content-type", b"Content-Type", b"x-routerd-node", b"X-Routerd-Node",
                         b"x-routerd-request-id", b"allow", b"Cache-Control", b"x-a", b"X-A"])
#: values too spelled as names
VALUES = st.binary(max_size=12) | st.sampled_from([b"content-type", b"x-a", b"allow"])
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

    def answered(self, reply: LeanReply, now: float | None = None) -> None:
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
def test_the_lean_answer_head_is_rendered_byte_for_byte(sets: list[tuple[bytes, bytes]], status: int,
                                                        length: int | None, close: bool) -> None:
    reply = _reply(close)
    reply.set_status(status)
    for name, value in sets:
        reply.set_header(name, value)
    expected = _expected_headers(sets)
    assert reply.headers == [part for pair in expected for part in pair]
    typed = any(name.lower() == b"content-type" for name, _ in expected)
    now = 1_780_000_000.0
    want = b"HTTP/1.1 %d %s\r\n" % (status, RESPONSES.get(status, b"Unknown"))
    want += b"".join(name + b": " + value + b"\r\n" for name, value in expected)
    want += b"" if typed else b"content-type: application/json\r\n"
    want += b"transfer-encoding: chunked\r\n" if length is None else b"content-length: %d\r\n" % length
    want += b"connection: close\r\n" if close else b""
    want += b"date: " + _Server().date(now) + b"\r\n\r\n"
    assert reply._head_bytes(length, now) == want
    assert answer_head(status, reply.headers, length, close, _Server().date(now), typed) == want


LOGGED_NAMES = st.sampled_from([b"x-routerd-node", b"X-Routerd-Node", b"x-routerd-lent-to",
                                 b"X-ROUTERD-LENT-TO", b"x-routerd-request-id", b"content-type", b"X-A"])


@settings(max_examples=200, deadline=None)
@given(sets=st.lists(st.tuples(LOGGED_NAMES, VALUES), max_size=6))
def test_the_access_line_reads_the_answer_headers_in_any_case(sets: list[tuple[bytes, bytes]]) -> None:
    """The access line's node, lent_to and request_id are the last values set under those names,
    whatever their case (names read as they are while all were set lower-case, else lowered)."""
    reply = _reply(False)
    reply.name_model("m")
    for name, value in sets:
        reply.set_header(name, value)
    latest = {name.lower(): value for name, value in _expected_headers(sets)}
    with capturedLogs() as events:
        reply.finish(b"{}")
    [event] = [event for event in events if event.get("log_namespace") == "routerd.access"]
    for name, field in ((b"x-routerd-node", "node"), (b"x-routerd-lent-to", "lent_to"),
                        (b"x-routerd-request-id", "request_id")):
        assert event[field] == latest.get(name, b"-").decode("utf-8", "replace")


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


FIELD_NAMES = st.sampled_from([b"Host", b"host", b"Content-Length", b"Content-Type", b"Connection", b"X-A",
                               b"Transfer-Encoding", b"Authorization", b"X-Forwarded-For", b"Bad Name", b"",
                               b" Host", b"Host ", b"X\x01"])
FIELD_VALUES = st.sampled_from([b"n", b" n ", b"\tn", b"5", b" 12 ", b"0x5", b"close", b"keep-alive",
                                b"chunked", b"a, b", b"", b"  ", b"\xe9t\xe9", b"a\x00b", b"a\x7f", b"a\rb",
                                b"a\nb", b"x:y", b"12345678901234567890", b"\xb2"]) | st.binary(max_size=6)
FIELD_LINE = st.tuples(FIELD_NAMES, st.sampled_from([b":", b": ", b"", b" : "]), FIELD_VALUES).map(b"".join)
GOOD_LINE = st.tuples(st.sampled_from([b"Content-Type", b"X-A", b"x-b", b"Accept", b"Content-Length"]),
                      st.sampled_from([b":", b": ", b":\t"]),
                      st.sampled_from([b"application/json", b"5", b" 7 ", b"a, b", b"", b"\xe9", b"v:w"]),
                      ).map(b"".join)


def _same_head(a: Any, b: Any) -> bool:
    return all(getattr(a, slot) == getattr(b, slot) for slot in a.__slots__)


@settings(max_examples=1000, deadline=None)
@given(method=st.just(b"POST") | st.sampled_from([b"POST", b"GET", b"PUT", b"P\x01ST", b"BREW"]),
       target=st.just(b"/v1/chat/completions")
       | st.sampled_from([b"/v1/chat/completions", b"/v1/x?model=a", b"/a b", b"*", b"/\x80", b"/%41"]),
       version=st.just(b"HTTP/1.1") | st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/x"]),
       host=st.sampled_from([[b"Host: n"], [b"host:n "], []]),
       lines=st.lists(GOOD_LINE | GOOD_LINE | FIELD_LINE, max_size=4, unique=True),
       padding=st.sampled_from([0, 0, 9000]))
def test_a_clean_head_is_what_build_head_builds(method: bytes, target: bytes, version: bytes,
                                               host: list[bytes], lines: list[bytes], padding: int) -> None:
    """clean_head gives build_head's head or None (never another head, never where build_head
    refuses), on heads clean and not (case, whitespace, control bytes, repeats, missing colons,
    bad lengths, long heads)."""
    lines = host + lines
    if padding:
        lines = [*lines, b"X-Pad: " + b"p" * padding]
    block = b"\r\n".join([method + b" " + target + b" " + version, *lines])
    field_lines = b"".join(line + b"\r\n" for line in lines)
    for _ in range(2):  # the second time with the names build_head has checked
        try:
            general = head_of_lines(method, target, version, lines)
        except HTTPError:
            general = None
        fast = clean_head(method, target, version, len(block), field_lines)
        assert fast is None or (general is not None and _same_head(fast, general))


def test_a_clean_head_is_taken_once_its_names_are_known() -> None:
    lines = [b"Host: n", b"Content-Length: 2", b"Content-Type: application/json"]
    head_of_lines(b"POST", b"/v1/chat/completions", b"HTTP/1.1", lines)
    fast = clean_head(b"POST", b"/v1/chat/completions", b"HTTP/1.1", 80,
                      b"".join(line + b"\r\n" for line in lines))
    assert fast is not None and fast.length == 2 and fast.fields["content-type"] == "application/json"


def test_an_empty_query_is_served_by_the_lean_channel_at_its_path() -> None:
    """``/v1/chat/completions?`` is the lean route's path with an empty query: served by the lean
    channel (the route looked up without the ``?``), as ``?x=1`` is."""
    for target in (b"/v1/chat/completions?", b"/v1/chat/completions?x=1", b"/v1/chat/completions"):
        served = Served()
        served.send(post(b'{"model":"m"}', target))
        assert served.channel._inner is None and served.api.calls[0][0] == "/v1/chat/completions", target


class _ReferenceBudget:
    """BufferBudget's rules as max/min formulas (what its comparisons must keep)."""

    def __init__(self, limit: int, share: float, floor: int) -> None:
        self.limit, self.used, self.share, self.floor = limit, 0, share, floor
        self.held: dict[str, tuple[int, int]] = {}

    def free_for(self, holder: str) -> int:
        free = max(0, self.limit - self.used)
        if not holder:
            return free
        cap = max(int(self.limit * self.share), self.floor)
        return max(0, min(free, cap - self.held.get(holder, (0, 0))[0]))

    def take(self, size: int, holder: str, arriving: bool) -> bool:
        if self.used + size > self.limit:
            return False
        self.used += size
        if holder:
            held, count = self.held.get(holder, (0, 0))
            self.held[holder] = (held + size, count + 1 if arriving else count)
        return True

    def arrived(self, holder: str) -> None:
        if holder in self.held:
            held, arriving = self.held[holder]
            self.held[holder] = (held, max(0, arriving - 1))

    def give(self, size: int, holder: str, arriving: bool) -> None:
        self.used = max(0, self.used - size)
        if holder and holder in self.held:
            held, count = self.held[holder]
            held, count = held - size, count - 1 if arriving else count
            if held <= 0 and count <= 0:
                del self.held[holder]
            else:
                self.held[holder] = (max(0, held), max(0, count))


BUDGET_STEPS = st.lists(st.tuples(st.sampled_from(["free_for", "take", "arrived", "give"]),
                                  st.sampled_from(["", "key a", "client b"]), st.integers(0, 120),
                                  st.booleans()), max_size=40)


@settings(max_examples=300, deadline=None)
@given(limit=st.integers(0, 300), share=st.sampled_from([0.0, 0.25, 0.5, 1.0]), floor=st.integers(0, 100),
       steps=BUDGET_STEPS)
def test_the_budget_keeps_its_max_min_rules(limit: int, share: float, floor: int,
                                            steps: list[tuple[str, str, int, bool]]) -> None:
    budget, reference = BufferBudget(limit, share, floor), _ReferenceBudget(limit, share, floor)
    for step, holder, size, arriving in steps:
        if step == "free_for":
            assert budget.free_for(holder) == reference.free_for(holder)
        elif step == "take":
            assert budget.take(size, holder, arriving) == reference.take(size, holder, arriving)
        elif step == "arrived":
            budget.arrived(holder)
            reference.arrived(holder)
        else:
            budget.give(size, holder, arriving)
            reference.give(size, holder, arriving)
        assert (budget.used, budget._held, budget.free) == (reference.used, reference.held,
                                                            max(0, reference.limit - reference.used))
