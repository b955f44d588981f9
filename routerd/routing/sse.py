"""Server-sent events: the one parser of SSE framing in routerd.

Used by the Ollama converter (``adapters.ollama.streaming``) and the usage reader
(``routing.work``): lines ending in LF or CRLF; ``data:`` lines of one event joined with LF;
``event:`` names it; a blank line ends it; ``:`` lines are comments.  llama-server's
``error: {...}`` line is read as an ``error`` event.  Output never depends on how the input was
split into chunks.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class Event:
    name: str  # "" for the default "message" event
    data: str


class EventParser:
    """Incremental: ``line`` takes one line (no terminator), ``feed`` takes bytes split anywhere;
    each returns the events they complete.  ``end`` completes an event the body ended inside."""

    def __init__(self) -> None:
        self._data: list[bytes] = []
        self._size = 0
        self._name = ""
        self._buf = bytearray()

    @property
    def pending_bytes(self) -> int:
        """Bytes held for the event under way (a caller may bound it)."""
        return self._size + len(self._buf)

    def line(self, line: bytes) -> Event | None:
        if not line:
            if not self._data:  # a blank line ending no event (_dispatch's first case)
                self._name = ""
                return None
            return self._dispatch()
        if line[:1] == b":":
            return None  # comment / keep-alive
        name, sep, value = line.partition(b":")
        if sep and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
            self._size += len(value)
        elif name == b"event":
            self._name = value.decode("utf-8", "replace")
        elif name == b"error":  # llama-server: "error: {json}"
            self._name = "error"
            self._data.append(value)
            self._size += len(value)
        return None

    def feed(self, chunk: bytes) -> list[Event]:
        self._buf += chunk
        events: list[Event] = []
        if b"\n" not in chunk:
            return events
        # every complete line at once; what follows the last LF waits for the next chunk
        *lines, rest = bytes(self._buf).split(b"\n")
        self._buf = bytearray(rest)
        for line in lines:
            event = self.line(line[:-1] if line[-1:] == b"\r" else line)
            if event is not None:
                events.append(event)
        return events

    def end(self) -> Event | None:
        """The event the body ended inside (a last line without terminator included), if any."""
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


def parse_events(body: bytes) -> list[Event]:
    """Every event of a whole (or tail of an) SSE body."""
    parser = EventParser()
    events = parser.feed(body)
    last = parser.end()
    return events + [last] if last is not None else events
