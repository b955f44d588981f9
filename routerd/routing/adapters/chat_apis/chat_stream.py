"""The reader of a streamed chat completions answer, in the pieces a translated stream is made of.

:class:`ChatStream` takes the backend's SSE bytes split anywhere and gives, per chunk, what happened in
the answer: text added (:class:`Text`), a tool call begun (:class:`ToolStart`) or its arguments grown
(:class:`ToolArguments`), the answer finished (:class:`Finished`, with its ``finish_reason`` and, when
the backend names it, the stop string matched), or the backend failing (:class:`Failed`).  The usage
(``stream_options.include_usage``'s last chunk) is kept in :attr:`ChatStream.usage`.
:class:`TranslatedStream` is the relay's converter over it: what each piece becomes is its subclass's.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import attrs

from routerd.jsonvalues import json_int
from routerd.routing.adapters.ollama._common import _first_choice
from routerd.routing.adapters.ollama.responses import error_message_from_body
from routerd.routing.sse import Event, EventParser


@attrs.frozen
class Text:
    text: str


@attrs.frozen
class ToolStart:
    index: int
    id: str
    name: str


@attrs.frozen
class ToolArguments:
    index: int
    delta: str


@attrs.frozen
class Finished:
    reason: str
    #: The stop string the backend says it stopped at (vLLM's ``stop_reason``), if it says.
    matched: str | None = None


@attrs.frozen
class Failed:
    message: str


Piece = Text | ToolStart | ToolArguments | Finished | Failed


def matched_stop(choice: Mapping[str, Any]) -> str | None:
    """The stop string a choice says it stopped at: vLLM's ``stop_reason`` when it is a string."""
    value = choice.get("stop_reason")
    return value if isinstance(value, str) and value else None


class ChatStream:
    """Incremental: :meth:`feed` takes bytes, :meth:`end` is told the body ended; each returns pieces.
    :attr:`done` is set at ``data: [DONE]`` (the answer, its usage included, is complete)."""

    def __init__(self) -> None:
        self._events = EventParser()
        self._tools: dict[int, str] = {}  # a tool call's index -> its id
        self.usage: Mapping[str, Any] | None = None
        self.done = False
        #: Chunks that added text or arguments: a backend streaming one token a chunk (llama.cpp's
        #: servers, KoboldCpp) wrote about as many tokens.
        self.deltas = 0

    def feed(self, chunk: bytes) -> list[Piece]:
        pieces: list[Piece] = []
        for event in self._events.feed(chunk):
            pieces += self._event(event)
        return pieces

    def end(self) -> list[Piece]:
        last = self._events.end()
        return self._event(last) if last is not None else []

    def _event(self, event: Event) -> list[Piece]:
        if self.done:
            return []
        if event.name == "error":
            return [Failed(error_message_from_body(500, event.data.encode("utf-8")))]
        if event.data.strip() == "[DONE]":
            self.done = True
            return []
        try:
            payload = json.loads(event.data)
        except ValueError:
            return []
        if not isinstance(payload, Mapping):
            return []
        if payload.get("error"):
            return [Failed(error_message_from_body(500, event.data.encode("utf-8")))]
        if isinstance(payload.get("usage"), Mapping):
            self.usage = payload["usage"]
        return self._choice(_first_choice(payload))

    def reported_usage(self) -> Mapping[str, Any]:
        """The stream's ``usage``; when the backend sent none (KoboldCpp v1.76 ignores
        ``stream_options``), its output estimated as one token a delta chunk, its prompt unknown (0)."""
        if self.usage is not None:
            return self.usage
        return {"prompt_tokens": 0, "completion_tokens": self.deltas}

    def _choice(self, choice: Mapping[str, Any]) -> list[Piece]:
        pieces: list[Piece] = []
        delta = choice.get("delta")
        if isinstance(delta, Mapping):
            content = delta.get("content")
            if isinstance(content, str) and content:
                pieces.append(Text(content))
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                for n, call in enumerate(calls):
                    if isinstance(call, Mapping):
                        pieces += self._tool(n, call)
        if any(isinstance(piece, Text | ToolArguments) for piece in pieces):
            self.deltas += 1
        finish = choice.get("finish_reason")
        if isinstance(finish, str) and finish:
            pieces.append(Finished(finish, matched_stop(choice)))
        return pieces

    def _tool(self, n: int, call: Mapping[str, Any]) -> list[Piece]:
        index = json_int(call.get("index"))
        index = n if index is None else index
        function = call.get("function")
        function = function if isinstance(function, Mapping) else {}
        pieces: list[Piece] = []
        if index not in self._tools:
            given = call.get("id")
            self._tools[index] = given if isinstance(given, str) and given else f"call_{index}"
            name = function.get("name")
            pieces.append(ToolStart(index, self._tools[index], name if isinstance(name, str) else ""))
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            pieces.append(ToolArguments(index, arguments))
        return pieces


class TranslatedStream(ABC):
    """A streamed chat answer converted as it arrives, with the relay's ``feed``/``flush``: the stream ends
    at ``data: [DONE]`` (:meth:`_end`), at a backend error (:meth:`_fail`), or at the end of the body
    (:meth:`_end` when the answer finished, else :meth:`_fail`).  A subclass's :meth:`_end` and :meth:`_fail`
    set ``_ended``."""

    def __init__(self) -> None:
        self._chat = ChatStream()
        self._ended = False
        self._finish: Finished | None = None

    def feed(self, chunk: bytes) -> bytes:
        if self._ended:
            return b""
        out = self._pieces(self._chat.feed(chunk))
        if self._chat.done and not self._ended:
            out += self._end()
        return out

    def flush(self) -> bytes:
        if self._ended:
            return b""
        out = self._pieces(self._chat.end())
        if self._ended:
            return out
        if self._finish is None:
            return out + self._fail("the backend's stream ended before the answer was complete")
        return out + self._end()

    def _pieces(self, pieces: list[Piece]) -> bytes:
        out = bytearray()
        for piece in pieces:
            if self._ended:
                break
            if isinstance(piece, Failed):
                out += self._fail(piece.message)
            elif isinstance(piece, Finished):
                self._finish = piece
            else:
                out += self._start() + self._piece(piece)
        return bytes(out)

    @abstractmethod
    def _start(self) -> bytes:
        """The stream's first events (once; nothing after)."""

    @abstractmethod
    def _piece(self, piece: Text | ToolStart | ToolArguments) -> bytes:
        """The events of one piece of the answer."""

    @abstractmethod
    def _end(self) -> bytes:
        """The last events of a finished answer."""

    @abstractmethod
    def _fail(self, message: str) -> bytes:
        """The event ending a failed stream."""
