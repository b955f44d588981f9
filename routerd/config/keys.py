"""Named inference keys (``auth.inference_keys`` entries).

An entry is a plain string (the key; its name is generated, ``key-1``, ``key-2``… by position) or an
object ``{name, key | key_file | key_env, class, limits}``.  The key itself is a secret: only its
name goes to logs, metrics, analytics and the decision log.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Literal

import attrs

PriorityClass = Literal["interactive", "standard", "batch"]
#: The classes, highest first (their index is the rank the router queue orders by).
PRIORITY_CLASSES: tuple[PriorityClass, ...] = ("interactive", "standard", "batch")
DEFAULT_CLASS: PriorityClass = "standard"

class PriorityError(ValueError):
    """An ``X-Routerd-Priority`` value that names no class."""


def requested_class(own: PriorityClass, asked: str) -> PriorityClass:
    """The class a request runs in: its key's ``own`` class, lowered to ``asked`` (the
    ``X-Routerd-Priority`` header) when that is lower; a higher ``asked`` keeps ``own``.  An
    unknown value raises :class:`PriorityError`; an empty one keeps ``own``."""
    value = asked.strip().lower()
    if not value:
        return own
    if value not in PRIORITY_CLASSES:
        raise PriorityError(f"X-Routerd-Priority must be one of {', '.join(PRIORITY_CLASSES)}, not {asked!r}")
    wanted = PRIORITY_CLASSES[PRIORITY_CLASSES.index(value)]
    return wanted if PRIORITY_CLASSES.index(wanted) > PRIORITY_CLASSES.index(own) else own


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
#: The fields of an ``auth.inference_keys`` object entry and of its ``limits`` (contract §2).
KEY_FIELDS = ("name", "key", "key_file", "key_env", "class", "limits")
LIMIT_FIELDS = ("max_concurrent", "requests_per_minute", "tokens_per_minute", "weight")


@attrs.frozen
class KeyLimits:
    """A key's limits (0 = unlimited) and its fair-share ``weight``."""

    max_concurrent: int = 0
    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    weight: float = 1.0

    @property
    def limited(self) -> bool:
        return bool(self.max_concurrent or self.requests_per_minute or self.tokens_per_minute)


@attrs.frozen
class InferenceKey:
    name: str
    key: str = attrs.field(repr=False)  # never printed
    priority: PriorityClass = DEFAULT_CLASS
    limits: KeyLimits = KeyLimits()


Complain = Callable[[str, str], None]


def read_inference_keys(value: Any, env: Mapping[str, str], resolve_path: Callable[[str], str],
                        complain: Complain) -> tuple[InferenceKey, ...]:
    """The entries of ``auth.inference_keys`` (``value``); every problem goes to ``complain(where,
    message)`` and the entry is left out.  ``resolve_path`` makes a ``key_file`` absolute."""
    where = "auth.inference_keys"
    if value is None:
        return ()
    if isinstance(value, str | dict):
        value = [value]
    if not isinstance(value, list):
        complain(where, "must be a list of keys (strings or {name, key, class, limits} objects)")
        return ()
    out: list[InferenceKey] = []
    for n, item in enumerate(value, 1):
        entry = _entry(item, n, env, resolve_path, complain, f"{where}[{n - 1}]")
        if entry is not None:
            out.append(entry)
    seen: set[str] = set()
    for entry in out:
        if entry.name in seen:
            complain(where, f"names {entry.name!r} twice")
        seen.add(entry.name)
    return tuple(out)


def _entry(item: Any, n: int, env: Mapping[str, str], resolve_path: Callable[[str], str],
           complain: Complain, where: str) -> InferenceKey | None:
    if isinstance(item, str):
        return InferenceKey(f"key-{n}", item.strip())
    if not isinstance(item, dict):
        complain(where, "must be a string or a {name, key, class, limits} object")
        return None
    for field in item:
        if field not in KEY_FIELDS:
            complain(f"{where}.{field}", f"unknown key (known: {', '.join(KEY_FIELDS)})")
    name = item.get("name", f"key-{n}")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        complain(f"{where}.name", "must be 1-64 letters, digits, '.', '_' or '-'")
        return None
    key = _secret(item, env, resolve_path, complain, where)
    priority = item.get("class", DEFAULT_CLASS)
    if priority not in PRIORITY_CLASSES:
        complain(f"{where}.class", f"must be one of {', '.join(PRIORITY_CLASSES)}, got {priority!r}")
        return None
    limits = _limits(item.get("limits"), complain, f"{where}.limits")
    if key is None or limits is None:
        return None
    return InferenceKey(name, key, priority, limits)


def _secret(item: Mapping[str, Any], env: Mapping[str, str], resolve_path: Callable[[str], str],
            complain: Complain, where: str) -> str | None:
    given = [field for field in ("key", "key_file", "key_env") if item.get(field) is not None]
    if len(given) != 1:
        complain(where, "needs exactly one of key, key_file, key_env")
        return None
    field = given[0]
    source = item[field]
    if not isinstance(source, str) or not source.strip():
        complain(f"{where}.{field}", "must be a non-empty string")
        return None
    if field == "key":
        return source.strip()
    if field == "key_env":
        value = env.get(source, "").strip()
        if not value:
            complain(f"{where}.key_env", f"environment variable {source} is not set or empty")
            return None
        return value
    path = resolve_path(source)
    try:
        with open(path, encoding="utf-8") as fh:
            value = fh.read().strip()
    except OSError as exc:
        complain(f"{where}.key_file", f"{path}: {exc.strerror or exc}")
        return None
    if not value or "\n" in value:
        complain(f"{where}.key_file", f"{path} must hold one non-empty key")
        return None
    return value


def _limits(value: Any, complain: Complain, where: str) -> KeyLimits | None:
    if value is None:
        return KeyLimits()
    if not isinstance(value, dict):
        complain(where, "must be a mapping")
        return None
    ok = True
    counts: dict[str, int] = {}
    for field in value:
        if field not in LIMIT_FIELDS:
            complain(f"{where}.{field}", f"unknown key (known: {', '.join(LIMIT_FIELDS)})")
            ok = False
    for field in LIMIT_FIELDS[:3]:
        raw = value.get(field, 0)
        if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= 100_000_000:
            complain(f"{where}.{field}", f"must be a whole number from 0 (unlimited), got {raw!r}")
            ok = False
            continue
        counts[field] = raw
    weight = value.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 < weight <= 1000:
        complain(f"{where}.weight", f"must be a number above 0 and at most 1000, got {weight!r}")
        ok = False
        weight = 1.0
    if not ok:
        return None
    return KeyLimits(counts["max_concurrent"], counts["requests_per_minute"], counts["tokens_per_minute"],
                     float(weight))


__all__ = ["DEFAULT_CLASS", "PRIORITY_CLASSES", "InferenceKey", "KeyLimits", "PriorityClass",
           "PriorityError", "read_inference_keys", "requested_class"]
