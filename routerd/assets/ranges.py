"""``Range`` header parsing for ``GET /router/v1/node/assets/{sha256}``: one ``bytes=`` range only."""

from __future__ import annotations

import re

import attrs

#: Positions of at most 19 digits (a 64-bit offset): a longer number is malformed, not a 500.
_SPEC = re.compile(r"^bytes=(\d{0,19})-(\d{0,19})$")


class RangeNotSatisfiable(ValueError):
    """416: several ranges, a malformed one, or one outside the file."""


@attrs.frozen
class ByteRange:
    start: int
    end: int  # inclusive

    @property
    def length(self) -> int:
        return self.end - self.start + 1

    def content_range(self, size: int) -> str:
        return f"bytes {self.start}-{self.end}/{size}"


def parse_range(header: str | None, size: int) -> ByteRange | None:
    """None for no header (the whole file); a :class:`ByteRange` for one satisfiable range
    (``a-b``, ``a-``, ``-n``; an end past the file is clipped); :class:`RangeNotSatisfiable`
    for anything else."""
    if header is None:
        return None
    value = header.strip().replace(" ", "")
    if "," in value:
        raise RangeNotSatisfiable("only one range is supported")
    found = _SPEC.fullmatch(value)
    if found is None:
        raise RangeNotSatisfiable(f"malformed range {header!r}")
    first, last = found.group(1), found.group(2)
    if not first and not last:
        raise RangeNotSatisfiable(f"malformed range {header!r}")
    if not first:
        count = int(last)
        if count == 0 or size == 0:
            raise RangeNotSatisfiable("empty suffix range")
        return ByteRange(max(0, size - count), size - 1)
    start = int(first)
    end = int(last) if last else size - 1
    if start >= size or end < start:
        raise RangeNotSatisfiable(f"range {header!r} is outside the file ({size} bytes)")
    return ByteRange(start, min(end, size - 1))


def parse_content_range(value: str | None) -> tuple[int, int, int] | None:
    """``bytes a-b/size`` → (a, b, size); None when absent or malformed."""
    if value is None:
        return None
    found = re.fullmatch(r"^bytes (\d+)-(\d+)/(\d+)$", value.strip())
    if found is None:
        return None
    return int(found.group(1)), int(found.group(2)), int(found.group(3))
