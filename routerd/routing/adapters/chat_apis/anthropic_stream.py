"""A streamed chat completions answer -> Anthropic's Messages stream (:class:`MessagesStream`).

``message_start`` (its usage zero: the backend reports the usage at the end), then per content block
``content_block_start``, its ``content_block_delta`` events (``text_delta`` for text, ``input_json_delta``
for a tool call's arguments) and ``content_block_stop``; at the end ``message_delta`` with the
``stop_reason`` and the whole usage (``input_tokens`` included, so a reader of the last events finds
it) and ``message_stop``.  A backend error, or a stream that ends before the answer finished, becomes
one ``error`` event and ends the stream.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from routerd.routing.adapters import JSONObject
from routerd.routing.adapters.chat_apis.anthropic import stop_reason, usage
from routerd.routing.adapters.chat_apis.chat_stream import (
    Finished,
    Text,
    ToolArguments,
    ToolStart,
    TranslatedStream,
)


def event(name: str, data: JSONObject) -> bytes:
    """One named SSE event whose data is ``{"type": name, **data}``."""
    return b"event: " + name.encode() + b"\ndata: " + json.dumps(
        {"type": name, **data}, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n\n"


class MessagesStream(TranslatedStream):
    """Incremental converter with the relay's ``feed``/``flush``; ``model`` is the client's ID."""

    def __init__(self, model: str, message_id: str, stops: Sequence[str] = ()) -> None:
        super().__init__()
        self._model = model
        self._id = message_id
        self._stops = tuple(stops)
        self._started = False
        self._blocks = 0  # blocks opened so far
        self._open: tuple[str, int] | None = None  # ("text" | tool index, block index) of the open block
        self._tool_blocks: dict[int, int] = {}  # a tool call's index -> its block's index

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        return event("message_start", {"message": {
            "id": self._id, "type": "message", "role": "assistant", "model": self._model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": usage(None)}})

    def _piece(self, piece: Text | ToolStart | ToolArguments) -> bytes:
        if isinstance(piece, Text):
            out = b""
            if self._open is None or self._open[0] != "text":
                out = self._open_block({"type": "text", "text": ""}, "text")
            return out + self._delta({"type": "text_delta", "text": piece.text})
        if isinstance(piece, ToolStart):
            out = self._open_block({"type": "tool_use", "id": piece.id, "name": piece.name, "input": {}},
                                   str(piece.index))
            self._tool_blocks[piece.index] = self._blocks - 1
            return out
        block = self._tool_blocks.get(piece.index)
        if block is None:
            return b""
        return event("content_block_delta", {"index": block, "delta": {
            "type": "input_json_delta", "partial_json": piece.delta}})

    def _open_block(self, block: JSONObject, key: str) -> bytes:
        out = self._close_block()
        self._open = (key, self._blocks)
        self._blocks += 1
        return out + event("content_block_start", {"index": self._open[1], "content_block": block})

    def _delta(self, delta: JSONObject) -> bytes:
        assert self._open is not None
        return event("content_block_delta", {"index": self._open[1], "delta": delta})

    def _close_block(self) -> bytes:
        if self._open is None:
            return b""
        index = self._open[1]
        self._open = None
        return event("content_block_stop", {"index": index})

    def _end(self) -> bytes:
        out = self._start() + self._close_block()
        self._ended = True
        finish = self._finish or Finished("stop")
        reason, sequence = stop_reason(finish.reason, finish.matched, self._stops, bool(self._tool_blocks))
        out += event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": sequence},
                                       "usage": usage(self._chat.reported_usage())})
        return out + event("message_stop", {})

    def _fail(self, message: str) -> bytes:
        self._ended = True
        return event("error", {"error": {"type": "api_error", "message": message}})
