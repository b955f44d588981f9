"""Audio for the speech-to-text backends: a plain tone, the same bytes every run."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np

SAMPLE_RATE = 16_000
"""whisper.cpp's rate: 16 kHz mono, 16-bit PCM."""

TONE_HZ = 440.0
AMPLITUDE = 0.3


def write_tone_wav(path: str | Path, seconds: float = 2.0) -> Path:
    """Write ``seconds`` of a 440 Hz sine as a 16 kHz mono 16-bit WAV to ``path`` and return it."""
    path = Path(path)
    frames = round(seconds * SAMPLE_RATE)
    times = np.arange(frames, dtype=np.float64) / SAMPLE_RATE
    samples = np.round(AMPLITUDE * 32767 * np.sin(2 * np.pi * TONE_HZ * times)).astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(SAMPLE_RATE)
        out.writeframes(samples.tobytes())
    return path
