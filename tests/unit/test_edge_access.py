"""One access line for both edges (issue 20): written for served and refused requests alike, with
every value a client chose escaped so a text line stays one line and the JSON log one object."""

from __future__ import annotations

import io
import json

from twisted.logger import capturedLogs

from routerd.api.access import printable
from routerd.logs import JsonLinesObserver, flat_event
from tests.unit.edge_support import Edges, request

EVIL_MODEL = 'a\x1b[31m"b\nc d'


def access_events(raw: bytes, edge: str, peer: str = "127.0.0.1") -> list[dict[str, object]]:
    with capturedLogs() as events:
        Edges().answer(raw, edge, peer)
    return [e for e in events if e.get("log_namespace") == "routerd.access"]


def test_a_model_with_control_characters_is_escaped_in_the_access_line_on_both_edges() -> None:
    body = json.dumps({"model": EVIL_MODEL}).encode()
    for edge in ("lean", "twisted"):
        [event] = access_events(request(body=body), edge)
        assert event["model"] == printable(EVIL_MODEL)
        line = flat_event(event)["msg"]
        assert isinstance(line, str)
        assert "\n" not in line and "\x1b" not in line and 'model=a\\x1b[31m\\"b\\nc\\x20d ' in line, edge
        out = io.StringIO()
        JsonLinesObserver(out)(event)
        assert out.getvalue().count("\n") == 1 and json.loads(out.getvalue())


def test_a_refused_request_is_logged_once_with_its_status_on_both_edges() -> None:
    for edge in ("lean", "twisted"):
        [event] = access_events(request(fields=(b"Host: n", b"X-Routerd-Model: m\x80x")), edge, "192.0.2.9")
        assert (event["status"], event["path"], event["client"]) == (403, "/v1/chat/completions", "192.0.2.9")
        assert event["model"] == "m\\x80x", edge


def test_printable_leaves_ordinary_values_alone() -> None:
    assert printable("chat-small") == "chat-small"
    assert printable("/v1/chat/completions") == "/v1/chat/completions"
