"""The one answer to a request whose upstream failed (``routerd.inference.ending``): once the answer
has started (a stream), the failure is the stream's last event in the client's API's shape and the
answer then ends as usual (never an aborted connection, which a client reads as a lost request);
before anything was written, a 502 with the error envelope."""

from __future__ import annotations

import json

import pytest
from twisted.internet.error import ConnectionLost
from twisted.python.failure import Failure
from twisted.web.client import ResponseFailed

from routerd.inference.ending import Handling, answer_outcome
from routerd.routing.classify import classify
from routerd.routing.relay import StreamBroken
from routerd.routing.sse import parse_events
from tests.support import FakeReply


def _answer(path: str, reply: FakeReply, exc: Exception) -> bytes:
    route = classify("POST", path)
    assert route is not None
    handling = Handling(reply, route, "r1", False, None)  # type: ignore[arg-type]  # no gauge read here
    outcome = answer_outcome(handling, Failure(exc))
    assert isinstance(outcome, bytes)
    return outcome


def _started() -> FakeReply:
    reply = FakeReply()
    reply.write(b'data: {"choices": [{"delta": {"content": "Once"}}]}\n\n')
    return reply


BROKEN = [StreamBroken("Connection to the other side was lost"),
          ResponseFailed([Failure(ConnectionLost("reset"))])]


@pytest.mark.parametrize("exc", BROKEN, ids=["broke-off", "connection-lost"])
def test_a_stream_cut_after_it_started_ends_with_an_sse_error_event_not_an_abort(exc: Exception) -> None:
    reply = _started()
    last = _answer("/v1/chat/completions", reply, exc)
    assert not reply.aborted and reply.status == 200
    stream = b"".join(reply.written) + last
    events = parse_events(stream)
    assert [e.name for e in events] == ["", "error"]  # the chunk sent stays whole, then the error
    error = json.loads(events[-1].data)["error"]
    assert error["code"] == "backend_error" and error["type"] == "backend_error" and error["message"]


def test_an_ollama_stream_cut_after_it_started_ends_with_an_ndjson_error_line() -> None:
    reply = FakeReply()
    reply.write(b'{"message": {"role": "assistant", "content": "Once"}, "done": false}\n')
    last = _answer("/api/chat", reply, StreamBroken("Connection lost"))
    assert not reply.aborted
    lines = [json.loads(line) for line in (b"".join(reply.written) + last).splitlines()]
    assert len(lines) == 2 and set(lines[1]) == {"error"} and "broke off" in lines[1]["error"]


def test_an_anthropic_stream_cut_after_it_started_ends_with_its_error_event() -> None:
    reply = FakeReply()
    reply.write(b'event: message_start\ndata: {"type": "message_start"}\n\n')
    last = _answer("/v1/messages", reply, StreamBroken("Connection lost"))
    assert not reply.aborted
    events = parse_events(b"".join(reply.written) + last)
    assert [e.name for e in events] == ["message_start", "error"]
    data = json.loads(events[-1].data)
    assert data["type"] == "error" and data["error"]["type"] == "api_error"


def test_an_event_the_stream_was_in_the_middle_of_is_ended_before_the_error_event() -> None:
    reply = FakeReply()
    reply.write(b'event: message_start\ndata: {"type": "message_start"}\n')  # its blank line never came
    last = _answer("/v1/messages", reply, StreamBroken("Connection lost"))
    events = parse_events(b"".join(reply.written) + last)
    assert [e.name for e in events] == ["message_start", "error"]


def test_a_whole_answer_cut_before_anything_was_written_is_a_502_envelope_not_an_abort() -> None:
    """A backend or node that drops the connection mid-body of an answer routerd reads whole (it had
    sent its headers): nothing went to the client yet, so the client gets the error as its answer."""
    reply = FakeReply()
    body = _answer("/v1/chat/completions", reply, StreamBroken("Connection lost"))
    assert not reply.aborted and reply.status == 502
    error = json.loads(body)["error"]
    assert error["code"] == "backend_error" and "broke off" in error["message"]
