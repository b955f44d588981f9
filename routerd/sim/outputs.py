"""Deterministic answers: the same (weights label, input) always gives the same output."""

from __future__ import annotations

import base64
import hashlib
import math
import struct
import zlib

__all__ = [
    "WORDS",
    "digest",
    "embedding_vector",
    "generate_tokens",
    "music_plan",
    "music_wav",
    "png_b64",
    "speech_seconds",
    "speech_wav",
    "png_image",
    "transcript",
]

WORDS: tuple[str, ...] = (
    "amber", "basalt", "cobalt", "delta", "ember", "fjord", "glacier", "harbor",
    "indigo", "juniper", "kestrel", "lantern", "meadow", "nebula", "orchard", "pebble",
    "quartz", "river", "saffron", "timber", "umbra", "valley", "willow", "xenon",
    "yarrow", "zephyr", "anchor", "beacon", "cedar", "dune", "echo", "falcon",
    "granite", "heron", "island", "jasper", "kelp", "lumen", "maple", "nickel",
    "opal", "prairie", "quill", "raven", "summit", "tundra", "updraft", "vortex",
    "walnut", "yonder", "zenith", "aurora", "bramble", "canyon", "drift", "estuary",
    "fern", "grove", "hollow", "ivory", "jetty", "knoll", "ledger", "mosaic",
)


def digest(label: str, *parts: str | bytes) -> bytes:
    """sha256 over the weights label and the input parts, unambiguously separated."""
    h = hashlib.sha256()
    for part in (label, *parts):
        raw = part.encode("utf-8") if isinstance(part, str) else part
        h.update(struct.pack(">Q", len(raw)))
        h.update(raw)
    return h.digest()


def _stream(seed: bytes, index: int) -> bytes:
    return hashlib.sha256(seed + struct.pack(">Q", index)).digest()


def generate_tokens(label: str, prompt: str, count: int) -> list[str]:
    """``count`` tokens of generated text; joined they form the answer ("w1 w2 w3")."""
    seed = digest(label, "text", prompt)
    tokens: list[str] = []
    for i in range(count):
        word = WORDS[int.from_bytes(_stream(seed, i)[:4], "big") % len(WORDS)]
        tokens.append(word if i == 0 else " " + word)
    return tokens


def embedding_vector(label: str, text: str, dim: int) -> list[float]:
    """A unit vector of ``dim`` floats derived from sha256(label, text)."""
    seed = digest(label, "embedding", text)
    values = []
    for i in range(dim):
        raw = int.from_bytes(_stream(seed, i)[:8], "big")
        values.append(raw / float(1 << 63) - 1.0)  # in [-1, 1)
    norm = math.sqrt(sum(v * v for v in values))
    if norm == 0.0:
        return [1.0] + [0.0] * (dim - 1)
    return [v / norm for v in values]


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def png_image(label: str, prompt: str, index: int = 0, size: int = 8) -> bytes:
    """A small solid-colour RGB PNG whose colour comes from sha256(label, prompt, index)."""
    colour = digest(label, "image", prompt, str(index))[:3]
    row = b"\x00" + colour * size  # filter byte 0, then RGB pixels
    raw = row * size
    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", zlib.compress(raw))
        + _png_chunk(b"IEND", b"")
    )


def png_b64(label: str, prompt: str, index: int = 0) -> str:
    return base64.b64encode(png_image(label, prompt, index)).decode("ascii")


def transcript(label: str, audio: bytes, duration: float) -> str:
    """Text for an audio clip: about 2.5 words a second, chosen by sha256(label, audio)."""
    count = max(1, round(duration * 2.5))
    audio_id = hashlib.sha256(audio).hexdigest()
    words = "".join(generate_tokens(label, f"stt:{audio_id}:{duration:.3f}", count))
    return words[:1].upper() + words[1:] + "."


#: Spoken words per second of synthesised speech.
SPEECH_WORDS_PER_S = 2.5
SPEECH_RATE = 8000


def speech_seconds(text: str) -> float:
    """Length of the clip a text is spoken in: 2.5 words a second, at least 0.4 s."""
    return max(0.4, len(text.split()) / SPEECH_WORDS_PER_S)


def speech_wav(label: str, text: str, voice: str = "") -> bytes:
    """A small valid WAV (8 kHz, 16-bit mono) speaking ``text``: a square tone whose pitch comes
    from sha256(label, voice, text), so different weights or inputs give different audio."""
    seed = digest(label, "speech", voice, text)
    frequency = 200 + int.from_bytes(seed[:2], "big") % 600
    frames = round(speech_seconds(text) * SPEECH_RATE)
    period = max(2, SPEECH_RATE // frequency)
    high, low = struct.pack("<h", 6000), struct.pack("<h", -6000)
    data = b"".join(high if (i % period) < period // 2 else low for i in range(frames))
    fmt = struct.pack("<HHIIHH", 1, 1, SPEECH_RATE, SPEECH_RATE * 2, 2, 16)
    body = (b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
            + b"data" + struct.pack("<I", len(data)) + data)
    return b"RIFF" + struct.pack("<I", len(body)) + body


#: Longest clip the simulator writes for a music request (the payload stays small).
MUSIC_CLIP_MAX_S = 2.0
_KEYS = ("C", "D", "E", "F", "G", "A", "B")


def music_plan(label: str, caption: str, lyrics: str) -> dict[str, object]:
    """What KoboldCpp's music planner fills in for a caption: tempo, key, time signature and
    audio codes, chosen by sha256(label, caption, lyrics)."""
    seed = digest(label, "music-plan", caption, lyrics)
    return {
        "bpm": 60 + seed[0] % 120,
        "keyscale": f"{_KEYS[seed[1] % len(_KEYS)]} {'major' if seed[2] % 2 else 'minor'}",
        "timesignature": str(2 + seed[3] % 3),
        "audio_codes": ",".join(str(b) for b in seed[4:12]),
    }


def music_wav(label: str, fields: str, seconds: float) -> bytes:
    """A small valid WAV (8 kHz, 16-bit mono, at most :data:`MUSIC_CLIP_MAX_S`) for a music
    request: a two-tone square wave whose pitches come from sha256(label, fields), so different
    weights or inputs give different audio."""
    seed = digest(label, "music", fields)
    low_hz = 110 + int.from_bytes(seed[:2], "big") % 330
    high_hz = 440 + int.from_bytes(seed[2:4], "big") % 440
    frames = max(1, round(min(seconds, MUSIC_CLIP_MAX_S) * SPEECH_RATE))
    half = frames // 2
    up, down = struct.pack("<h", 5000), struct.pack("<h", -5000)

    def tone(count: int, hz: int) -> bytes:
        period = max(2, SPEECH_RATE // hz)
        return b"".join(up if (i % period) < period // 2 else down for i in range(count))

    data = tone(half, low_hz) + tone(frames - half, high_hz)
    fmt = struct.pack("<HHIIHH", 1, 1, SPEECH_RATE, SPEECH_RATE * 2, 2, 16)
    body = (b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
            + b"data" + struct.pack("<I", len(data)) + data)
    return b"RIFF" + struct.pack("<I", len(body)) + body
