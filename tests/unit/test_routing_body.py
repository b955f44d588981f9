"""``json_loads`` decodes a body once where ``json.loads`` would sniff its encoding: for any bytes
it must give what ``json.loads`` gives, the same value or the same error."""

from __future__ import annotations

import codecs
import json
import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from routerd.routing.body import json_loads, json_loads_text

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
ENCODINGS = st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32",
                             "utf-32-le", "utf-32-be"])


def _outcome(loads: Any, raw: bytes | str) -> tuple[str, Any]:
    try:
        value = loads(raw)
    except Exception as exc:  # noqa: BLE001 - the error itself is compared
        return type(exc).__name__, str(exc)
    return "value", json.dumps(value, sort_keys=True)


@st.composite
def documents(draw: st.DrawFn) -> bytes:
    """Well-formed JSON in every encoding json.loads sniffs, cut or mangled sometimes, and bytes
    that open like an object and go on at random."""
    kind = draw(st.sampled_from(["encoded", "mangled", "random"]))
    if kind == "random":
        return b"{" + draw(st.binary(max_size=12))
    text = json.dumps(draw(JSON_VALUES), ensure_ascii=draw(st.booleans()))
    raw = text.encode(draw(ENCODINGS))
    if kind == "mangled" and raw:
        at = draw(st.integers(0, len(raw) - 1))
        raw = raw[:at] + draw(st.binary(max_size=3)) + raw[at + 1:]
    return raw


@settings(max_examples=500, deadline=None)
@given(raw=documents())
def test_json_loads_is_json_loads(raw: bytes) -> None:
    assert _outcome(json_loads, raw) == _outcome(json.loads, raw)


def test_edges_of_the_sniff() -> None:
    for raw in (b"{", b"{\x00", b"{\x00\x00", b'{\x00"\x00}\x00', b"{}", b'{"a":1}', b"{\xff}",
                b'{"\xed\xa0\x80":1}', codecs.BOM_UTF8 + b"{}", b"[1]", b"", b" {}", b'{"x": NaN}'):
        assert _outcome(json_loads, raw) == _outcome(json.loads, raw), raw
    assert math.isnan(json_loads(b'{"x": NaN}')["x"])


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(
    st.builds(lambda value, bom: ("\ufeff" if bom else "") + json.dumps(value), JSON_VALUES, st.booleans()),
    st.text(max_size=16)))
def test_json_loads_text_is_json_loads(text: str) -> None:
    assert _outcome(json_loads_text, text) == _outcome(json.loads, text)
