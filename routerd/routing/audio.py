"""The duration of an uploaded audio clip (the STT work term), read with a real audio library.

WAV, MP3, OGG (Vorbis, Opus, FLAC), FLAC and M4A/MP4 are read by ``mutagen`` from their
headers; WebM/Matroska (which mutagen does not read) from its EBML ``Segment/Info/Duration``.
A clip whose length cannot be read counts as 0 s (and is logged).
"""

from __future__ import annotations

import io
import struct

import mutagen
from twisted.logger import Logger

__all__ = ["audio_duration", "webm_duration"]

log = Logger()

_EBML = 0x1A45DFA3
_SEGMENT = 0x18538067
_INFO = 0x1549A966
_TIMECODE_SCALE = 0x2AD7B1
_DURATION = 0x4489
_UNKNOWN_SIZE = -1


def audio_duration(data: bytes, filename: str = "") -> float:
    """Seconds of audio in ``data`` (0.0 when no reader knows the format)."""
    if data[:4] == b"\x1a\x45\xdf\xa3":
        seconds = webm_duration(data)
    else:
        seconds = _mutagen_duration(data)
    if seconds is None:
        log.info("audio upload {filename} ({size} bytes): duration unknown, counted as 0 s",
                 filename=filename or "-", size=len(data))
        return 0.0
    return seconds


def _mutagen_duration(data: bytes) -> float | None:
    try:
        parsed = mutagen.File(io.BytesIO(data))
    except Exception:  # noqa: BLE001 - any unreadable upload is "unknown", never a failed request
        return None
    length = getattr(getattr(parsed, "info", None), "length", None)
    if not isinstance(length, int | float) or length < 0:
        return None
    return float(length)


def _vint(data: bytes, pos: int, keep_marker: bool) -> tuple[int, int]:
    """An EBML variable-length integer at ``pos``: (value, next position); ValueError if bad."""
    if pos >= len(data):
        raise ValueError("truncated")
    first = data[pos]
    width = 1
    while width <= 8 and not first & (0x80 >> (width - 1)):
        width += 1
    if width > 8 or pos + width > len(data):
        raise ValueError("bad vint")
    value = first if keep_marker else first & (0xFF >> width)
    for byte in data[pos + 1:pos + width]:
        value = (value << 8) | byte
    if not keep_marker and value == (1 << (7 * width)) - 1:
        value = _UNKNOWN_SIZE
    return value, pos + width


def webm_duration(data: bytes) -> float | None:
    """Seconds from a WebM/Matroska header (``Info/Duration`` × ``TimecodeScale``), or None."""
    try:
        return _webm(data)
    except (ValueError, struct.error):
        return None


def _webm(data: bytes) -> float | None:
    pos, end = 0, len(data)
    while pos < end:
        element, pos = _vint(data, pos, True)
        size, pos = _vint(data, pos, False)
        if element == _SEGMENT:
            end = len(data) if size == _UNKNOWN_SIZE else min(len(data), pos + size)
            continue  # walk the segment's children
        if size == _UNKNOWN_SIZE:
            return None
        if element == _INFO:
            return _info(data[pos:pos + size])
        pos += size
    return None


def _info(data: bytes) -> float | None:
    pos, scale, duration = 0, 1_000_000, None
    while pos < len(data):
        element, pos = _vint(data, pos, True)
        size, pos = _vint(data, pos, False)
        body = data[pos:pos + size]
        if element == _TIMECODE_SCALE and 0 < size <= 8:
            scale = int.from_bytes(body, "big")
        elif element == _DURATION and size in (4, 8):
            duration = struct.unpack(">f" if size == 4 else ">d", body)[0]
        pos += size
    if duration is None or duration < 0:
        return None
    return float(duration) * scale / 1e9
