"""Model selector extraction (priority, errors) and request-body model replacement."""

from __future__ import annotations

import json

import pytest

from routerd.routing.classify import Route, classify
from routerd.routing.multipart import Part, build_form, parse_form
from routerd.routing.selector import (
    SelectorError,
    SelectorResult,
    parse_json_object,
    replace_model,
    select_model,
)

JSON = "application/json"
FORM_CT = "multipart/form-data; boundary=bnd"


def route(path: str) -> Route:
    r = classify("POST", path)
    assert r is not None
    return r


CHAT = route("/v1/chat/completions")
EMBED = route("/v1/embeddings")
STT = route("/v1/audio/transcriptions")
IMAGE = route("/v1/images/generations")
TXT2IMG = route("/sdapi/v1/txt2img")
OLLAMA_GEN = route("/api/generate")


def sel(
    r: Route,
    body: bytes = b"",
    content_type: str = JSON,
    query: dict[str, list[str]] | None = None,
    headers: dict[str, str] | None = None,
) -> SelectorResult:
    return select_model(r, body, content_type, query or {}, headers or {})


def form(*fields: tuple[str, bytes], filename_for: str = "file") -> bytes:
    parts = [
        Part(name=n, data=d, filename="a.wav" if n == filename_for else None,
             content_type="audio/wav" if n == filename_for else None)
        for n, d in fields
    ]
    return build_form(parts, b"bnd")


# --------------------------------------------------------------------------- selection


def test_json_model_beats_query_and_header() -> None:
    result = sel(CHAT, b'{"model": "a"}', query={"model": ["b"]}, headers={"X-Routerd-Model": "c"})
    assert (result.model, result.source) == ("a", "json")
    assert result.payload == {"model": "a"}


def test_query_model_beats_header_when_body_has_none() -> None:
    result = sel(CHAT, b'{"messages": []}', query={"model": ["", "b"]}, headers={"X-Routerd-Model": "c"})
    assert (result.model, result.source) == ("b", "query")


def test_header_is_last_and_case_insensitive() -> None:
    result = sel(CHAT, b"{}", headers={"x-routerd-model": " c "})
    assert (result.model, result.source) == ("c", "header")


def test_empty_or_null_json_model_counts_as_absent() -> None:
    assert sel(CHAT, b'{"model": ""}', query={"model": ["q"]}).model == "q"
    assert sel(CHAT, b'{"model": null}', query={"model": ["q"]}).model == "q"


@pytest.mark.parametrize("value", ["1", "true", "[\"a\"]", "{\"id\": \"a\"}"])
def test_non_string_json_model_is_rejected(value: str) -> None:
    with pytest.raises(SelectorError) as info:
        sel(CHAT, b'{"model": ' + value.encode() + b"}", query={"model": ["q"]})
    assert info.value.message == "model must be a string"
    assert info.value.status == 400


def test_required_model_missing_is_400_model_is_required() -> None:
    for r in (CHAT, OLLAMA_GEN, route("/v1/completions"), route("/api/chat")):
        with pytest.raises(SelectorError) as info:
            sel(r, b'{"prompt": "hi"}')
        assert info.value.message == "model is required"
        assert info.value.status == 400


def test_optional_model_missing_gives_none_with_payload() -> None:
    result = sel(EMBED, b'{"input": "x"}')
    assert result.model is None and result.source is None
    assert result.payload == {"input": "x"}


def test_empty_body_is_not_parsed_and_selector_falls_back() -> None:
    assert sel(EMBED, b"").payload is None
    assert sel(CHAT, b"  ", query={"model": ["q"]}).model == "q"


def test_json_body_is_parsed_whatever_the_content_type_says() -> None:
    result = sel(CHAT, b'{"model": "a"}', content_type="application/x-www-form-urlencoded")
    assert result.model == "a"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "invalid JSON body: "),
        (b"\xff\xfe", "invalid JSON body: "),
        (b"[" * 100000, "invalid JSON body: "),
        (b'["a"]', "request body must be a JSON object"),
        (b'"model"', "request body must be a JSON object"),
    ],
)
def test_bad_json_bodies_raise_selector_error(body: bytes, message: str) -> None:
    with pytest.raises(SelectorError) as info:
        parse_json_object(body)
    assert info.value.message.startswith(message)
    with pytest.raises(SelectorError):
        sel(EMBED, body)


def test_multipart_model_field_is_used_for_audio() -> None:
    body = form(("file", b"RIFF...."), ("model", b"whisper-1"))
    result = sel(STT, body, FORM_CT, query={"model": ["q"]}, headers={"X-Routerd-Model": "h"})
    assert (result.model, result.source) == ("whisper-1", "form")
    assert result.payload is None
    assert result.form is not None and [p.name for p in result.form] == ["file", "model"]


def test_multipart_without_model_falls_back_to_query_then_header() -> None:
    body = form(("file", b"RIFF"))
    assert sel(STT, body, FORM_CT, query={"model": ["q"]}).source == "query"
    assert sel(STT, body, FORM_CT, headers={"X-Routerd-Model": "h"}).source == "header"
    assert sel(STT, body, FORM_CT).model is None  # STT may be selector-less


def test_bad_multipart_is_a_selector_error() -> None:
    with pytest.raises(SelectorError) as info:
        sel(STT, b"--bnd\r\nbroken", FORM_CT)
    assert info.value.message.startswith("invalid multipart body: ")


def test_non_utf8_multipart_model_is_rejected() -> None:
    with pytest.raises(SelectorError, match="model must be a string"):
        sel(STT, form(("model", b"\xff")), FORM_CT)


def test_image_reads_sd_model_checkpoint_places_in_order() -> None:
    both = b'{"sd_model_checkpoint": "a", "override_settings": {"sd_model_checkpoint": "b"}}'
    assert (sel(TXT2IMG, both).model, sel(TXT2IMG, both).source) == ("a", "sd_model_checkpoint")
    override = b'{"override_settings": {"sd_model_checkpoint": "b"}}'
    assert (sel(TXT2IMG, override).model, sel(TXT2IMG, override).source) == ("b", "override_settings")
    with_model = b'{"model": "m", "sd_model_checkpoint": "a"}'
    assert sel(IMAGE, with_model).model == "m"
    query = sel(IMAGE, b"{}", query={"sd_model_checkpoint": ["s"]})
    assert (query.model, query.source) == ("s", "query_sd_model_checkpoint")


def test_sd_model_checkpoint_is_ignored_on_text_routes() -> None:
    assert sel(EMBED, b'{"sd_model_checkpoint": "a"}').model is None


def test_non_string_sd_model_checkpoint_is_rejected() -> None:
    with pytest.raises(SelectorError, match="sd_model_checkpoint must be a string"):
        sel(TXT2IMG, b'{"sd_model_checkpoint": 3}')
    with pytest.raises(SelectorError, match="override_settings.sd_model_checkpoint must be a string"):
        sel(TXT2IMG, b'{"override_settings": {"sd_model_checkpoint": 3}}')


# --------------------------------------------------------------------------- replacement


def test_replace_json_model_changes_only_the_model_bytes() -> None:
    body = b'{ "messages":[{"role":"user","content":"caf\\u00e9 1.10e3"}],\n "model" : "pub", "n": 1.50 }'
    out = replace_model(CHAT, body, JSON, "local-id")
    assert out == body.replace(b'"pub"', b'"local-id"')


def test_replace_json_model_inserts_model_when_absent() -> None:
    out = replace_model(CHAT, b'{"messages": []}', JSON, "loc")
    assert json.loads(out) == {"model": "loc", "messages": []}
    assert json.loads(replace_model(EMBED, b" {} ", JSON, "loc")) == {"model": "loc"}


def test_replace_json_model_escapes_the_new_value() -> None:
    out = replace_model(CHAT, b'{"model": "a"}', JSON, 'we"ird\\id')
    assert json.loads(out) == {"model": 'we"ird\\id'}


def test_replace_model_leaves_empty_body_unchanged() -> None:
    assert replace_model(CHAT, b"", JSON, "loc") == b""


def test_replace_model_rejects_bad_json() -> None:
    with pytest.raises(SelectorError):
        replace_model(CHAT, b"{oops", JSON, "loc")


def test_replace_image_model_only_where_equal_to_the_old_value() -> None:
    body = (
        b'{"model": "pub-img", "sd_model_checkpoint": "other",'
        b' "override_settings": {"sd_model_checkpoint": "pub-img", "x": 1}, "prompt": "cat"}'
    )
    out = replace_model(TXT2IMG, body, JSON, "loc-img")
    assert json.loads(out) == {
        "model": "loc-img",
        "sd_model_checkpoint": "other",
        "override_settings": {"sd_model_checkpoint": "loc-img", "x": 1},
        "prompt": "cat",
    }
    assert out == body.replace(b'"pub-img"', b'"loc-img"')


def test_replace_image_model_uses_explicit_old_value_from_query_or_header() -> None:
    body = b'{"sd_model_checkpoint": "pub", "prompt": "cat"}'
    assert replace_model(IMAGE, body, JSON, "loc", old_model="nope") == body
    assert json.loads(replace_model(IMAGE, body, JSON, "loc", old_model="pub")) == {
        "sd_model_checkpoint": "loc",
        "prompt": "cat",
    }


def test_replace_image_model_sets_model_when_body_names_none() -> None:
    out = replace_model(TXT2IMG, b'{"prompt": "cat"}', JSON, "loc", old_model="pub")
    assert json.loads(out) == {"model": "loc", "prompt": "cat"}


def test_replace_multipart_model_field_keeps_other_bytes_identical() -> None:
    audio = bytes(range(256)) * 4
    body = form(("file", audio), ("model", b"pub"), ("language", b"en"))
    out = replace_model(STT, body, FORM_CT, "local-whisper")
    assert out == body.replace(b"\r\n\r\npub\r\n", b"\r\n\r\nlocal-whisper\r\n")
    parts = parse_form(out, FORM_CT)
    assert [(p.name, p.data) for p in parts] == [
        ("file", audio), ("model", b"local-whisper"), ("language", b"en"),
    ]


def test_replace_multipart_appends_model_field_when_absent() -> None:
    body = form(("file", b"RIFF"), ("language", b"en"))
    out = replace_model(STT, body, FORM_CT, "loc")
    parts = parse_form(out, FORM_CT)
    assert [(p.name, p.data) for p in parts] == [("file", b"RIFF"), ("language", b"en"), ("model", b"loc")]
    assert out.startswith(body[: parts[1].end])
    empty = replace_model(STT, b"--bnd--\r\n", FORM_CT, "loc")
    assert [(p.name, p.data) for p in parse_form(empty, FORM_CT)] == [("model", b"loc")]


def test_replace_multipart_round_trips_through_the_selector() -> None:
    body = form(("model", b"pub"), ("file", b"RIFF"))
    out = replace_model(STT, body, FORM_CT, "loc")
    assert sel(STT, out, FORM_CT).model == "loc"
