"""An answer's header index: built by C calls alone when every name is spelled as one seen before
and none is given twice, else by ``index_fields``; both give the same index for any fields."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from routerd.clients.backend_headers import AnswerHeaders, index_fields
from routerd.header_names import lowered

_NAMES = st.sampled_from([b"Content-Type", b"content-type", b"CONTENT-TYPE", b"Content-Length",
                          b"X-Routerd-Node", b"x-routerd-node", b"Server", b"Date", b"X-Odd-Name",
                          b"Transfer-Encoding", b""])
_FIELDS = st.lists(st.tuples(_NAMES, st.binary(max_size=6)), max_size=8)


@settings(max_examples=300, deadline=None)
@given(fields=_FIELDS, seen=st.booleans())
def test_the_index_is_index_fields_whatever_the_names(fields: list[tuple[bytes, bytes]], seen: bool) -> None:
    flat = [part for field in fields for part in field]
    if seen:  # every spelling seen before: the C path, unless a name comes twice
        for name, _value in fields:
            lowered(name)
    headers = AnswerHeaders(flat)
    expected = index_fields(flat)
    assert [(name, list(values)) for name, values in headers.by_name.items()] == \
        [(name, list(values)) for name, values in expected.items()]
    for name, _value in fields:
        assert headers.getRawHeaders(name) == list(expected[name.lower()])
    assert headers.getRawHeaders(b"X-Not-Sent") is None
