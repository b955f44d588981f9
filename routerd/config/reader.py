"""Reading a YAML config's values: typed readers that collect every problem instead of failing at
the first (each message names the key and the reason), with "did you mean" for unknown keys.

:mod:`routerd.config.load` reads each section with them and checks what the values mean together.
"""

from __future__ import annotations

import difflib
import os
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from routerd.config.durations import DurationError, parse_duration
from routerd.config.schema import BinaryConfig


def did_you_mean(key: str, known: Iterable[str]) -> str:
    matches = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f" (did you mean {matches[0]!r}?)" if matches else ""


class Errors:
    """Every problem found so far, each as ``key: reason``."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, key: str, reason: str) -> None:
        self.items.append(f"{key}: {reason}")


def section_of(data: Mapping[str, Any], name: str, errs: Errors) -> Mapping[str, Any]:
    """The ``name`` section of the YAML document (empty when absent or not a mapping)."""
    value = data.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        errs.add(name, "must be a mapping of keys")
        return {}
    return value


@attrs.define
class Reader:
    """Typed values out of one section; a wrong value is an error and its default is used."""

    errs: Errors
    base_dir: str

    def unknown(self, section: Mapping[str, Any], name: str, known: tuple[str, ...]) -> None:
        for key in section:
            if key not in known:
                self.errs.add(f"{name}.{key}", "unknown key" + did_you_mean(str(key), known))

    def string(self, section: Mapping[str, Any], name: str, key: str, default: str) -> str:
        value = section.get(key, default)
        if value is None:
            return default
        if not isinstance(value, str):
            self.errs.add(f"{name}.{key}", f"must be a string, got {type(value).__name__}")
            return default
        return value

    def str_list(self, section: Mapping[str, Any], name: str, key: str,
                 default: tuple[str, ...]) -> tuple[str, ...]:
        value = section.get(key)
        if value is None:
            return default
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.errs.add(f"{name}.{key}", "must be a list of strings")
            return default
        return tuple(value)

    def integer(self, section: Mapping[str, Any], name: str, key: str, default: int,
                lo: int, hi: int) -> int:
        value = section.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            self.errs.add(f"{name}.{key}", f"must be a whole number, got {value!r}")
            return default
        if not lo <= value <= hi:
            self.errs.add(f"{name}.{key}", f"must be between {lo} and {hi}, got {value}")
            return default
        return value

    def number(self, section: Mapping[str, Any], name: str, key: str, default: float) -> float:
        value = section.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.errs.add(f"{name}.{key}", f"must be a number, got {value!r}")
            return default
        if value <= 0:
            self.errs.add(f"{name}.{key}", f"must be positive, got {value}")
            return default
        return float(value)

    def duration(self, section: Mapping[str, Any], name: str, key: str, default: float) -> float:
        if key not in section:
            return default
        try:
            seconds = parse_duration(section[key])
        except DurationError as exc:
            self.errs.add(f"{name}.{key}", str(exc))
            return default
        if seconds <= 0:
            self.errs.add(f"{name}.{key}", "must be positive")
            return default
        return seconds

    def path_value(self, value: str, base: str | None = None) -> str:
        if not value:
            return ""
        value = os.path.expanduser(value)
        return os.path.normpath(os.path.join(base or self.base_dir, value))

    def path(self, section: Mapping[str, Any], name: str, key: str, default: str,
             base: str | None = None) -> str:
        return self.path_value(self.string(section, name, key, default), base)

    def boolean(self, section: Mapping[str, Any], name: str, key: str, default: bool) -> bool:
        value = section.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.errs.add(f"{name}.{key}", "must be true or false")
            return default
        return value

    def binary(self, section: Mapping[str, Any], name: str, more: tuple[str, ...] = ()) -> BinaryConfig:
        self.unknown(section, name, ("binary_path", "extra_args", *more))
        raw = section.get("binary_path")
        command: tuple[str, ...] = ()
        if raw is None or raw == "":
            command = ()
        elif isinstance(raw, str):
            command = (self._command_path(raw),)
        elif isinstance(raw, list) and raw and all(isinstance(v, str) and v for v in raw):
            command = (self._command_path(raw[0]), *raw[1:])
        else:
            self.errs.add(f"{name}.binary_path", "must be a path or a non-empty list of strings")
        extra = self.args(section, name, "extra_args")
        return BinaryConfig(command=command, extra_args=extra)

    def args(self, section: Mapping[str, Any], name: str, key: str) -> tuple[str, ...]:
        """Program arguments: a list of strings, or one shell-style string split with ``shlex``
        (``"-ngl 99 --flash-attn"`` is three arguments, as on a command line)."""
        value = section.get(key)
        if isinstance(value, str):
            try:
                return tuple(shlex.split(value))
            except ValueError as exc:
                self.errs.add(f"{name}.{key}", f"cannot be split like a command line: {exc}")
                return ()
        return self.str_list(section, name, key, ())

    def _command_path(self, value: str) -> str:
        # A bare program name is looked up on PATH at start; a relative path
        # with a directory part resolves against the config file.
        if os.sep in value or value.startswith("."):
            return self.path_value(value)
        return value


__all__ = ["Errors", "Reader", "did_you_mean", "section_of"]
