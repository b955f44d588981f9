"""The SSE parser against the line-by-line parser it replaced: for any body cut anywhere, the same
events, the same bytes held between chunks, and the same event at the end."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from routerd.routing.sse import Event, EventParser


class LineByLine:
    """The parser as it was: one ``find`` and one ``line`` per line, a dispatch per blank line."""

    def __init__(self) -> None:
        self._data: list[bytes] = []
        self._size = 0
        self._name = ""
        self._buf = bytearray()

    @property
    def pending_bytes(self) -> int:
        return self._size + len(self._buf)

    def line(self, line: bytes) -> Event | None:
        if not line:
            return self._dispatch()
        if line.startswith(b":"):
            return None
        name, sep, value = line.partition(b":")
        if sep and value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            self._data.append(value)
            self._size += len(value)
        elif name == b"event":
            self._name = value.decode("utf-8", "replace")
        elif name == b"error":
            self._name = "error"
            self._data.append(value)
            self._size += len(value)
        return None

    def feed(self, chunk: bytes) -> list[Event]:
        self._buf += chunk
        events: list[Event] = []
        pos = 0
        while True:
            nl = self._buf.find(b"\n", pos)
            if nl < 0:
                break
            line = bytes(self._buf[pos:nl])
            pos = nl + 1
            event = self.line(line[:-1] if line.endswith(b"\r") else line)
            if event is not None:
                events.append(event)
        del self._buf[:pos]
        return events

    def end(self) -> Event | None:
        if self._buf:
            line = bytes(self._buf).rstrip(b"\r")
            self._buf.clear()
            self.line(line)
        return self._dispatch()

    def _dispatch(self) -> Event | None:
        if not self._data:
            self._name = ""
            return None
        event = Event(self._name, b"\n".join(self._data).decode("utf-8", "replace"))
        self._data = []
        self._size = 0
        self._name = ""
        return event


LINES = st.one_of(
    st.sampled_from([b"", b"data: x", b"data:y", b"data", b"data: ", b"event: done", b"event:",
                     b"error: {\"e\": 1}", b": keep-alive", b":", b"id: 7", b"retry: 10", b"data: [DONE]",
                     b'data: {"usage": {"prompt_tokens": 1}}', b"data: \xff\xfe", b"\r", b"data: a\rb"]),
    st.binary(max_size=12),
)
ENDINGS = st.sampled_from([b"\n", b"\r\n", b"\r", b"\n\n", b""])


@st.composite
def bodies(draw: st.DrawFn) -> tuple[bytes, list[int]]:
    body = b"".join(line + end for line, end in draw(st.lists(st.tuples(LINES, ENDINGS), max_size=14)))
    cuts = sorted(set(draw(st.lists(st.integers(0, max(len(body), 1)), max_size=8))))
    return body, cuts


@settings(max_examples=400, deadline=None)
@given(case=bodies())
def test_the_parser_reads_every_body_as_the_line_by_line_parser(case: tuple[bytes, list[int]]) -> None:
    body, cuts = case
    new, old = EventParser(), LineByLine()
    start = 0
    for cut in [*cuts, len(body)]:
        chunk = body[start:cut]
        start = max(start, cut)
        assert new.feed(chunk) == old.feed(chunk)
        assert new.pending_bytes == old.pending_bytes
    assert new.end() == old.end()
    for line in (b"", b"data: z", b"", b"event: e", b""):  # line by line, as the Ollama converter feeds it
        assert new.line(line) == old.line(line)
