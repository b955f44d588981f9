"""Measured inputs that hold against real backends: token counts from a stream's final
``usage`` (nested or not) or llama-server ``timings``, read with the shared SSE parser; audio
durations of WAV, FLAC, MP3 and WebM uploads from a real audio library (and EBML for WebM)."""

from __future__ import annotations

import json
import struct

import pytest

from routerd.routing.audio import audio_duration
from routerd.routing.sse import Event, EventParser, parse_events
from routerd.routing.work import usage_from_json, usage_from_tail
from routerd.sim.wav import make_wav


def _sse(*payloads: object) -> bytes:
    return b"".join(b"data: " + json.dumps(p).encode() + b"\n\n" for p in payloads) + b"data: [DONE]\n\n"


def test_a_nested_usage_object_is_read_from_a_stream_tail() -> None:
    """Current llama-server adds prompt_tokens_details: a flat-object regex never matched it."""
    tail = _sse({"choices": [{"delta": {"content": "hi"}}]},
                {"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19,
                                          "prompt_tokens_details": {"cached_tokens": 3}}})
    assert usage_from_tail(tail) == (12, 7)


def test_timings_count_when_no_usage_is_sent() -> None:
    tail = _sse({"choices": [{"delta": {}, "finish_reason": "stop"}],
                 "timings": {"prompt_n": 30, "predicted_n": 9, "predicted_ms": 100.0}})
    assert usage_from_tail(tail) == (30, 9)
    assert usage_from_json({"timings": {"prompt_n": 1, "predicted_n": 2}}) == (1, 2)


def test_timings_count_the_prompt_tokens_the_cache_served_too() -> None:
    """llama-server's ``timings.prompt_n`` leaves out the prompt tokens its cache served
    (``cache_n``); its ``usage.prompt_tokens`` counts them: a stream without usage said 1 where
    the same request answered whole said 67 (tests/integration/test_real_timing.py)."""
    tail = _sse({"choices": [{"delta": {}, "finish_reason": "length"}],
                 "timings": {"cache_n": 66, "prompt_n": 1, "predicted_n": 24}})
    assert usage_from_tail(tail) == (67, 24)
    assert usage_from_json({"timings": {"cache_n": 66, "prompt_n": 1, "predicted_n": 24}}) == (67, 24)
    assert usage_from_json({"timings": {"cache_n": None, "prompt_n": 3, "predicted_n": 2}}) == (3, 2)
    both = {"usage": {"prompt_tokens": 67, "completion_tokens": 24}, "timings": {"cache_n": 66, "prompt_n": 1,
                                                                                  "predicted_n": 24}}
    assert usage_from_json(both) == (67, 24)


def test_a_tail_that_starts_inside_an_event_still_finds_the_last_usage() -> None:
    whole = _sse({"usage": {"prompt_tokens": 1, "completion_tokens": 1}},
                 {"choices": [{"delta": {"content": "x" * 50}}]},
                 {"usage": {"prompt_tokens": 5, "completion_tokens": 6}})
    assert usage_from_tail(whole[20:]) == (5, 6)
    assert usage_from_tail(b'data: {"choices": []}\n\n') is None


def test_the_sse_parser_does_not_depend_on_chunk_boundaries() -> None:
    body = b'event: x\r\ndata: {"a":\r\ndata: 1}\r\n\r\n: keep-alive\n\nerror: {"e": 1}\n\ndata: tail'
    whole = parse_events(body)
    parser = EventParser()
    split = [e for i in range(len(body)) for e in parser.feed(body[i:i + 1])]
    last = parser.end()
    assert whole == split + ([last] if last else [])
    assert whole == [Event("x", '{"a":\n1}'), Event("error", '{"e": 1}'), Event("", "tail")]


def _flac(seconds: float, rate: int = 16000) -> bytes:
    total = int(seconds * rate)
    # STREAMINFO: min/max block size (16 bits each), min/max frame size (24 bits each), ...
    head = struct.pack(">HH", 4096, 4096) + b"\x00\x00\x00" + b"\x00\x00\x00"
    packed = (rate << 44) | (0 << 41) | (15 << 36) | total  # rate 20, channels-1 3, bps-1 5, samples 36
    info = head + packed.to_bytes(8, "big") + b"\x00" * 16
    return b"fLaC" + bytes([0x80]) + len(info).to_bytes(3, "big") + info


def _mp3(frames: int) -> bytes:
    frame = b"\xff\xfb\x90\x64" + b"\x00" * 413  # MPEG-1 layer III, 128 kbit/s, 44.1 kHz: 417 bytes
    return frame * frames


def _ebml(element: int, body: bytes) -> bytes:
    ident = element.to_bytes((element.bit_length() + 7) // 8, "big")
    return ident + (0x01 << 56 | len(body)).to_bytes(8, "big") + body


def _webm(seconds: float) -> bytes:
    info = _ebml(0x2AD7B1, (1_000_000).to_bytes(3, "big")) + _ebml(0x4489, struct.pack(">d", seconds * 1000))
    header = _ebml(0x1A45DFA3, _ebml(0x4282, b"webm"))
    return header + _ebml(0x18538067, _ebml(0x1549A966, info) + _ebml(0x1F43B675, b"\x00" * 16))


@pytest.mark.parametrize("name,data,seconds", [
    ("clip.wav", make_wav(2.5), 2.5),
    ("clip.flac", _flac(3.0), 3.0),
    ("clip.mp3", _mp3(40), 40 * 1152 / 44100),
    ("clip.webm", _webm(4.25), 4.25),
])
def test_audio_duration_reads_each_format(name: str, data: bytes, seconds: float) -> None:
    assert audio_duration(data, name) == pytest.approx(seconds, rel=0.05)


def test_an_unreadable_upload_counts_as_zero_seconds() -> None:
    assert audio_duration(b"not audio at all", "x.bin") == 0.0
    assert audio_duration(b"\x1a\x45\xdf\xa3\xff", "broken.webm") == 0.0
