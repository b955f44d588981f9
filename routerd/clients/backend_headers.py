"""Header fields of the lean backend client (:mod:`routerd.clients.backend_http`, the transport):
an answer's headers as received, indexed once (:class:`AnswerHeaders`), and request headers made
once and shared, rendered for the wire when made (:class:`RequestHeaders`,
:func:`content_type_headers`).

Speed tricks here are the transport's (caches keyed on bytes, pre-rendered lines), each with what
it measured.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from twisted.web.http_headers import Headers

from routerd.header_names import LOWERED, lowered

__all__ = ["AnswerHeaders", "RequestHeaders", "content_type_headers", "index_fields", "request_lines"]

class AnswerHeaders:
    """An answer's header fields as received: the read side of twisted's ``Headers`` the request
    path uses (``getRawHeaders``, ``hasHeader``, ``getAllRawHeaders``), names matched without case
    (indexed once: a forwarded answer is asked for six names)."""

    __slots__ = ("_fields", "by_name")

    def __init__(self, fields: list[bytes]) -> None:
        """``fields``: each header's name and value in turn, as received."""
        self._fields = fields
        # Names spelled as before (a backend sends the same few) and none given twice: indexed
        # by C calls alone (ops.py, one client: 115 -> 58 opcodes an answer); any other
        # answer by index_fields, which tests/unit/test_backend_headers.py holds this to.
        lowers: list[Any] = list(map(LOWERED.get, fields[::2]))  # None for a name not seen
        if None not in lowers:
            values = zip(fields[1::2], strict=True)  # each value alone in a tuple
            by_name: dict[bytes, Sequence[bytes]] = dict(zip(lowers, values, strict=True))
            if len(by_name) == len(lowers):
                #: Each lowered name's values in order.
                self.by_name = by_name
                return
        self.by_name = index_fields(fields)

    def getRawHeaders(self, name: bytes | str, default: Any = None) -> Any:
        """The values of ``name`` in order (``str`` values for a ``str`` name, as ``Headers``
        gives them), or ``default`` when there is none."""
        if type(name) is bytes:  # what the request path asks: no isinstance, lower or get
            lower = LOWERED[name] if name in LOWERED else lowered(name)
            by_name = self.by_name
            return list(by_name[lower]) if lower in by_name else default
        if isinstance(name, str):
            found = self.by_name.get(name.encode("latin-1").lower())
            return default if found is None else [value.decode("utf-8") for value in found]
        found = self.by_name.get(name.lower())
        return default if found is None else list(found)

    def content_length(self) -> int | None:
        """The ``Content-Length`` (None when there is none or it is not a number)."""
        values = self.by_name.get(b"content-length")
        if values is None:
            return None
        try:
            return int(values[0])
        except ValueError:
            return None

    def chunked(self) -> bool:
        """Whether ``Transfer-Encoding`` names ``chunked``."""
        return any(b"chunked" in value.lower() for value in self.by_name.get(b"transfer-encoding", ()))

    def hasHeader(self, name: bytes | str) -> bool:
        return self.getRawHeaders(name) is not None

    def getAllRawHeaders(self) -> Iterator[tuple[bytes, list[bytes]]]:
        """Each name (as first spelled) with its values."""
        first: dict[bytes, bytes] = {}
        for name in self._fields[::2]:
            first.setdefault(name.lower(), name)
        return iter([(first[lower], list(values)) for lower, values in self.by_name.items()])


def index_fields(fields: list[bytes]) -> dict[bytes, Sequence[bytes]]:
    """Each lowered name of ``fields`` (names and values in turn) with its values in order."""
    by_name: dict[bytes, list[bytes]] = {}
    for name, value in zip(fields[::2], fields[1::2], strict=True):
        lower = LOWERED.get(name) or lowered(name)
        if lower in by_name:
            by_name[lower].append(value)
        else:
            by_name[lower] = [value]
    return dict(by_name)


def request_lines(headers: Headers) -> bytes:
    """``headers`` as the lines of a request head."""
    return b"".join([name + b": " + value + b"\r\n"
                     for name, values in headers.getAllRawHeaders() for value in values])


class RequestHeaders(Headers):
    """Request headers made once and shared by every request that sends them: read-only (a change
    raises ``TypeError``; ``copy()`` gives a plain ``Headers`` to change), and rendered for the
    wire when made, so :class:`BackendAgent` sends their lines as they are.  Any ``IAgent`` takes
    them as the ``Headers`` they are (twisted's ``Agent`` copies what it adds to)."""

    __slots__ = ("lines", "_sealed")

    def __init__(self, rawHeaders: Any = None) -> None:  # noqa: N803 - Headers' name
        self._sealed = False
        super().__init__(rawHeaders)
        self.lines = request_lines(self)
        self._sealed = True

    def copy(self) -> Headers:
        return Headers(self._rawHeaders)

    def setRawHeaders(self, name: Any, values: Any) -> None:  # noqa: N802 - Headers' name
        self._refuse()
        super().setRawHeaders(name, values)

    def addRawHeader(self, name: Any, value: Any) -> None:  # noqa: N802 - Headers' name
        self._refuse()
        super().addRawHeader(name, value)

    def removeHeader(self, name: Any) -> None:  # noqa: N802 - Headers' name
        self._refuse()
        super().removeHeader(name)

    def _refuse(self) -> None:
        if self._sealed:
            raise TypeError("shared request headers are read-only: change a copy()")


#: ``content_type_headers``' answers by content type: a backend request costs 15 calls fewer than
#: with a ``Headers`` made for it (setRawHeaders, its whitespace and name rules) and walked when
#: sent (benchmarks/trees.py --profile, one client).  Bounded (a multipart body's type names its
#: boundary): once full it starts again.
_BY_CONTENT_TYPE: dict[str, RequestHeaders] = {}
_MAX_CONTENT_TYPES = 64


def content_type_headers(content_type: str) -> Headers:
    """``Content-Type: content_type`` as request headers, shared (see :class:`RequestHeaders`)."""
    if content_type in _BY_CONTENT_TYPE:
        return _BY_CONTENT_TYPE[content_type]
    if len(_BY_CONTENT_TYPE) >= _MAX_CONTENT_TYPES:
        _BY_CONTENT_TYPE.clear()
    headers = _BY_CONTENT_TYPE[content_type] = RequestHeaders({b"content-type": [content_type.encode()]})
    return headers
