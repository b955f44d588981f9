"""Streaming OpenAI SSE -> Ollama NDJSON (routerd.routing.adapters.ollama.SSEToNDJSON)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import ollama
import pytest
from hypothesis import given
from hypothesis import strategies as st
from ollama._types import ChatResponse, GenerateResponse

from routerd.routing.adapters.ollama import SSEToNDJSON, iso_utc, ollama_chat_to_openai

T0 = 1714564800.0


def fake_clock(step: float = 0.5) -> Callable[[], float]:
    """Epoch seconds that advance by ``step`` on every call, starting at T0."""
    ticks = iter(range(1_000_000))

    def clock() -> float:
        return T0 + step * next(ticks)

    return clock


def sse(*payloads: Any, done: bool = True, sep: bytes = b"\n\n") -> bytes:
    out = b""
    for p in payloads:
        out += b"data: " + (p if isinstance(p, bytes) else json.dumps(p).encode()) + sep
    if done:
        out += b"data: [DONE]" + sep
    return out


def chat_chunk(content: str | None = None, finish: str | None = None, **delta: Any) -> dict[str, Any]:
    d: dict[str, Any] = dict(delta)
    if content is not None:
        d["content"] = content
    return {
        "object": "chat.completion.chunk",
        "model": "local-id",
        "choices": [{"index": 0, "delta": d, "finish_reason": finish}],
    }


def text_chunk(text: str, finish: str | None = None) -> dict[str, Any]:
    return {"object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": finish}]}


USAGE = {
    "choices": [],
    "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11},
    "timings": {"prompt_n": 9, "prompt_ms": 3.0, "predicted_n": 2, "predicted_ms": 8.0},
}

CHAT_STREAM = sse(
    chat_chunk(None, role="assistant"),
    chat_chunk("Hel"),
    chat_chunk("lo ✓"),
    chat_chunk(None, finish="stop"),
    USAGE,
)


def lines(data: bytes) -> list[dict[str, Any]]:
    assert data == b"" or data.endswith(b"\n")
    return [json.loads(line) for line in data.splitlines()]


def run(stream: bytes, mode: str = "chat", chunks: list[int] | None = None) -> bytes:
    conv = SSEToNDJSON(mode, "public", fake_clock())  # type: ignore[arg-type]
    out = b""
    if chunks is None:
        out += conv.feed(stream)
    else:
        pos = 0
        for size in chunks:
            out += conv.feed(stream[pos : pos + size])
            pos += size
        out += conv.feed(stream[pos:])
    return out + conv.flush()


def test_chat_stream_gives_one_line_per_content_delta_then_done_line() -> None:
    records = lines(run(CHAT_STREAM))
    assert [r["done"] for r in records] == [False, False, True]
    assert records[0] == {
        "model": "public",
        "created_at": iso_utc(T0 + 0.5),
        "message": {"role": "assistant", "content": "Hel"},
        "done": False,
    }
    assert records[1]["message"]["content"] == "lo ✓"
    final = records[2]
    assert final["message"] == {"role": "assistant", "content": ""}
    assert final["done_reason"] == "stop"
    assert (final["prompt_eval_count"], final["eval_count"]) == (9, 2)
    assert (final["prompt_eval_duration"], final["eval_duration"]) == (3_000_000, 8_000_000)
    assert final["total_duration"] == 1_500_000_000  # three clock steps after construction
    assert final["load_duration"] == 0
    for r in records:
        ChatResponse(**r)


def test_stream_total_counts_from_the_request_arrival_and_carries_its_load() -> None:
    conv = SSEToNDJSON("chat", "public", fake_clock(), started=T0 - 2.0, load_ns=1_250_000_000)
    final = lines(conv.feed(CHAT_STREAM) + conv.flush())[-1]
    assert final["total_duration"] == 3_500_000_000  # 2 s before construction + three clock steps
    assert final["load_duration"] == 1_250_000_000
    # the backend's own timings still give the evaluation durations
    assert (final["prompt_eval_duration"], final["eval_duration"]) == (3_000_000, 8_000_000)


def test_generate_stream_gives_response_lines_and_done_line_with_context() -> None:
    stream = sse(text_chunk("4"), text_chunk("2", finish="length"), USAGE)
    records = lines(run(stream, "generate"))
    assert [r.get("response") for r in records] == ["4", "2", ""]
    assert records[0]["done"] is False
    assert records[-1]["done"] is True
    assert records[-1]["done_reason"] == "length"
    assert records[-1]["context"] == []
    assert records[-1]["eval_count"] == 2
    for r in records:
        GenerateResponse(**r)


def test_generate_mode_accepts_chat_chunks_for_image_requests() -> None:
    records = lines(run(sse(chat_chunk("a cat"), chat_chunk(None, finish="stop")), "generate"))
    assert [r["response"] for r in records] == ["a cat", ""]


def test_each_line_is_emitted_as_soon_as_its_frame_completes() -> None:
    conv = SSEToNDJSON("chat", "public", fake_clock())
    frame = sse(chat_chunk("Hi"), done=False)
    assert conv.feed(frame[:-1]) == b""  # blank line not yet complete
    out = conv.feed(frame[-1:])
    assert lines(out)[0]["message"]["content"] == "Hi"
    assert conv.feed(sse(chat_chunk(None, finish="stop"), done=False)) == b""  # waits for usage / [DONE]
    final = lines(conv.feed(b"data: [DONE]\n\n"))
    assert final[0]["done"] is True
    assert conv.finished
    assert conv.feed(b"data: ignored\n\n") == b"" and conv.flush() == b""


def test_stream_ending_after_finish_without_done_marker_still_gets_done_line_at_flush() -> None:
    records = lines(run(sse(chat_chunk("x"), chat_chunk(None, finish="stop"), USAGE, done=False)))
    assert records[-1]["done"] is True and records[-1]["eval_count"] == 2


def test_stream_cut_before_finish_ends_with_error_line() -> None:
    records = lines(run(sse(chat_chunk("partial"), done=False)))
    assert records[0]["message"]["content"] == "partial"
    assert "error" in records[-1] and "done" not in records[-1]


def test_counts_without_usage_fall_back_to_clock_durations() -> None:
    records = lines(run(sse(chat_chunk("a"), chat_chunk("b", finish="stop"))))
    final = records[-1]
    assert (final["prompt_eval_count"], final["eval_count"]) == (0, 0)
    # first token at tick 1, done at tick 3, ticks are 0.5 s apart
    assert final["prompt_eval_duration"] == 500_000_000
    assert final["eval_duration"] == 1_000_000_000


def test_crlf_line_endings_comments_and_non_json_data_are_handled() -> None:
    stream = (
        b": keep-alive\r\n\r\n"
        + sse(chat_chunk("one"), done=False, sep=b"\r\n\r\n")
        + b"data: not json\r\n\r\n"
        + sse(chat_chunk("two", finish="stop"), sep=b"\r\n\r\n")
    )
    records = lines(run(stream))
    assert [r["message"]["content"] for r in records] == ["one", "two", ""]


def test_multi_line_data_fields_are_joined() -> None:
    payload = json.dumps(chat_chunk("joined", finish="stop"), indent=1).encode()
    stream = b"".join(b"data: " + line + b"\n" for line in payload.splitlines()) + b"\n" + b"data: [DONE]\n\n"
    records = lines(run(stream))
    assert records[0]["message"]["content"] == "joined"


def test_error_object_in_stream_becomes_error_line_and_ends_stream() -> None:
    err = {"error": {"code": 500, "message": "out of memory", "type": "server_error"}}
    records = lines(run(sse(chat_chunk("a"), err, chat_chunk("never"))))
    assert records == [records[0], {"error": "out of memory"}]


def test_llama_server_error_event_line_becomes_error_line() -> None:
    stream = b'error: {"code": 400, "message": "prompt too long", "type": "invalid_request_error"}\n\n'
    assert lines(run(stream)) == [{"error": "prompt too long"}]


def test_plain_json_error_body_instead_of_sse_becomes_error_line() -> None:
    body = b'{"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}'
    assert lines(run(body, chunks=[3, 10])) == [{"error": "Loading model"}]


def test_plain_json_answer_instead_of_sse_is_replayed_as_delta_and_done() -> None:
    body = json.dumps(
        {
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "whole"}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1},
        }
    ).encode()
    records = lines(run(body))
    assert records[0]["message"]["content"] == "whole"
    assert records[1]["done"] is True and records[1]["eval_count"] == 1


def test_empty_backend_body_becomes_error_line() -> None:
    assert "error" in lines(run(b""))[0]


def test_oversized_frame_becomes_error_line() -> None:
    conv = SSEToNDJSON("chat", "public", fake_clock(), max_frame_bytes=64)
    out = conv.feed(b"data: " + b"x" * 100)
    assert lines(out) == [{"error": "backend stream frame too large"}]
    assert conv.finished


def test_streamed_tool_call_fragments_are_assembled_into_one_message() -> None:
    stream = sse(
        chat_chunk(
            None, tool_calls=[{"index": 0, "id": "c", "function": {"name": "weather", "arguments": ""}}]
        ),
        chat_chunk(None, tool_calls=[{"index": 0, "function": {"arguments": '{"city":'}}]),
        chat_chunk(None, tool_calls=[{"index": 0, "function": {"arguments": '"Oslo"}'}}]),
        chat_chunk(None, finish="tool_calls"),
    )
    records = lines(run(stream))
    assert records[0]["message"]["tool_calls"] == [
        {"function": {"name": "weather", "arguments": {"city": "Oslo"}}}
    ]
    assert records[1]["done"] is True and records[1]["done_reason"] == "stop"
    ChatResponse(**records[0])


def test_reasoning_content_deltas_become_thinking() -> None:
    records = lines(run(sse(chat_chunk(None, reasoning_content="hmm"), chat_chunk("ok", finish="stop"))))
    assert records[0]["message"] == {"role": "assistant", "content": "", "thinking": "hmm"}


def test_unknown_mode_is_rejected() -> None:
    with pytest.raises(ValueError):
        SSEToNDJSON("embed", "m", fake_clock())  # type: ignore[arg-type]


STREAMS = [
    CHAT_STREAM,
    sse(chat_chunk("a"), {"error": {"message": "boom"}}),
    b"\r\n" + sse(chat_chunk("é€𝄞"), chat_chunk("z", finish="length"), sep=b"\r\n\r\n"),
    b'{"error": {"message": "not sse"}}',
    sse(chat_chunk("cut"), done=False),
]


@given(
    index=st.integers(min_value=0, max_value=len(STREAMS) - 1),
    cuts=st.lists(st.integers(min_value=0, max_value=len(CHAT_STREAM)), max_size=25),
)
def test_arbitrary_chunk_splits_give_the_same_output(index: int, cuts: list[int]) -> None:
    stream = STREAMS[index]
    points = sorted({c for c in cuts if c <= len(stream)})
    sizes = [b - a for a, b in zip([0, *points], points, strict=False)]
    assert run(stream, chunks=sizes) == run(stream)


def test_byte_at_a_time_feeding_gives_the_same_output() -> None:
    for stream in STREAMS:
        assert run(stream, chunks=[1] * len(stream)) == run(stream)


def test_real_client_consumes_converted_stream() -> None:
    """The ollama python client, over a mock transport, reads the NDJSON as a chat stream."""

    def handler(request: httpx.Request) -> httpx.Response:
        _, body = ollama_chat_to_openai(json.loads(request.content))
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
        conv = SSEToNDJSON("chat", "public", fake_clock())

        def ndjson() -> Iterator[bytes]:
            for i in range(0, len(CHAT_STREAM), 7):
                yield conv.feed(CHAT_STREAM[i : i + 7])
            yield conv.flush()

        return httpx.Response(
            200, content=b"".join(ndjson()), headers={"Content-Type": "application/x-ndjson"}
        )

    client = ollama.Client(host="http://ollama.test", transport=httpx.MockTransport(handler))
    parts = list(client.chat(model="public", messages=[{"role": "user", "content": "hi"}], stream=True))
    assert "".join(p.message.content or "" for p in parts) == "Hello ✓"
    assert parts[-1].done is True and parts[-1].eval_count == 2


def test_real_client_raises_on_error_line_in_stream() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        conv = SSEToNDJSON("generate", "public", fake_clock())
        out = conv.feed(sse(text_chunk("a"), {"error": {"message": "kaboom"}})) + conv.flush()
        return httpx.Response(200, content=out)

    client = ollama.Client(host="http://ollama.test", transport=httpx.MockTransport(handler))
    with pytest.raises(ollama.ResponseError) as info:
        list(client.generate(model="public", prompt="x", stream=True))
    assert info.value.error == "kaboom"
