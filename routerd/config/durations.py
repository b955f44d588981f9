"""Duration strings (``500ms``, ``1.5s``, ``1m``, ``1h30m``, ``720h``) to seconds and back."""

from __future__ import annotations

import re

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


class DurationError(ValueError):
    """A duration string that does not parse."""


def parse_duration(text: object) -> float:
    """Parse a Go-style duration string into seconds.

    Bare numbers are refused: a duration must say its unit, so ``30`` is
    never silently read as 30 seconds or 30 milliseconds.
    """
    if isinstance(text, bool) or not isinstance(text, str):
        raise DurationError(f"expected a duration string such as '30s', got {text!r}")
    s = text.strip()
    if not s:
        raise DurationError("empty duration")
    sign = 1.0
    if s[0] in "+-":
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    pos = 0
    total = 0.0
    while pos < len(s):
        m = _PART.match(s, pos)
        if m is None:
            raise DurationError(f"invalid duration {text!r} (use units ms, s, m, h, e.g. '1.5s')")
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos == 0:
        raise DurationError(f"invalid duration {text!r}")
    return sign * total


def format_duration(seconds: float) -> str:
    """Canonical form, Go style: ``1.5s``, ``1m0s``, ``720h0m0s``, ``500ms``."""
    if seconds == 0:
        return "0s"
    neg = seconds < 0
    seconds = abs(seconds)
    if seconds < 1:
        ms = round(seconds * 1000, 6)
        text = f"{ms:g}ms"
    else:
        hours = int(seconds // 3600)
        rest = seconds - hours * 3600
        minutes = int(rest // 60)
        secs = round(rest - minutes * 60, 9)
        text = ""
        if hours:
            text += f"{hours}h"
        if hours or minutes:
            text += f"{minutes}m"
        text += f"{secs:g}s"
    return "-" + text if neg else text
