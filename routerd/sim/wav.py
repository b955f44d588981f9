"""Minimal WAV (RIFF/PCM) helpers for the simulator: build silent clips and read their length
(the simulated whisper-server's timing).  routerd itself measures uploads with
``routerd.routing.audio`` (a real audio library)."""

from __future__ import annotations

import struct

import attrs

__all__ = ["WavInfo", "make_wav", "parse_wav", "wav_duration"]

_RIFF_HEADER = struct.Struct("<4sI4s")
_CHUNK_HEADER = struct.Struct("<4sI")
_FMT_BODY = struct.Struct("<HHIIHH")

@attrs.frozen
class WavInfo:
    """What the header of a WAV file says about its audio."""

    channels: int
    rate: int
    bits_per_sample: int
    data_bytes: int

    @property
    def duration(self) -> float:
        """Seconds of audio: data bytes / (rate x channels x bytes per sample)."""
        bytes_per_sample = max(1, self.bits_per_sample // 8)
        return self.data_bytes / (self.rate * self.channels * bytes_per_sample)


def parse_wav(data: bytes) -> WavInfo:
    """Read the format and data size of a RIFF/WAVE file; ValueError if it is not one."""
    if len(data) < _RIFF_HEADER.size:
        raise ValueError("not a WAV file: too short")
    riff, _size, wave = _RIFF_HEADER.unpack_from(data, 0)
    if riff != b"RIFF" or wave != b"WAVE":
        raise ValueError("not a WAV file: missing RIFF/WAVE header")
    offset = _RIFF_HEADER.size
    fmt: tuple[int, int, int] | None = None
    while offset + _CHUNK_HEADER.size <= len(data):
        chunk_id, chunk_size = _CHUNK_HEADER.unpack_from(data, offset)
        body_start = offset + _CHUNK_HEADER.size
        if chunk_id == b"fmt ":
            if chunk_size < _FMT_BODY.size or body_start + _FMT_BODY.size > len(data):
                raise ValueError("not a WAV file: truncated fmt chunk")
            _tag, channels, rate, _byte_rate, _align, bits = _FMT_BODY.unpack_from(data, body_start)
            if channels <= 0 or rate <= 0 or bits <= 0:
                raise ValueError("not a WAV file: invalid fmt chunk")
            fmt = (channels, rate, bits)
        elif chunk_id == b"data":
            if fmt is None:
                raise ValueError("not a WAV file: data chunk before fmt chunk")
            # Streamed files may carry a placeholder size; trust the bytes actually present.
            available = len(data) - body_start
            return WavInfo(fmt[0], fmt[1], fmt[2], min(chunk_size, available))
        # Chunks are padded to an even length.
        offset = body_start + chunk_size + (chunk_size & 1)
    raise ValueError("not a WAV file: no data chunk")


def wav_duration(data: bytes) -> float:
    """Seconds of audio in a WAV file; ValueError if ``data`` is not a WAV file."""
    return parse_wav(data).duration


def make_wav(seconds: float, rate: int = 16000) -> bytes:
    """A silent 16-bit mono PCM WAV clip lasting ``seconds``."""
    if seconds < 0:
        raise ValueError("seconds must not be negative")
    if rate <= 0:
        raise ValueError("rate must be positive")
    channels, bits = 1, 16
    block_align = channels * bits // 8
    frames = round(seconds * rate)
    data = bytes(frames * block_align)
    fmt = _FMT_BODY.pack(1, channels, rate, rate * block_align, block_align, bits)
    body = (
        b"WAVE"
        + _CHUNK_HEADER.pack(b"fmt ", len(fmt))
        + fmt
        + _CHUNK_HEADER.pack(b"data", len(data))
        + data
    )
    return _CHUNK_HEADER.pack(b"RIFF", len(body)) + body
