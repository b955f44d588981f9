"""Log observers for a node: level filter, no connection-factory noise, flat JSON lines, access lines.

``--json-log PATH|-`` writes one plain JSON object a line (``json.loads`` reads each line; no RFC 7464
record separator): ``time`` (ISO-8601, UTC), ``level``, ``namespace``, ``msg`` (the rendered
message), then the event's own keyword fields.  ``--log-level`` drops events below a level; factory
start/stop events ("Starting factory …"), which every backend connection produces, are dropped.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import IO, Any

from twisted.logger import (
    FilteringLogObserver,
    ILogFilterPredicate,
    ILogObserver,
    LogLevel,
    LogLevelFilterPredicate,
    PredicateResult,
    formatEvent,
)
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
    message = event.get("message")
    return (bool(message) and isinstance(message, tuple) and isinstance(message[0], str)
            and message[0].startswith(_NOISE_PREFIXES))


@implementer(ILogFilterPredicate)
class _DropNoise:
    def __call__(self, event: Mapping[str, Any]) -> PredicateResult:
        result: PredicateResult = PredicateResult.no if is_noise(event) else PredicateResult.maybe
        return result


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


def flat_event(event: Mapping[str, Any]) -> dict[str, Any]:
    """One event as a flat JSON-ready dict (see the module docstring)."""
    level = event.get("log_level")
    stamp = event.get("log_time")
    when = datetime.fromtimestamp(stamp if isinstance(stamp, int | float) else 0.0, UTC)
    out: dict[str, Any] = {
        "time": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "level": level.name if isinstance(level, type(LogLevel.info)) else "info",
        "namespace": str(event.get("log_namespace", "-")),
        "msg": formatEvent(dict(event)) or "",
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

    def __call__(self, event: Mapping[str, Any]) -> None:
        try:
            line = json.dumps(flat_event(event), ensure_ascii=False)
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


def filtered(observer: ILogObserver, level: LogLevel) -> ILogObserver:
    """``observer`` behind the level filter and the factory-noise filter."""
    return FilteringLogObserver(observer, [LogLevelFilterPredicate(defaultLogLevel=level), _DropNoise()])


def literal(text: str) -> str:
    """``text`` as a log format that renders as itself: a line built once with ``str.format`` (C)
    is then not formatted again field by field by twisted's Python-level formatter, while the
    event still carries its keyword fields (issue 14: lines logged per request)."""
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
            return str(parsed["model"])
    return query_model or header_model or "-"
