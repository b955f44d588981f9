"""Fault and timing knobs that can be changed live through ``/sim/control``."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

__all__ = ["ControlError", "Counters", "Knobs", "apply_control", "snapshot"]

CONTROL_KEYS = ("fail_next_load", "crash_after", "slowdown", "hang")


class ControlError(ValueError):
    """A ``/sim/control`` body that cannot be applied."""


@attrs.define
class Knobs:
    """``crash_after`` counts requests still to serve before the process exits (None: never)."""

    fail_next_load: bool = False
    crash_after: int | None = None
    slowdown: float = 1.0
    hang: bool = False


@attrs.define
class Counters:
    requests_served: int = 0
    in_flight: int = 0
    running: int = 0
    waiting: int = 0


def apply_control(knobs: Knobs, body: object) -> None:
    """Validate the whole body first, then change the knobs it names (all or nothing)."""
    if not isinstance(body, Mapping):
        raise ControlError("expected a JSON object")
    unknown = sorted(set(body) - set(CONTROL_KEYS))
    if unknown:
        raise ControlError(f"unknown control keys: {', '.join(map(str, unknown))}")
    changes: dict[str, object] = {}
    for key in ("fail_next_load", "hang"):
        if key in body:
            if not isinstance(body[key], bool):
                raise ControlError(f"{key!r} must be a boolean")
            changes[key] = body[key]
    if "crash_after" in body:
        value = body["crash_after"]
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ControlError("'crash_after' must be a non-negative integer or null")
        changes["crash_after"] = value
    if "slowdown" in body:
        value = body["slowdown"]
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ControlError("'slowdown' must be a positive number")
        changes["slowdown"] = float(value)
    for key, value in changes.items():
        setattr(knobs, key, value)


def snapshot(knobs: Knobs, counters: Counters) -> dict[str, object]:
    return {**attrs.asdict(knobs), **attrs.asdict(counters)}
