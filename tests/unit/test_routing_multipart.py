"""multipart/form-data parsing and building."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from routerd.routing.multipart import (
    MultipartError,
    Part,
    TooManyParts,
    boundary_of,
    build_form,
    is_multipart,
    make_boundary,
    parse_form,
)

CT = "multipart/form-data; boundary=XyZ"


def _body(*parts: bytes, boundary: bytes = b"XyZ") -> bytes:
    out = b""
    for p in parts:
        out += b"--" + boundary + b"\r\n" + p + b"\r\n"
    return out + b"--" + boundary + b"--\r\n"


def test_parses_fields_and_files_with_binary_data_untouched() -> None:
    audio = bytes(range(256)) + b"\r\n\r\n--Xy\r\n\n\r"
    body = _body(
        b'Content-Disposition: form-data; name="model"\r\n\r\nwhisper-small',
        b'Content-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        b"Content-Type: audio/wav\r\n\r\n" + audio,
    )
    parts = parse_form(body, CT)
    assert [p.name for p in parts] == ["model", "file"]
    assert parts[0].data == b"whisper-small"
    assert parts[0].filename is None and parts[0].content_type is None
    assert parts[1].filename == "a.wav"
    assert parts[1].content_type == "audio/wav"
    assert parts[1].data == audio
    # recorded offsets point at the data in the original body
    for p in parts:
        assert body[p.start : p.end] == p.data


def test_preamble_epilogue_quoted_boundary_and_header_case_are_accepted() -> None:
    body = (
        b"ignored preamble\r\n--a b\r\n"
        b'content-disposition: FORM-DATA; NAME="x;y"; filename="q\\"z.txt"\r\n\r\nv\r\n'
        b"--a b--\r\nepilogue"
    )
    parts = parse_form(body, 'multipart/form-data; boundary="a b"')
    assert parts == [Part(name="x;y", data=b"v", filename='q"z.txt')]


def test_rfc5987_filename_star_wins_over_plain_filename() -> None:
    body = _body(
        b"Content-Disposition: form-data; name=f; filename=plain.txt; "
        b"filename*=UTF-8''na%C3%AFve.txt\r\n\r\nx"
    )
    assert parse_form(body, CT)[0].filename == "naïve.txt"


def test_empty_form_parses_to_no_parts() -> None:
    assert parse_form(b"--XyZ--\r\n", CT) == []


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (_body(b'Content-Disposition: form-data; name="a"\r\n\r\nv'), "application/json"),
        (_body(b'Content-Disposition: form-data; name="a"\r\n\r\nv'), "multipart/form-data"),
        (b"no boundary here", CT),
        (b'--XyZ\r\nContent-Disposition: form-data; name="a"\r\n\r\ntruncated', CT),
        (b'--XyZ\r\nContent-Disposition: form-data; name="a"', CT),
        (_body(b"Content-Type: text/plain\r\n\r\nv"), CT),
        (_body(b"Content-Disposition: attachment; name=a\r\n\r\nv"), CT),
        (_body(b"Content-Disposition: form-data\r\n\r\nv"), CT),
        (_body(b"garbage header line\r\n\r\nv"), CT),
        (_body(b'Content-Disposition: form-data; name="a\r\n\r\nv'), CT),
        (b"--XyZjunk\r\n", CT),
    ],
)
def test_malformed_bodies_raise_multipart_error(body: bytes, content_type: str) -> None:
    with pytest.raises(MultipartError):
        parse_form(body, content_type)


def test_is_multipart_and_boundary_of() -> None:
    assert is_multipart("Multipart/Form-Data; boundary=x")
    assert not is_multipart("application/json")
    assert not is_multipart(None)
    assert boundary_of('multipart/form-data; charset=utf-8; boundary="b-1"') == b"b-1"
    with pytest.raises(MultipartError):
        boundary_of("multipart/form-data")


def test_build_form_rejects_bad_boundary_and_data_containing_the_delimiter() -> None:
    with pytest.raises(MultipartError):
        build_form([Part(name="a", data=b"x")], b"bad\nboundary")
    with pytest.raises(MultipartError):
        build_form([Part(name="a", data=b"x")], b"")
    with pytest.raises(MultipartError):
        build_form([Part(name="a", data=b"x\r\n--XyZ")], b"XyZ")


def test_build_form_accepts_str_boundary() -> None:
    parts = [Part(name="a", data=b"1")]
    assert build_form(parts, "XyZ") == build_form(parts, b"XyZ")


def test_make_boundary_is_usable_and_fresh() -> None:
    a, b = make_boundary(), make_boundary()
    assert a != b
    parts = [Part(name="n", data=b"v")]
    ct = "multipart/form-data; boundary=" + a.decode()
    assert parse_form(build_form(parts, a), ct) == parts


_names = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters='"\r\n'),
    min_size=1,
    max_size=20,
)
_parts = st.builds(
    Part,
    name=_names,
    data=st.binary(max_size=300),
    filename=st.none() | _names,
    content_type=st.none() | st.sampled_from(["audio/wav", "text/plain", "application/octet-stream"]),
)


@given(st.lists(_parts, max_size=6))
def test_build_then_parse_round_trips(parts: list[Part]) -> None:
    boundary = b"routerd-boundary-7f3a"
    body = build_form(parts, boundary)
    parsed = parse_form(body, "multipart/form-data; boundary=" + boundary.decode())
    assert parsed == parts
    for p in parsed:
        assert body[p.start : p.end] == p.data


# --------------------------------------------------------------------------- part-count limit


def _many(count: int) -> bytes:
    part = b'--XyZ\r\nContent-Disposition: form-data; name="f"\r\n\r\nx\r\n'
    return part * count + b"--XyZ--\r\n"


def test_a_form_past_the_part_limit_is_refused_before_the_parts_past_it_are_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from routerd.routing import multipart

    made: list[int] = []
    real = multipart._make_part

    def counted(*args: object, **kwargs: object) -> Part:
        made.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(multipart, "_make_part", counted)
    with pytest.raises(TooManyParts) as refused:
        parse_form(_many(140_000), CT, max_parts=64)
    assert isinstance(refused.value, MultipartError)
    assert "more than 64 parts" in str(refused.value)
    assert len(made) == 64  # the work stopped at the limit, not at the end of the body
    made.clear()
    assert len(parse_form(_many(64), CT, max_parts=64)) == 64  # at the limit: accepted
    assert len(made) == 64
    assert len(parse_form(_many(65), CT)) == 65  # no limit given: none applied


_safe_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-. ",
                      min_size=1, max_size=12).filter(lambda n: n.strip() == n)
_ref_parts = st.lists(st.tuples(_safe_names, st.none() | _safe_names, st.binary(max_size=200),
                                st.sampled_from(["Content-Disposition", "content-disposition"])),
                      max_size=10)


@given(parts=_ref_parts, preamble=st.sampled_from([b"", b"a preamble\r\n"]),
       epilogue=st.sampled_from([b"", b"epilogue bytes"]), limit=st.integers(1, 12))
def test_parse_form_agrees_with_the_multipart_package(parts: list[tuple[str, str | None, bytes, str]],
                                                      preamble: bytes, epilogue: bytes, limit: int) -> None:
    """The kept reference: the ``multipart`` package (treq's dependency) reads the same fields from
    the same generated bodies; the limit refuses exactly the forms with more parts than it."""
    import io

    import multipart as reference
    from hypothesis import assume

    boundary = b"gen-b0undary-Q"
    for _, _, data, _ in parts:
        assume(b"\r\n--" + boundary not in data + b"\r\n--" + boundary[:-1])
        assume((data + b"\r\n--" + boundary).find(b"\r\n--" + boundary) == len(data))
    chunks = []
    for name, filename, data, header in parts:
        disposition = f'{header}: form-data; name="{name}"'
        if filename is not None:
            disposition += f'; filename="{filename}"'
        chunks.append(b"--" + boundary + b"\r\n" + disposition.encode() + b"\r\n\r\n" + data + b"\r\n")
    body = preamble + b"".join(chunks) + b"--" + boundary + b"--\r\n" + epilogue
    ct = "multipart/form-data; boundary=" + boundary.decode()
    ours = parse_form(body, ct)
    theirs = list(reference.MultipartParser(io.BytesIO(body), boundary.decode(), content_length=len(body)))
    assert [(p.name, p.filename, p.data) for p in ours] == \
        [(p.name, p.filename or None, p.raw) for p in theirs]
    if len(parts) > limit:
        with pytest.raises(TooManyParts):
            parse_form(body, ct, max_parts=limit)
    else:
        assert parse_form(body, ct, max_parts=limit) == ours
