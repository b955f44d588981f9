"""Minimal WAV (RIFF/PCM) helpers for the simulator: build silent clips (reading them is
``routerd.routing.audio``)."""

from __future__ import annotations

from routerd.routing.audio import _CHUNK_HEADER, _FMT_BODY, WavInfo, parse_wav, wav_duration

__all__ = ["WavInfo", "make_wav", "parse_wav", "wav_duration"]


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
