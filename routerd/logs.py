"""Log observers for a node: level filter, no connection-factory noise, text lines, flat JSON lines,
access lines.

The text observer (:func:`text_observer`) writes exactly what twisted's ``textFileLogObserver``
writes (``2026-12-01T08:03:53+0000 [routerd.access#info] POST /v1/chat …``) at a fraction of its
cost (it runs for every request line): the timestamp is rendered once per second (and the whole
``stamp [namespace#level] `` prefix once per second and namespace), the line is written in the
formatter's own frame, and a format with no replacement fields (see :func:`literal`) is taken as
its own text instead of going through twisted's Python-level formatter.  The level filter
(:func:`filtered`) runs before any of it.

``--json-log PATH|-`` writes one plain JSON object a line (``json.loads`` reads each line; no RFC 7464
record separator): ``time`` (ISO-8601, UTC), ``level``, ``namespace``, ``msg`` (the rendered
message), then the event's own keyword fields.  ``--log-level`` drops events below a level; factory
start/stop events ("Starting factory …"), which every backend connection produces, are dropped.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from functools import partial
from time import time
from typing import IO, Any

from twisted.logger import (
    ILogObserver,
    Logger,
    LogLevel,
    formatEvent,
    formatTime,
)
from twisted.python.compat import ioType
from zope.interface import implementer

LEVELS = {"debug": LogLevel.debug, "info": LogLevel.info, "warn": LogLevel.warn,
          "warning": LogLevel.warn, "error": LogLevel.error, "critical": LogLevel.critical}

# Keys of a twisted.logger event (and of legacy twisted.python.log events) that are not the
# event's own fields.
_INTERNAL = frozenset({"message", "isError", "system", "format", "time", "log_legacy"})
_RESERVED = frozenset({"time", "level", "namespace", "msg"})
_NOISE_PREFIXES = ("Starting factory", "Stopping factory")


def parse_level(name: str) -> LogLevel:
    try:
        level: LogLevel = LEVELS[name.strip().lower()]
        return level
    except KeyError:
        raise ValueError(f"unknown log level {name!r}; one of {', '.join(sorted(LEVELS))}") from None


def is_noise(event: Mapping[str, Any]) -> bool:
    """A connection factory's start/stop line: one per backend connection, of no use to an operator."""
    fmt = event.get("log_format")
    if isinstance(fmt, str) and fmt.startswith(_NOISE_PREFIXES):
        return True
    if "message" not in event:  # a twisted.logger event, not a legacy one (30 -> 24 opcodes an event)
        return False
    message = event["message"]
    return (bool(message) and isinstance(message, tuple) and isinstance(message[0], str)
            and message[0].startswith(_NOISE_PREFIXES))


def message(event: Mapping[str, Any]) -> str:
    """``event``'s rendered message, equal to ``twisted.logger.formatEvent(event)``.

    A ``str`` format with no replacement field (a :func:`literal`, or a constant message) is its
    own text, its ``{{``/``}}`` unescaped; anything else goes through twisted's formatter."""
    fmt = event.get("log_format")
    if type(fmt) is str and "log_flattened" not in event:
        if "{" not in fmt and "}" not in fmt:
            return fmt
        if "{" not in (rest := fmt.replace("{{", "").replace("}}", "")) and "}" not in rest:
            return fmt.replace("{{", "{").replace("}}", "}")
    text: str = formatEvent(event)  # type: ignore[arg-type]
    return text


def _traceback(failure: Any) -> str:
    # as twisted.logger._format._formatTraceback
    try:
        text: str = failure.getTraceback()
    except BaseException as exc:  # noqa: BLE001 - as twisted: a broken failure must not lose the line
        text = "(UNABLE TO OBTAIN TRACEBACK FROM EVENT):" + str(exc)
    return text


def _system(event: Mapping[str, Any]) -> str:
    # as twisted.logger._format._formatSystem
    system = event.get("log_system")
    if system is None:
        level = event.get("log_level")
        return "{namespace}#{level}".format(namespace=event.get("log_namespace", "-"),
                                            level="-" if level is None else level.name)
    try:
        return str(system)
    except Exception:  # noqa: BLE001 - as twisted
        return "UNFORMATTABLE"


# A fractional second at or above this may round (to microseconds, as datetime.fromtimestamp
# does) into the next second: such a time is rendered without the cache.
_LAST_SAFE_FRACTION = 0.999999
_MAX_SYSTEMS = 4096


@implementer(ILogObserver)
class ClassicText:
    """Formats an event as ``formatEventAsClassicLogText`` does with twisted's default time format
    (``%Y-%m-%dT%H:%M:%S%z``, local time), byte for byte, caching the rendered timestamp of the
    last second seen, the ``[namespace#level]`` of each (namespace, level) and, within the second,
    the whole ``stamp [namespace#level] `` prefix.

    Given a stream (``out``) it is also the text-file observer: each line is written to it (UTF-8
    bytes to a binary stream, as twisted's ``FileLogObserver``) and flushed, in the same frame
    (the access line and a backend line per request: 2 events, each one frame less)."""

    def __init__(self, format_time: Callable[[float], str] = formatTime, out: IO[Any] | None = None) -> None:
        self._format_time = format_time
        self._second = math.nan
        self._stamp = ""
        # [low, high): the float times whose stamp is the cached one (each passes stamp()'s checks);
        # the prefixes (stamp and system) rendered for that second, by (namespace, level)
        self._low = self._high = math.nan
        self._prefixes: dict[tuple[str, Any], str] = {}
        self._systems: dict[tuple[Any, Any], str] = {}
        # bound once: text streams take the line itself, binary ones its UTF-8 bytes
        self._write: Callable[[str], object] = _discard
        self._flush: Callable[[], object] = _nothing
        if out is not None:
            write, self._flush = out.write, out.flush
            self._write = write if ioType(out) is str else lambda line: write(line.encode("utf-8"))

    def stamp(self, when: Any) -> str:
        """``twisted.logger.formatTime(when)``, rendered at most once per second."""
        if type(when) is not float:
            return "-" if when is None else self._format_time(when)
        second = when // 1.0
        if not when - second < _LAST_SAFE_FRACTION or second < 0:
            return self._format_time(when)
        if second == self._second:
            return self._stamp
        self._second, self._stamp = second, self._format_time(second)
        self._low, self._high = second, second + _LAST_SAFE_FRACTION
        self._prefixes.clear()
        return self._stamp

    def system(self, event: Mapping[str, Any]) -> str:
        namespace, level = event.get("log_namespace", "-"), event.get("log_level")
        if type(namespace) is str and "log_system" not in event:
            key = (namespace, level)
            cached = self._systems.get(key)
            if cached is None:
                if len(self._systems) >= _MAX_SYSTEMS:
                    self._systems.clear()
                cached = self._systems[key] = "[" + _system(event) + "] "
            return cached
        return "[" + _system(event) + "] "

    def __call__(self, event: Mapping[str, Any]) -> str | None:  # type: ignore[override]
        # (returns the line too, for the formatter's own callers; a publisher ignores it)
        text = message(event)
        if "log_failure" in event:
            text = text + "\n" + _traceback(event["log_failure"])
        if not text:
            return None
        # the prefix, stamp(log_time) + " " + system(event), is one dict lookup for an event in the
        # cached second (with the write done here rather than by twisted's FileLogObserver: 134 ->
        # 97 opcodes an event, 2 events a request)
        when = event.get("log_time")
        namespace = event.get("log_namespace", "-")
        if (type(when) is float and self._low <= when < self._high and type(namespace) is str
                and "log_system" not in event):
            key = (namespace, event.get("log_level"))
            prefix = self._prefixes.get(key)
            if prefix is None:
                if len(self._prefixes) >= _MAX_SYSTEMS:
                    self._prefixes.clear()
                prefix = self._prefixes[key] = self._stamp + " " + self.system(event)
        else:
            prefix = self.stamp(when) + " " + self.system(event)
        line = prefix + text
        if "\n" in line:
            line = line.replace("\n", "\n\t")
        line += "\n"
        self._write(line)
        self._flush()
        return line


def _discard(_line: str) -> None:
    pass


def _nothing() -> None:
    pass


def text_observer(stream: IO[Any]) -> ILogObserver:
    """A text-file observer writing what ``twisted.logger.textFileLogObserver(stream)`` writes
    (a text stream, or UTF-8 bytes to a binary one; flushed after each line), cheaply."""
    observer: ILogObserver = ClassicText(out=stream)
    return observer


def _json_value(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    return str(value)


def iso_time(stamp: float) -> str:
    """``stamp`` as ISO-8601 UTC with milliseconds (``2026-12-01T08:03:53.120Z``)."""
    when = datetime.fromtimestamp(stamp, UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class IsoTimes:
    """:func:`iso_time`, with the part up to the second rendered once per second."""

    def __init__(self) -> None:
        self._second = math.nan
        self._prefix = ""

    def __call__(self, stamp: float) -> str:
        second = stamp // 1.0
        micros = round((stamp - second) * 1e6)  # as datetime.fromtimestamp rounds (half even)
        if micros >= 1_000_000 or second < 0:
            return iso_time(stamp)
        if second != self._second:
            self._second, self._prefix = second, iso_time(second)[:-4]
        return f"{self._prefix}{micros // 1000:03d}Z"


def flat_event(event: Mapping[str, Any], times: Callable[[float], str] = iso_time) -> dict[str, Any]:
    """One event as a flat JSON-ready dict (see the module docstring)."""
    level = event.get("log_level")
    stamp = event.get("log_time")
    out: dict[str, Any] = {
        "time": times(float(stamp) if isinstance(stamp, int | float) else 0.0),
        "level": level.name if isinstance(level, type(LogLevel.info)) else "info",
        "namespace": str(event.get("log_namespace", "-")),
        "msg": message(event) or "",
    }
    failure = event.get("log_failure")
    if failure is not None:
        try:
            out["traceback"] = failure.getTraceback()
        except Exception:  # noqa: BLE001 - a broken failure must not lose the line
            out["traceback"] = repr(failure)
    for key, value in event.items():
        if key.startswith("log_") or key in _INTERNAL:
            continue
        out[f"event_{key}" if key in _RESERVED else key] = _json_value(value)
    return out


@implementer(ILogObserver)
class JsonLinesObserver:
    """Writes each event as one flat JSON line to ``stream`` and flushes it."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self._times = IsoTimes()

    def __call__(self, event: Mapping[str, Any]) -> None:
        try:
            line = json.dumps(flat_event(event, self._times), ensure_ascii=False)
        except (TypeError, ValueError):
            line = json.dumps({"level": "error", "msg": "unserialisable log event",
                               "namespace": str(event.get("log_namespace", "-"))})
        self.stream.write(line + "\n")
        self.stream.flush()


@implementer(ILogObserver)
class FanOut:
    """Hands every event to each observer."""

    def __init__(self, observers: Iterable[ILogObserver]) -> None:
        self.observers = list(observers)

    def __call__(self, event: dict[str, Any]) -> None:
        for observer in self.observers:
            observer(event)


def fan_out(observers: Iterable[ILogObserver]) -> ILogObserver:
    """One observer handing every event to each of ``observers``: the observer itself when there
    is only one (the node's usual text log: a :class:`FanOut` frame less an event, 30 opcodes a
    request)."""
    listed = list(observers)
    if len(listed) == 1:
        return listed[0]
    observer: ILogObserver = FanOut(listed)
    return observer


def at_or_above(level: LogLevel) -> frozenset[LogLevel]:
    """Every level at ``level`` or above."""
    return frozenset(each for each in LogLevel.iterconstants() if not each < level)


@implementer(ILogObserver)
class LevelFilter:
    """Hands ``observer`` the events at ``level`` or above, except factory noise, before anything
    formats them.  Drops what ``twisted.logger.LogLevelFilterPredicate`` drops (no level, no
    namespace, below the level) with one set lookup."""

    def __init__(self, observer: ILogObserver, level: LogLevel) -> None:
        self.observer = observer
        self.level = level
        self._allowed = at_or_above(level)

    def __call__(self, event: dict[str, Any]) -> None:
        if event.get("log_level") not in self._allowed or not event.get("log_namespace") or is_noise(event):
            return
        self.observer(event)


class LevelGate:
    """The lowest level any observer of this process writes, for callers that would render a line
    per request: ``if gate.enabled(LogLevel.info): log.info(literal(...))`` skips the rendering
    when the level is off.  Open (everything enabled) until the node's observer sets it."""

    def __init__(self) -> None:
        self.set(LogLevel.debug)

    def set(self, level: LogLevel) -> None:
        self.lowest = level
        self.levels = at_or_above(level)
        #: ``enabled(LogLevel.info)``, the level of the lines logged per request, answered once here
        self.info = self.enabled(LogLevel.info)

    def enabled(self, level: LogLevel) -> bool:
        return level in self.levels


#: The process's gate; ``routerd.tap`` sets it from ``--log-level`` when its filter covers every
#: observer (not under ``twistd --logger``).
gate = LevelGate()


_ALL_LEVELS = frozenset(LogLevel.iterconstants())
_BY_NAME = {level.name: level for level in LogLevel.iterconstants()}


class QuickLogger(Logger):
    """A ``twisted.logger.Logger`` for lines logged per request: an event below the process's
    :data:`gate` is not even built, and the level is checked with one set lookup (twisted's
    ``emit`` sorts the levels on every call).  Otherwise the same event as twisted's."""

    def __init__(self, namespace: str | None = None, source: object | None = None,
                 observer: ILogObserver | None = None) -> None:
        if namespace is None:  # the module calling us, as twisted's Logger names it (one frame up)
            namespace = self._namespaceFromCallingContext()
        super().__init__(namespace, source, observer)
        # log.info(...) goes straight to emit through a C partial instead of twisted's Python-level
        # Logger.info frame (14 opcodes an event, 2 events a request); the same call, same event
        vars(self).update({name: partial(self.emit, level) for name, level in _BY_NAME.items()})

    def emit(self, level: LogLevel, format: str | None = None, **kwargs: object) -> None:  # noqa: A002
        if level not in gate.levels:
            if level not in _ALL_LEVELS:
                super().emit(level, format, **kwargs)  # twisted's own complaint
            return
        kwargs.update(log_logger=self, log_level=level, log_namespace=self.namespace,
                      log_source=self.source, log_format=format, log_time=time())
        if "log_trace" in kwargs:
            kwargs["log_trace"].append((self, self.observer))  # type: ignore[attr-defined]
        self.observer(kwargs)


def filtered(observer: ILogObserver, level: LogLevel) -> ILogObserver:
    """``observer`` behind the level filter and the factory-noise filter."""
    return LevelFilter(observer, level)


def literal(text: str) -> str:
    """``text`` as a log format that renders as itself: a line built once with ``str.format`` (C)
    is then not formatted again field by field by twisted's Python-level formatter, while the
    event still carries its keyword fields (lines are logged per request)."""
    if "{" not in text and "}" not in text:
        return text  # the common line: no str.replace calls
    return text.replace("{", "{{").replace("}", "}}")


ACCESS_FORMAT = ("{method} {path} {status} {bytes}B {ms}ms model={model} node={node} lent_to={lent_to}"
                 " id={request_id} client={client}")
_MODEL_BODY_LIMIT = 64 * 1024


def request_model(query_model: str | None, header_model: str | None, content_type: str,
                  body: bytes | None) -> str:
    """The model a request named, for its access line: JSON ``model`` (small bodies only), else the
    ``model`` query argument, else ``X-Routerd-Model``; ``-`` when none."""
    looks_json = "json" in content_type or (body or b"").lstrip()[:1] == b"{"
    if body and len(body) <= _MODEL_BODY_LIMIT and looks_json:
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and isinstance(parsed.get("model"), str) and parsed["model"]:
            return _bounded(str(parsed["model"]))
    return _bounded(query_model or header_model or "-")


#: Characters of a model name an access line keeps (a longer name is refused, 400, but its
#: access line is still written).
_MODEL_SHOWN = 256


def _bounded(name: str) -> str:
    if len(name) <= _MODEL_SHOWN:
        return name
    return f"{name[:64]}...({len(name)} characters)"
