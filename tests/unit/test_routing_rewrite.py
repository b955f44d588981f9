"""Answer model-ID rewriting: buffered JSON, and incremental SSE / NDJSON streams."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routerd.routing.rewrite import (
    Rewriter,
    make_rewriter,
    object_members,
    rewrite_json_model,
    rewrite_kind,
)

TABLE = {"local-a": "pub-a", "ü-local": "pub-ü", "x": "x-2"}


def mapping(old: str) -> str | None:
    return TABLE.get(old)


def never(old: str) -> str | None:
    return None


def run(rewriter: Rewriter, chunks: list[bytes]) -> bytes:
    return b"".join(rewriter.feed(c) for c in chunks) + rewriter.flush()


def whole(content_type: str, data: bytes, **kw: int) -> bytes:
    return run(make_rewriter(content_type, mapping, **kw), [data])


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(max(c, 0), len(data)) for c in cuts})
    chunks, last = [], 0
    for p in points:
        chunks.append(data[last:p])
        last = p
    chunks.append(data[last:])
    return chunks


# --------------------------------------------------------------------------- kinds


@pytest.mark.parametrize(
    ("content_type", "kind"),
    [
        ("application/json", "json"),
        ("Application/JSON; charset=utf-8", "json"),
        ("application/problem+json", "json"),
        ("text/event-stream", "sse"),
        ("text/event-stream; charset=utf-8", "sse"),
        ("application/x-ndjson", "ndjson"),
        ("application/ndjson", "ndjson"),
        ("text/plain", "identity"),
        ("audio/wav", "identity"),
        ("", "identity"),
        (None, "identity"),
    ],
)
def test_content_type_selects_the_rewriter(content_type: str | None, kind: str) -> None:
    assert rewrite_kind(content_type) == kind
    assert make_rewriter(content_type, mapping).kind == kind


def test_identity_rewriter_passes_everything_through_immediately() -> None:
    r = make_rewriter("audio/wav", mapping)
    assert r.feed(b'{"model": "local-a"}') == b'{"model": "local-a"}'
    assert r.flush() == b""


# --------------------------------------------------------------------------- buffered JSON


def test_json_top_level_model_is_rewritten_and_nothing_else_changes() -> None:
    body = (
        b'{"id":"c1", "model" :\t"local-a","choices":[{"model":"local-a","x":1.50e2}],'
        b'"usage":{"model":"local-a"}, "note":"caf\\u00e9 <b>"}'
    )
    assert rewrite_json_model(body, mapping) == body.replace(b'"model" :\t"local-a"', b'"model" :\t"pub-a"')


def test_json_unicode_model_ids_are_rewritten() -> None:
    out = rewrite_json_model('{"model": "ü-local", "t": "ñ"}'.encode(), mapping)
    assert json.loads(out) == {"model": "pub-ü", "t": "ñ"}


def test_json_is_byte_identical_when_mapping_returns_none() -> None:
    body = b'{"model": "local-a", "n": 1.0}'
    assert rewrite_json_model(body, never) is body
    assert run(make_rewriter("application/json", never), [body[:5], body[5:]]) == body


@pytest.mark.parametrize(
    "body",
    [
        b"not json at all",
        b'{"model": "local-a"',  # truncated
        b'["model", "local-a"]',  # not an object
        b'{"model": 5}',  # not a string
        b'{"data": {"model": "local-a"}}',  # nested only
        b'{"model": "local-a"} trailing',
        b'\xff{"model": "local-a"}',
        b"",
    ],
)
def test_json_that_cannot_or_need_not_be_rewritten_passes_unchanged(body: bytes) -> None:
    assert rewrite_json_model(body, mapping) == body
    assert whole("application/json", body) == body


def test_json_rewriter_buffers_until_flush() -> None:
    r = make_rewriter("application/json", mapping)
    assert r.feed(b'{"model": ') == b""
    assert r.feed(b'"local-a"}') == b""
    assert r.flush() == b'{"model": "pub-a"}'


def test_json_over_the_cap_passes_through_unchanged() -> None:
    body = b'{"model": "local-a", "pad": "' + b"p" * 100 + b'"}'
    r = make_rewriter("application/json", mapping, max_json_bytes=50)
    out = r.feed(body[:40])
    assert out == b""
    out += r.feed(body[40:])
    assert out == body
    assert r.feed(b"more") == b"more"
    assert r.flush() == b""


def test_json_duplicate_top_level_model_keys_are_all_rewritten() -> None:
    body = b'{"model":"x","model":"local-a"}'
    assert rewrite_json_model(body, mapping) == b'{"model":"x-2","model":"pub-a"}'


def test_object_members_reports_value_spans() -> None:
    text = ' {"a": [1, {"b": 2}], "model": "m" } '
    members, brace = object_members(text)
    assert brace == 1
    assert [(m.key, text[m.start : m.end]) for m in members] == [("a", '[1, {"b": 2}]'), ("model", '"m"')]


# --------------------------------------------------------------------------- SSE


def chat_chunk(model: str, content: str = "hi") -> bytes:
    return json.dumps({"id": "c", "model": model, "choices": [{"delta": {"content": content}}]}).encode()


def test_sse_data_lines_rewritten_and_done_comments_events_kept() -> None:
    stream = (
        b": keep-alive comment\n"
        b"event: message\n"
        b"data: " + chat_chunk("local-a") + b"\n\n"
        b"data:" + chat_chunk("local-a") + b"\r\n\r\n"
        b"data: [DONE]\n\n"
    )
    out = whole("text/event-stream", stream)
    assert out == stream.replace(b'"model": "local-a"', b'"model": "pub-a"')
    assert out.count(b'"pub-a"') == 2
    assert b"data: [DONE]\n\n" in out
    assert b": keep-alive comment\n" in out


def test_sse_non_json_data_line_is_passed_through_not_dropped() -> None:
    stream = b'data: {"model": "local-a", oops\n\ndata: plain "model" text\n\n'
    assert whole("text/event-stream", stream) == stream


def test_sse_only_the_top_level_model_is_rewritten() -> None:
    line = b'data: {"x": {"model": "local-a"}, "model": "other"}\n'
    assert whole("text/event-stream", line) == line


def test_sse_is_byte_identical_when_mapping_returns_none() -> None:
    stream = b"data: " + chat_chunk("local-a") + b"\n\ndata: [DONE]\n\n"
    assert run(make_rewriter("text/event-stream", never), [stream]) == stream


def test_sse_emits_each_line_as_soon_as_its_terminator_arrives() -> None:
    r = make_rewriter("text/event-stream", mapping)
    first = b"data: " + chat_chunk("local-a")
    assert r.feed(first[:10]) == b""
    assert r.feed(first[10:]) == b""
    out = r.feed(b"\n\ndata: " + chat_chunk("local-a")[:7])
    assert out == b"data: " + chat_chunk("pub-a") + b"\n\n"
    assert r.feed(chat_chunk("local-a")[7:] + b"\n") == b"data: " + chat_chunk("pub-a") + b"\n"
    assert r.flush() == b""


def test_sse_cr_split_from_lf_gives_the_same_output() -> None:
    line = b"data: " + chat_chunk("local-a") + b"\r\n"
    r = make_rewriter("text/event-stream", mapping)
    out = r.feed(line[:-1])  # ends in \r: the line is complete already
    assert out == b"data: " + chat_chunk("pub-a") + b"\r"
    out += r.feed(b"\n") + r.flush()
    assert out == whole("text/event-stream", line)


def test_sse_unterminated_last_line_is_rewritten_on_flush() -> None:
    r = make_rewriter("text/event-stream", mapping)
    assert r.feed(b"data: " + chat_chunk("local-a")) == b""
    assert r.flush() == b"data: " + chat_chunk("pub-a")


def test_sse_line_over_the_cap_passes_through_unchanged() -> None:
    long_line = b"data: " + chat_chunk("local-a", "z" * 200) + b"\n"
    short_line = b"data: " + chat_chunk("local-a") + b"\n"
    stream = long_line + short_line
    expected = long_line + b"data: " + chat_chunk("pub-a") + b"\n"
    assert whole("text/event-stream", stream, max_line_bytes=120) == expected
    chunks = [stream[i : i + 7] for i in range(0, len(stream), 7)]
    assert run(make_rewriter("text/event-stream", mapping, max_line_bytes=120), chunks) == expected


# --------------------------------------------------------------------------- NDJSON


def test_ndjson_records_rewritten_error_records_unchanged() -> None:
    stream = (
        b'{"model":"local-a","message":{"content":"h"},"done":false}\n'
        b'{"error":"model \\"local-a\\" failed"}\n'
        b'{"model":"local-a","done":true,"total_duration":12}\r\n'
    )
    out = whole("application/x-ndjson", stream)
    lines = out.split(b"\n")
    assert lines[0] == b'{"model":"pub-a","message":{"content":"h"},"done":false}'
    assert lines[1] == b'{"error":"model \\"local-a\\" failed"}'
    assert lines[2] == b'{"model":"pub-a","done":true,"total_duration":12}\r'
    assert lines[3] == b""


def test_ndjson_non_json_line_and_unknown_model_pass_unchanged() -> None:
    stream = b'garbage "model"\n{"model":"unknown"}\n'
    assert whole("application/ndjson", stream) == stream


def test_ndjson_emits_each_record_when_its_newline_arrives() -> None:
    r = make_rewriter("application/x-ndjson", mapping)
    assert r.feed(b'{"model":"local-a"}') == b""
    assert r.feed(b'\n{"model"') == b'{"model":"pub-a"}\n'
    assert r.feed(b':"x"}') == b""
    assert r.flush() == b'{"model":"x-2"}'


# --------------------------------------------------------------------------- split invariance

_models = st.sampled_from(["local-a", "ü-local", "x", "unmapped", "日本-model"])
_json_line = st.builds(
    lambda m, c, nested: json.dumps(
        {"model": m, "choices": [{"delta": {"content": c}}], "meta": {"model": nested}},
        ensure_ascii=False,
    ).encode(),
    _models,
    st.text(max_size=12),
    _models,
)
_sse_line = st.one_of(
    _json_line.map(lambda b: b"data: " + b),
    _json_line.map(lambda b: b"data:" + b),
    st.just(b"data: [DONE]"),
    st.just(b": comment with \"model\""),
    st.just(b"event: delta"),
    st.just(b"id: 7"),
    st.just(b""),
    st.just(b'data: {"model": "local-a", broken'),
    st.just(b"data: \xff\xfe not utf-8 \"model\""),
)
_sse_term = st.sampled_from([b"\n", b"\r\n", b"\r"])
_ndjson_line = st.one_of(
    _json_line,
    _json_line.map(lambda b: b + b"\r"),
    st.just(b'{"error": "boom"}'),
    st.just(b'not json "model"'),
    st.just(b""),
)


def _stream(lines: list[bytes], terms: list[bytes], trailing: bool) -> bytes:
    out = b"".join(line + term for line, term in zip(lines, terms, strict=False))
    return out if trailing else out.rstrip(b"\r\n")


@settings(max_examples=300, deadline=None)
@given(
    lines=st.lists(st.tuples(_sse_line, _sse_term), max_size=12),
    trailing=st.booleans(),
    cuts=st.lists(st.integers(0, 4000), max_size=30),
    cap=st.one_of(st.just(16 * 1024 * 1024), st.integers(1, 150)),
)
def test_sse_any_chunking_gives_the_same_output_as_whole(
    lines: list[tuple[bytes, bytes]], trailing: bool, cuts: list[int], cap: int
) -> None:
    data = _stream([line for line, _ in lines], [t for _, t in lines], trailing)
    expected = run(make_rewriter("text/event-stream", mapping, max_line_bytes=cap), [data])
    chunks = split_at(data, cuts)
    assert run(make_rewriter("text/event-stream", mapping, max_line_bytes=cap), chunks) == expected
    one_byte = [data[i : i + 1] for i in range(len(data))]
    assert run(make_rewriter("text/event-stream", mapping, max_line_bytes=cap), one_byte) == expected


@settings(max_examples=300, deadline=None)
@given(
    lines=st.lists(_ndjson_line, max_size=12),
    trailing=st.booleans(),
    cuts=st.lists(st.integers(0, 4000), max_size=30),
    cap=st.one_of(st.just(16 * 1024 * 1024), st.integers(1, 150)),
)
def test_ndjson_any_chunking_gives_the_same_output_as_whole(
    lines: list[bytes], trailing: bool, cuts: list[int], cap: int
) -> None:
    data = _stream(lines, [b"\n"] * len(lines), trailing)
    expected = run(make_rewriter("application/x-ndjson", mapping, max_line_bytes=cap), [data])
    chunks = split_at(data, cuts)
    assert run(make_rewriter("application/x-ndjson", mapping, max_line_bytes=cap), chunks) == expected
    one_byte = [data[i : i + 1] for i in range(len(data))]
    assert run(make_rewriter("application/x-ndjson", mapping, max_line_bytes=cap), one_byte) == expected


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(st.tuples(_sse_line, _sse_term), max_size=12), cuts=st.lists(st.integers(0, 4000)))
def test_sse_output_is_identical_to_input_when_mapping_returns_none(
    lines: list[tuple[bytes, bytes]], cuts: list[int]
) -> None:
    data = _stream([line for line, _ in lines], [t for _, t in lines], True)
    assert run(make_rewriter("text/event-stream", never), split_at(data, cuts)) == data


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(_sse_line, max_size=12))
def test_sse_rewrites_exactly_the_mapped_top_level_models(lines: list[bytes]) -> None:
    data = b"".join(line + b"\n" for line in lines)
    out_lines = whole("text/event-stream", data).split(b"\n")[:-1]
    assert len(out_lines) == len(lines)
    for before, after in zip(lines, out_lines, strict=True):
        if before.startswith(b"data:") and before != b"data: [DONE]":
            payload = before[5:]
            try:
                obj = json.loads(payload)
            except ValueError:
                assert after == before
                continue
            expected = dict(obj)
            expected["model"] = TABLE.get(obj["model"], obj["model"])
            assert json.loads(after[5:]) == expected
        else:
            assert after == before


@settings(max_examples=200, deadline=None)
@given(body=_json_line, cuts=st.lists(st.integers(0, 400), max_size=10))
def test_json_any_chunking_gives_the_same_output_as_whole(body: bytes, cuts: list[int]) -> None:
    expected = whole("application/json", body)
    assert run(make_rewriter("application/json", mapping), split_at(body, cuts)) == expected
    model = json.loads(body)["model"]
    assert json.loads(expected)["model"] == TABLE.get(model, model)


def test_only_top_level_model_keys_are_rewritten_whatever_strings_and_brackets_precede_them() -> None:
    """The fast top-level scan (issue 14) is not fooled by ``"model"`` inside strings, nested
    objects, escaped quotes or brackets inside strings, and leaves invalid JSON alone."""
    from routerd.routing.rewrite import rewrite_json_model

    def to_p(_old: str) -> str:
        return "P"

    cases = {
        b'{"model":"a","x":{"model":"b"}}': b'{"model":"P","x":{"model":"b"}}',
        b'{"a":"\\"model\\"","model" : "z", "model":1}': b'{"a":"\\"model\\"","model" : "P", "model":1}',
        b'{"a":"x \\"model", "model":"z"}': b'{"a":"x \\"model", "model":"P"}',
        b'{"s":"]}{[","model":"q","model":"r"}': b'{"s":"]}{[","model":"P","model":"P"}',
        b'[{"model":"a"}]': b'[{"model":"a"}]',
        b'{"model":"a"': b'{"model":"a"',
    }
    for body, expected in cases.items():
        assert rewrite_json_model(body, to_p) == expected, body


def test_a_body_whose_every_model_the_mapping_leaves_is_returned_without_decoding() -> None:
    """The no-change fast path (issue 14) answers the same as the full scan: unchanged when every
    ``"model"`` maps to itself, and still rewrites when only one of several needs it."""
    from routerd.routing.rewrite import rewrite_json_model

    def same_but_b(old: str) -> str:
        return "B2" if old == "b" else old

    cases = {
        b'{"model":"a","x":{"model":"a"}}': b'{"model":"a","x":{"model":"a"}}',
        b'{"model":"a" not json': b'{"model":"a" not json',
        b'{"x":{"model":"a"},"model":"b"}': b'{"x":{"model":"a"},"model":"B2"}',
        b'{"model":"a\\u0062","model":"b"}': b'{"model":"a\\u0062","model":"B2"}',
    }
    for body, expected in cases.items():
        assert rewrite_json_model(body, same_but_b) == expected, body


def test_a_block_of_sse_lines_whose_models_all_stay_passes_through_untouched_and_a_mixed_one_is_rewritten(
) -> None:
    """The stream fast path: a read of many events whose ``model`` values the mapping leaves as
    they are is passed on unchanged; one event that must change still changes."""
    def public(old: str) -> str | None:
        return "public" if old == "local" else None

    same = b"".join(b'data: {"model":"public","n":%d}\n\n' % i for i in range(20))
    assert make_rewriter("text/event-stream", public).feed(same) == same
    mixed = same + b'data: {"model":"local","n":99}\n\n'
    out = make_rewriter("text/event-stream", public).feed(mixed)
    assert out == same + b'data: {"model":"public","n":99}\n\n'
