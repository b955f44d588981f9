"""Log observers: flat JSON lines, level filter, factory noise off, access lines."""

from __future__ import annotations

import io
import json
from typing import Any

from twisted.internet.task import Clock
from twisted.logger import Logger, LogLevel, LogPublisher, capturedLogs
from twisted.web.test.requesthelper import DummyChannel

from routerd.api.site import LimitedRequest, access_line
from routerd.logs import JsonLinesObserver, filtered, flat_event, is_noise, parse_level, request_model


def _publish(observer: Any, emit: Any) -> None:
    publisher = LogPublisher(observer)
    emit(Logger(namespace="routerd.test", observer=publisher))


def test_json_lines_are_flat_objects_that_json_loads_reads() -> None:
    """Each event is one ``\\n``-ended JSON object with time, level, namespace, rendered msg and the
    event's own fields; no RFC 7464 record separator."""
    out = io.StringIO()
    _publish(JsonLinesObserver(out), lambda log: log.info("lent {request_id} to {helper}",
                                                          request_id="r1", helper="b/m"))
    text = out.getvalue()
    assert "\x1e" not in text and text.endswith("\n") and text.count("\n") == 1
    line = json.loads(text)
    assert line["msg"] == "lent r1 to b/m"
    assert line["level"] == "info" and line["namespace"] == "routerd.test"
    assert line["request_id"] == "r1" and line["helper"] == "b/m"
    assert line["time"].endswith("Z")
    assert not any(key.startswith("log_") for key in line)


def test_a_field_named_like_a_reserved_key_does_not_overwrite_it() -> None:
    """A keyword field ``msg`` or ``time`` is kept as ``event_msg``/``event_time``."""
    flat = flat_event({"log_format": "x {msg}", "msg": "inner", "time": 5, "log_level": LogLevel.warn,
                       "log_namespace": "n", "log_time": 0.0})
    assert flat["msg"] == "x inner" and flat["event_msg"] == "inner" and flat["level"] == "warn"
    assert "event_time" not in flat  # legacy ``time`` is an internal key


def test_failures_carry_their_traceback_and_odd_values_become_strings() -> None:
    """``log.failure`` lines keep the traceback; non-JSON values (objects, NaN) are rendered."""
    out = io.StringIO()

    def emit(log: Logger) -> None:
        try:
            raise ValueError("boom")
        except ValueError:
            log.failure("failed {thing}", thing=object(), ratio=float("nan"))

    _publish(JsonLinesObserver(out), emit)
    line = json.loads(out.getvalue())
    assert line["level"] == "critical" and "ValueError: boom" in line["traceback"]
    assert line["thing"].startswith("<object object") and line["ratio"] == "nan"


def test_level_filter_drops_debug_by_default_and_lets_it_through_at_debug() -> None:
    for level, expected in (("info", ["kept"]), ("debug", ["noise", "kept"])):
        out = io.StringIO()
        _publish(filtered(JsonLinesObserver(out), parse_level(level)),
                 lambda log: (log.debug("noise"), log.info("kept")))
        assert [json.loads(x)["msg"] for x in out.getvalue().splitlines()] == expected


def test_factory_start_and_stop_lines_are_dropped() -> None:
    """Every backend connection logs "Starting factory …"; the node's observer drops those."""
    out = io.StringIO()
    _publish(filtered(JsonLinesObserver(out), LogLevel.info),
             lambda log: (log.info("Starting factory {factory!r}", factory=object()),
                          log.info("Stopping factory {factory!r}", factory=object()),
                          log.info("listening")))
    assert [json.loads(x)["msg"] for x in out.getvalue().splitlines()] == ["listening"]
    assert is_noise({"message": ("Starting factory <x>",)})


def test_unknown_log_level_is_refused_with_the_choices() -> None:
    try:
        parse_level("loud")
    except ValueError as exc:
        assert "debug" in str(exc) and "loud" in str(exc)
    else:
        raise AssertionError("parse_level accepted an unknown level")


def test_request_model_prefers_the_json_body_then_query_then_header() -> None:
    assert request_model("q", "h", "application/json", b'{"model": "m"}') == "m"
    assert request_model("q", "h", "", b'{"model": "m"}') == "m"  # curl -d sends a form type
    assert request_model("q", "h", "multipart/form-data", b"--x") == "q"
    assert request_model(None, "h", "application/json", b"[]") == "h"
    assert request_model(None, None, "application/json", b"x" * 70000) == "-"


def test_access_line_names_request_id_method_path_model_node_status_bytes_ms_and_lent_to() -> None:
    """One ``routerd.access`` line per answered request, timed from when the request arrived."""
    clock = Clock()
    clock.advance(100)
    channel = DummyChannel()
    channel.site = type("S", (), {"reactor": clock})()
    request = LimitedRequest(channel)
    request.method = b"POST"
    request.path = b"/v1/chat/completions"
    request.uri = b"/v1/chat/completions"
    request.args = {}
    request.requestHeaders.setRawHeaders(b"content-type", [b"application/json"])
    request.content = io.BytesIO(b'{"model": "chat-small"}')
    request.setResponseCode(200)
    request.responseHeaders.setRawHeaders(b"x-routerd-request-id", [b"abc"])
    request.responseHeaders.setRawHeaders(b"x-routerd-node", [b"b"])
    request.responseHeaders.setRawHeaders(b"x-routerd-lent-to", [b"c/helper"])
    request.sentLength = 42
    with capturedLogs() as events:
        access_line(request, 100.25)
    [event] = events
    assert event["log_namespace"] == "routerd.access"
    assert (event["method"], event["path"], event["status"], event["bytes"], event["ms"]) == (
        "POST", "/v1/chat/completions", 200, 42, 250)
    assert (event["model"], event["node"], event["lent_to"], event["request_id"]) == (
        "chat-small", "b", "c/helper", "abc")
    flat = flat_event(event)
    assert flat["msg"].startswith("POST /v1/chat/completions 200 42B 250ms model=chat-small node=b")
