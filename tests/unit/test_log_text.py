"""The cheap text observer writes what twisted's ``textFileLogObserver`` writes, byte for byte; its
per-second timestamp cache rolls over; the level filter drops events before anything formats them;
the JSON observer's cached times equal the uncached ones; backend lines below the level are not
rendered but stay in the tail (issue 14: logging was ~12 % of a request's CPU)."""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from twisted.logger import (
    FilteringLogObserver,
    Logger,
    LogLevel,
    LogLevelFilterPredicate,
    LogPublisher,
    capturedLogs,
    formatEvent,
    formatTime,
    textFileLogObserver,
)
from twisted.logger._legacy import publishToNewObserver
from twisted.python import log as legacy_log
from twisted.python.failure import Failure

from routerd.backends.process import _BackendProtocol
from routerd.logs import (
    ClassicText,
    IsoTimes,
    JsonLinesObserver,
    LevelGate,
    QuickLogger,
    fan_out,
    filtered,
    gate,
    iso_time,
    literal,
    message,
    text_observer,
)

S0 = 1_780_000_000.0  # a whole second in 2026
T0 = S0 + 0.25


@pytest.fixture(params=["UTC0", "EST5EDT,M3.2.0,M11.1.0", "IST-5:30"])
def local_zone(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs the test in UTC, in a zone with daylight saving and in a half-hour zone (POSIX TZ
    strings: no tz database needed)."""
    saved = os.environ.get("TZ")
    os.environ["TZ"] = request.param
    time.tzset()
    try:
        yield request.param
    finally:
        if saved is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = saved
        time.tzset()


def _failure() -> Failure:
    try:
        raise ValueError("boom ☃")
    except ValueError:
        return Failure()


class _Thing:
    def __repr__(self) -> str:
        return "<thing>"

    def name(self) -> str:
        return "called"


def _events() -> list[dict[str, Any]]:
    """Representative events: literal and formatted lines, failures, non-ASCII text, namespaces,
    legacy systems, every level, odd and broken formats."""
    events: list[dict[str, Any]] = []
    for level in LogLevel.iterconstants():
        events.append({"log_format": "plain at {level_name}", "level_name": level.name,
                       "log_level": level, "log_namespace": "routerd.test", "log_time": T0})
    base = {"log_level": LogLevel.info, "log_namespace": "routerd.access", "log_time": T0 + 0.5}
    for fmt in [
        literal("POST /v1/chat/completions 200 42B 3ms model=chat-small node=b lent_to=- id=r1"),
        literal('b/m: {"json": {"from": "a backend"}} }} {{'),
        literal("naïve café — 日本語 ☃"),
        "request {request_id} lent to {helper!r} in {ms:.2f} ms",
        "call syntax: {thing.name()} and {thing}",
        "two\nlines\n",
        "{missing} field",
        "single } brace",
        "",
    ]:
        events.append({**base, "log_format": fmt, "request_id": "r1", "helper": "b/m", "ms": 1.5,
                       "thing": _Thing()})
    events.append({**base, "log_format": b"bytes format {ms}", "ms": 2})
    events.append({**base, "log_format": 12})
    events.append({**base, "log_format": None})
    events.append({**base, "log_format": "failed {what}", "what": "x", "log_failure": _failure(),
                   "log_level": LogLevel.critical})
    events.append({**base, "log_format": "", "log_failure": _failure()})
    events.append({**base, "log_format": "no namespace"} | {"log_namespace": None})
    no_namespace = {k: v for k, v in base.items() if k != "log_namespace"}
    events.append({**no_namespace, "log_format": "missing namespace"})
    events.append({"log_format": "no level, no time", "log_namespace": "n"})
    events.append({**base, "log_format": "a legacy system", "log_system": "HTTPChannel,3,127.0.0.1"})
    events.append({**base, "log_format": "time as int", "log_time": 1_780_000_000})
    events.append({**base, "log_format": "flattened {x}", "x": 1, "log_flattened": {"x": "1"}})
    return events


def _twisted_text(events: list[dict[str, Any]], binary: bool = False) -> Any:
    out: Any = io.BytesIO() if binary else io.StringIO()
    observer = textFileLogObserver(out)
    for event in events:
        observer(event)
    return out.getvalue()


def _our_text(events: list[dict[str, Any]], binary: bool = False) -> Any:
    out: Any = io.BytesIO() if binary else io.StringIO()
    observer = text_observer(out)
    for event in events:
        observer(event)
    return out.getvalue()


def test_every_representative_event_is_written_exactly_as_twisted_writes_it(local_zone: str) -> None:
    """Literal and formatted lines, tracebacks, non-ASCII, namespaces, systems, every level, broken
    formats: the same text as ``textFileLogObserver``, line by line, in several time zones."""
    for event in _events():
        assert _our_text([event]) == _twisted_text([event]), event.get("log_format")
    assert _our_text(_events()) == _twisted_text(_events())


def test_a_binary_stream_gets_the_same_utf8_bytes() -> None:
    """A log file opened in binary (twistd's ``LogFile``) receives the same UTF-8 bytes."""
    assert _our_text(_events(), binary=True) == _twisted_text(_events(), binary=True)


def test_events_logged_through_a_logger_and_the_legacy_log_match() -> None:
    """Real events (``Logger.info``/``failure``, ``twisted.python.log.msg``) as they reach the
    node's observer."""
    ours, theirs = io.StringIO(), io.StringIO()
    publisher = LogPublisher(text_observer(ours), textFileLogObserver(theirs))
    log = Logger(namespace="routerd.backends.process", observer=publisher)
    log.info(literal("chat-small: srv  update_slots: {id_slot} done"), backend="chat-small")
    log.warn("{backend}: still running after SIGTERM", backend="x")
    log.failure("routerd failed to start", failure=_failure())
    legacy_event = {"message": ("legacy ☃",), "isError": 0, "system": "-", "time": T0}
    publishToNewObserver(publisher, legacy_event, legacy_log.textFromEventDict)
    assert ours.getvalue() == theirs.getvalue()
    assert ours.getvalue().count("\n") > 4


def test_a_literal_is_taken_as_its_own_text_without_twisted_formatting() -> None:
    """A format with no replacement field skips twisted's formatter; one with a field does not."""
    assert message({"log_format": literal("a {b} }} c")}) == "a {b} }} c"
    assert message({"log_format": "a {b}", "b": 1}) == "a 1"
    assert message({"log_format": "a {{b}"}).startswith("Unable to format event")


@settings(max_examples=300, deadline=None)
@given(st.text(), st.text())
def test_a_literal_renders_as_its_text_through_message_and_twisted(text: str, other: str) -> None:
    """The format literal() returned last (message() knows it without checking it), one returned
    before it, each with and without flattened fields: message() renders what twisted renders, the
    text itself."""
    first, last = literal(other), literal(text)
    for fmt, expected in ((last, text), (first, other)):
        for event in ({"log_format": fmt}, {"log_format": fmt, "log_flattened": {}}):
            assert message(event) == formatEvent(event) == expected


def test_the_timestamp_is_rendered_once_per_second_and_rolls_over() -> None:
    """Events in one second reuse the stamp; the next second renders again; an event back in an
    earlier second, or one whose fraction would round into the next second, is rendered
    uncached (so it is never wrong)."""
    rendered: list[float] = []

    def fake_format(when: float) -> str:
        rendered.append(when)
        return f"S{int(when)}"

    text = ClassicText(fake_format)
    assert [text.stamp(t) for t in (100.0, 100.2, 100.99)] == ["S100"] * 3
    assert rendered == [100.0]
    assert text.stamp(101.0001) == "S101" and rendered == [100.0, 101.0]
    assert text.stamp(100.5) == "S100" and rendered[-1] == 100.0  # back in time: right, re-rendered
    assert text.stamp(102.9999997) == "S102" and rendered[-1] == 102.9999997  # uncached
    assert text.stamp(None) == "-"
    events = [{"log_format": "x", "log_time": t, "log_level": LogLevel.info, "log_namespace": "n"}
              for t in (7.1, 7.6, 8.0)]
    assert [text(e) for e in events] == ["S7 [n#info] x\n", "S7 [n#info] x\n", "S8 [n#info] x\n"]


_WHEN = st.one_of(
    st.sampled_from([S0, T0, S0 + 0.9999994, S0 + 0.9999996, S0 + 1.0, S0 + 1.5, S0 - 0.5, 0.5, -0.5]),
    st.floats(min_value=S0, max_value=S0 + 2),
    st.integers(min_value=int(S0) - 1, max_value=int(S0) + 1),
    st.none(),
)
_EVENT = st.fixed_dictionaries(
    {"log_format": st.sampled_from(["line", "a {x}", "two\nlines", ""]), "x": st.integers()},
    optional={"log_time": _WHEN,
              "log_namespace": st.sampled_from(["routerd.access", "a\nb", "", None, 3]),
              "log_level": st.sampled_from([LogLevel.info, LogLevel.warn, None]),
              "log_system": st.sampled_from(["HTTPChannel,3,127.0.0.1", "-"])},
)
_SAME_SECOND = {"log_format": "line", "log_time": T0, "log_namespace": "routerd.access",
                "log_level": LogLevel.info}


@settings(max_examples=500, deadline=None)
@given(st.lists(_EVENT, max_size=12))
@example([_SAME_SECOND, _SAME_SECOND, {**_SAME_SECOND, "log_system": "HTTPChannel,3,127.0.0.1"},
          {**_SAME_SECOND, "log_level": LogLevel.warn}, {**_SAME_SECOND, "log_time": T0 - 1}])
@example([_SAME_SECOND, _SAME_SECOND, {**_SAME_SECOND, "log_time": T0 + 1},
          {**_SAME_SECOND, "log_time": T0 + 1.5}])
def test_the_cached_prefix_writes_what_twisted_writes_for_any_sequence(events: list[dict[str, Any]]) -> None:
    """One observer through any sequence of events (seconds forwards and back, ints, no time,
    namespaces, levels, legacy systems): its cached ``stamp [namespace#level] `` prefixes write
    what ``textFileLogObserver`` writes for each event."""
    ours, theirs = io.StringIO(), io.StringIO()
    mine, reference = text_observer(ours), textFileLogObserver(theirs)
    for event in events:
        mine(event)
        reference(event)
        assert ours.getvalue() == theirs.getvalue()


@pytest.mark.parametrize("when", [T0, S0 + 0.9999994, S0 + 0.9999995, S0 + 0.9999996, S0 - 1e-7,
                                  1_772_953_200.0 - 0.4, 1_772_953_200.0, 1_772_953_200.0 + 3600,
                                  1_793_512_800.0 - 0.2, 1_793_512_800.0, 0.5])
def test_cached_stamps_equal_twisted_at_second_edges_and_daylight_saving(local_zone: str,
                                                                         when: float) -> None:
    """At fractions that round into the next second and across 2026's DST changes in New York,
    a warm cache renders what ``formatTime`` renders."""
    text = ClassicText()
    for earlier in (when - 1.0, when - 0.3, when):
        assert text.stamp(earlier) == formatTime(earlier)


@pytest.mark.parametrize("when", [T0, S0 + 0.0004999, S0 + 0.0005, S0 + 0.9994, S0 + 0.9995,
                                  S0 + 0.9999995, S0 + 0.9999996, S0 + 1.0, 0.0, 12.3456])
def test_json_times_equal_the_uncached_iso_time(when: float) -> None:
    times = IsoTimes()
    for earlier in (when - 1.0, when - 0.3, when, when):
        assert times(earlier) == iso_time(earlier)


def test_json_lines_keep_their_fields_with_the_cheap_formatter() -> None:
    out = io.StringIO()
    observer = JsonLinesObserver(out)
    observer({"log_format": literal("GET / 200 {x}"), "log_level": LogLevel.info,
              "log_namespace": "routerd.access", "log_time": T0, "status": 200})
    line = json.loads(out.getvalue())
    assert line == {"time": iso_time(T0), "level": "info", "namespace": "routerd.access",
                    "msg": "GET / 200 {x}", "status": 200}


class _Counting:
    """A field that counts how often something formats it."""

    def __init__(self) -> None:
        self.formatted = 0

    def __format__(self, spec: str) -> str:
        self.formatted += 1
        return "counted"


def test_events_below_the_level_are_dropped_before_any_formatting() -> None:
    """A debug event under ``--log-level info`` reaches no observer and is never formatted."""
    field = _Counting()
    out = io.StringIO()
    log = Logger(namespace="routerd.test", observer=LogPublisher(filtered(text_observer(out),
                                                                          LogLevel.info)))
    log.debug("costly {field}", field=field)
    assert field.formatted == 0 and out.getvalue() == ""
    log.info("costly {field}", field=field)
    assert field.formatted == 1 and out.getvalue().endswith("costly counted\n")


def test_the_level_filter_keeps_and_drops_what_twisteds_predicate_does() -> None:
    """Every level against every threshold, missing levels and namespaces, factory noise."""
    events: list[dict[str, Any]] = [
        {"log_level": level, "log_namespace": ns, "log_format": fmt}
        for level in [*LogLevel.iterconstants(), None]
        for ns in ["routerd.x", "", None]
        for fmt in ["x", "Starting factory <f>"]
    ]
    for threshold in LogLevel.iterconstants():
        ours: list[dict[str, Any]] = []
        theirs: list[dict[str, Any]] = []
        mine = filtered(ours.append, threshold)
        reference = FilteringLogObserver(theirs.append, [LogLevelFilterPredicate(threshold)])
        for event in events:
            mine(event)
            if not str(event["log_format"]).startswith("Starting factory"):
                reference(event)
        assert ours == theirs, threshold


def test_the_gate_says_which_levels_are_enabled() -> None:
    g = LevelGate()
    assert g.enabled(LogLevel.debug)
    g.set(LogLevel.warn)
    assert not g.enabled(LogLevel.info) and g.enabled(LogLevel.warn) and g.enabled(LogLevel.critical)


def test_the_gate_answers_info_once_per_level() -> None:
    """``gate.info`` (asked per backend line) is ``enabled(LogLevel.info)`` after every ``set``."""
    g = LevelGate()
    for level in LogLevel.iterconstants():
        g.set(level)
        assert g.info == g.enabled(LogLevel.info) == (not LogLevel.info < level)


def test_fan_out_hands_every_event_to_each_observer_and_one_observer_as_it_is() -> None:
    first: list[dict[str, Any]] = []
    second: list[dict[str, Any]] = []
    assert fan_out([first.append]) == first.append
    both = fan_out([first.append, second.append])
    both({"log_format": "x"})
    assert first == second == [{"log_format": "x"}]


def test_every_level_method_of_the_quick_logger_emits_what_twisteds_emits() -> None:
    """debug/info/warn/error/critical (partials of ``emit``): the same keys and values as
    ``twisted.logger.Logger``'s, the format given by position or by name."""
    for name in ("debug", "info", "warn", "error", "critical"):
        quick_events: list[dict[str, Any]] = []
        twisted_events: list[dict[str, Any]] = []
        for events, cls in ((quick_events, QuickLogger), (twisted_events, Logger)):
            log = cls(namespace="routerd.x", observer=events.append)
            getattr(log, name)("a {b}", b=1)
            getattr(log, name)(format="c", d=2)
            getattr(log, name)()
        assert len(quick_events) == len(twisted_events) == 3
        for quick, reference in zip(quick_events, twisted_events, strict=True):
            assert quick.keys() == reference.keys()
            assert {k: v for k, v in quick.items() if k not in ("log_time", "log_logger")} == {
                k: v for k, v in reference.items() if k not in ("log_time", "log_logger")}


def test_a_quick_logger_is_named_after_the_module_that_makes_it() -> None:
    assert QuickLogger().namespace == Logger().namespace == __name__


def test_backend_lines_are_logged_once_rendered_and_kept_in_the_tail() -> None:
    """Each output line is one ``name: line`` event with its fields; with info off it is not
    rendered, yet the tail still keeps it for error reasons."""
    protocol = _BackendProtocol("chat-small")
    with capturedLogs() as events:
        protocol.childDataReceived(2, b'slot {"id": 0} done\r\nsecond\npart')
    assert [e["log_format"] for e in events] == [literal('chat-small: slot {"id": 0} done'),
                                                  "chat-small: second"]
    assert message(events[0]) == 'chat-small: slot {"id": 0} done'
    assert events[0]["line"] == 'slot {"id": 0} done'
    try:
        gate.set(LogLevel.warn)
        with capturedLogs() as quiet:
            protocol.childDataReceived(2, b"\nthird\n")
        assert quiet == []
    finally:
        gate.set(LogLevel.debug)
    assert list(protocol.tail) == ['slot {"id": 0} done', "second", "part", "third"]


def test_the_quick_logger_emits_the_event_twisteds_logger_emits() -> None:
    """Same keys and values (but the time) as ``twisted.logger.Logger`` for the same call; the
    same text once written."""
    quick_events: list[dict[str, Any]] = []
    twisted_events: list[dict[str, Any]] = []
    QuickLogger(namespace="routerd.x", observer=quick_events.append).info("a {b}", b=1)
    Logger(namespace="routerd.x", observer=twisted_events.append).info("a {b}", b=1)
    [quick], [reference] = quick_events, twisted_events
    assert quick.keys() == reference.keys()
    assert {k: v for k, v in quick.items() if k not in ("log_time", "log_logger")} == {
        k: v for k, v in reference.items() if k not in ("log_time", "log_logger")}
    assert abs(quick["log_time"] - reference["log_time"]) < 5
    quick["log_time"] = reference["log_time"]
    assert _our_text([quick]) == _twisted_text([reference])


def test_the_quick_logger_builds_no_event_below_the_gate_and_complains_of_bad_levels() -> None:
    events: list[dict[str, Any]] = []
    log = QuickLogger(namespace="routerd.x", observer=events.append)
    try:
        gate.set(LogLevel.warn)
        log.info("dropped {x}", x=_Counting())
        log.warn("kept")
        assert [e["log_format"] for e in events] == ["kept"]
    finally:
        gate.set(LogLevel.debug)
    log.emit("loud", "bad level")  # type: ignore[arg-type]
    assert events[-1]["log_level"] is LogLevel.critical and "invalid log level" in events[-1]["log_format"]
