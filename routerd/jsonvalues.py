"""Reading loosely typed JSON values (request bodies, backend answers)."""

from __future__ import annotations


def json_int(value: object) -> int | None:
    """A JSON integer (or an integral float) as ``int``; ``None`` for anything else, booleans included."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None
