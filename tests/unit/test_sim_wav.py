"""routerd.sim.wav: silent clips and durations read from WAV headers."""

from __future__ import annotations

import struct

import pytest

from routerd.sim.wav import make_wav, parse_wav, wav_duration


def _wav(fmt: bytes, chunks: list[tuple[bytes, bytes]]) -> bytes:
    body = b"WAVE" + struct.pack("<4sI", b"fmt ", len(fmt)) + fmt
    for chunk_id, data in chunks:
        body += struct.pack("<4sI", chunk_id, len(data)) + data + (b"\0" if len(data) % 2 else b"")
    return struct.pack("<4sI", b"RIFF", len(body)) + body


def _fmt(channels: int, rate: int, bits: int) -> bytes:
    align = channels * bits // 8
    return struct.pack("<HHIIHH", 1, channels, rate, rate * align, align, bits)


@pytest.mark.parametrize("seconds", [0.0, 0.5, 1.0, 2.25, 10.0])
def test_make_wav_round_trips_its_duration(seconds: float) -> None:
    assert wav_duration(make_wav(seconds)) == pytest.approx(seconds)


def test_make_wav_is_silent_16_bit_mono_pcm_at_the_given_rate() -> None:
    data = make_wav(0.5, rate=8000)
    info = parse_wav(data)
    assert (info.channels, info.rate, info.bits_per_sample) == (1, 8000, 16)
    assert info.data_bytes == 8000
    assert data[-info.data_bytes:] == bytes(info.data_bytes)
    assert struct.unpack_from("<I", data, 4)[0] == len(data) - 8  # RIFF size field


def test_duration_uses_rate_channels_and_sample_width() -> None:
    # 1 s of 8-bit stereo at 22050 Hz = 44100 bytes
    data = _wav(_fmt(2, 22050, 8), [(b"data", bytes(44100))])
    assert wav_duration(data) == pytest.approx(1.0)


def test_duration_skips_other_chunks_including_odd_sized_ones() -> None:
    data = _wav(_fmt(1, 16000, 16), [(b"LIST", b"abc"), (b"data", bytes(32000))])
    assert wav_duration(data) == pytest.approx(1.0)


def test_duration_trusts_bytes_present_over_a_placeholder_size() -> None:
    fmt = _fmt(1, 16000, 16)
    body = b"WAVE" + struct.pack("<4sI", b"fmt ", len(fmt)) + fmt
    body += struct.pack("<4sI", b"data", 0xFFFFFFFF) + bytes(16000)
    data = struct.pack("<4sI", b"RIFF", 0xFFFFFFFF) + body
    assert wav_duration(data) == pytest.approx(0.5)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"RIFF",
        b"not a wav file at all, just text",
        b"RIFF\x00\x00\x00\x00AVI LIST",
        _wav(_fmt(1, 16000, 16), [(b"LIST", b"no data chunk")]),
        _wav(_fmt(0, 16000, 16), [(b"data", bytes(10))]),
        struct.pack("<4sI4s", b"RIFF", 12, b"WAVE") + struct.pack("<4sI", b"data", 4) + b"abcd",
    ],
    ids=["empty", "short", "text", "avi", "no-data", "zero-channels", "data-before-fmt"],
)
def test_wav_duration_rejects_non_wav_input_with_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        wav_duration(data)


def test_make_wav_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        make_wav(-1.0)
    with pytest.raises(ValueError):
        make_wav(1.0, rate=0)
