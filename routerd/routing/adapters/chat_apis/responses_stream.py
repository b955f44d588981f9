"""A streamed chat completions answer -> the Responses API's stream (:class:`ResponsesStream`).

``response.created`` and ``response.in_progress``; the text as a ``message`` item
(``response.output_item.added``, ``response.content_part.added``, ``response.output_text.delta`` …,
``response.output_text.done``, ``response.content_part.done``, ``response.output_item.done``); each tool
call as a ``function_call`` item (``response.output_item.added``,
``response.function_call_arguments.delta`` …, ``response.function_call_arguments.done``,
``response.output_item.done``); at the end ``response.completed`` (``response.incomplete`` when the
answer was cut at its token limit) carrying the whole Response, usage included.  Every event has its
``sequence_number``.  A backend error, or a stream that ends before the answer finished, becomes
``response.failed``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from routerd.routing.adapters import JSONObject
from routerd.routing.adapters.chat_apis.chat_stream import (
    Finished,
    Text,
    ToolArguments,
    ToolStart,
    TranslatedStream,
)
from routerd.routing.adapters.chat_apis.responses import call_item, message_item, response_object, status_of


class ResponsesStream(TranslatedStream):
    """Incremental converter with the relay's ``feed``/``flush``; ``model`` is the client's ID."""

    def __init__(self, model: str, response_id: str, created: int,
                 request: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self._model = model
        self._id = response_id
        self._created = created
        self._request = request
        self._sequence = 0
        self._started = False
        self._output: list[JSONObject] = []  # the items done, in order
        self._open: JSONObject | None = None  # the item under way
        self._text: list[str] = []
        self._tool_items: dict[int, JSONObject] = {}

    def _event(self, name: str, data: JSONObject) -> bytes:
        payload = {"type": name, "sequence_number": self._sequence, **data}
        self._sequence += 1
        return b"event: " + name.encode() + b"\ndata: " + json.dumps(
            payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n\n"

    def _response(self, status: str, incomplete: JSONObject | None = None) -> JSONObject:
        return response_object(self._id, self._model, self._created, self._request, list(self._output),
                               status, incomplete, self._chat.reported_usage())

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        return (self._event("response.created", {"response": self._response("in_progress")})
                + self._event("response.in_progress", {"response": self._response("in_progress")}))

    def _piece(self, piece: Text | ToolStart | ToolArguments) -> bytes:
        if isinstance(piece, Text):
            return self._text_delta(piece.text)
        if isinstance(piece, ToolStart):
            out = self._close()
            item = call_item(f"fc_{piece.id}", piece.id, piece.name, "", "in_progress")
            self._open = self._tool_items[piece.index] = item
            return out + self._event("response.output_item.added", {"output_index": len(self._output),
                                                                    "item": item})
        growing = self._tool_items.get(piece.index)
        if growing is None:
            return b""
        growing["arguments"] += piece.delta
        return self._event("response.function_call_arguments.delta", {
            "item_id": growing["id"], "output_index": self._index_of(growing), "delta": piece.delta})

    def _index_of(self, item: JSONObject) -> int:
        return len(self._output) if item is self._open else self._output.index(item)

    def _text_delta(self, text: str) -> bytes:
        out = b""
        if self._open is None or self._open["type"] != "message":
            out += self._close()
            self._open = message_item(f"msg_{self._id.removeprefix('resp_')}_{len(self._output)}", "",
                                      "in_progress")
            self._open["content"] = []
            self._text = []
            where = {"item_id": self._open["id"], "output_index": len(self._output)}
            out += self._event("response.output_item.added", {"output_index": len(self._output),
                                                              "item": self._open})
            out += self._event("response.content_part.added", {**where, "content_index": 0, "part": {
                "type": "output_text", "text": "", "annotations": [], "logprobs": []}})
        assert self._open is not None
        self._text.append(text)
        return out + self._event("response.output_text.delta", {
            "item_id": self._open["id"], "output_index": len(self._output), "content_index": 0,
            "delta": text, "logprobs": []})

    def _close(self) -> bytes:
        item = self._open
        if item is None:
            return b""
        self._open = None
        index = len(self._output)
        out = b""
        if item["type"] == "message":
            done = message_item(item["id"], "".join(self._text))
            part = done["content"][0]
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            out += self._event("response.output_text.done", {**where, "text": part["text"], "logprobs": []})
            out += self._event("response.content_part.done", {**where, "part": part})
        else:
            done = {**item, "status": "completed"}
            self._tool_items = {k: (done if v is item else v) for k, v in self._tool_items.items()}
            out += self._event("response.function_call_arguments.done", {
                "item_id": item["id"], "output_index": index, "name": item["name"],
                "arguments": item["arguments"]})
        self._output.append(done)
        return out + self._event("response.output_item.done", {"output_index": index, "item": done})

    def _end(self) -> bytes:
        out = self._start() + self._close()
        self._ended = True
        status, incomplete = status_of((self._finish or Finished("stop")).reason)
        name = "response.completed" if status == "completed" else "response.incomplete"
        return out + self._event(name, {"response": self._response(status, incomplete)})

    def _fail(self, message: str) -> bytes:
        out = self._start()
        self._ended = True
        failed = self._response("failed")
        failed["error"] = {"code": "server_error", "message": message}
        return out + self._event("response.failed", {"response": failed})
