"""Minimal ``multipart/form-data`` (RFC 7578) parsing and building for a buffered body.

A small bytes parser rather than the stdlib ``email`` package, which is not safe for binary
part data (line-ending normalisation, header folding surprises).  Part data is returned
byte-for-byte; each :class:`Part` also records where its data sits in the original body so a
caller can splice a new value in without touching anything else.

Parsing is linear in the body (each delimiter is searched for once, from where the last one
ended) and stops at a part-count limit: a body with more parts than ``max_parts`` is refused with
:class:`TooManyParts` when the first part past the limit begins, before its headers are read.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from urllib.parse import unquote_to_bytes

import attrs

__all__ = [
    "MAX_PARTS",
    "MultipartError",
    "Part",
    "TooManyParts",
    "boundary_of",
    "build_form",
    "is_multipart",
    "make_boundary",
    "parse_form",
    "part_header",
]

_CRLF = b"\r\n"
# RFC 2046 bchars: boundary is 1..70 of these, not ending with a space.
_BOUNDARY_RE = re.compile(r"[0-9A-Za-z'()+_,\-./:=? ]{0,69}[0-9A-Za-z'()+_,\-./:=?]")


#: The default part-count limit (``limits.max_form_parts``): audio uploads carry a handful.
MAX_PARTS = 64


class MultipartError(ValueError):
    """The body is not a well-formed ``multipart/form-data`` body."""


class TooManyParts(MultipartError):
    """The body has more parts than the limit allows (answered 413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"more than {limit} parts in the form (limits.max_form_parts)")
        self.limit = limit


@attrs.frozen
class Part:
    """One form field.  Equality compares name, filename, content type and data only."""

    name: str
    data: bytes
    filename: str | None = None
    content_type: str | None = None
    # All header lines as (lower-cased name, value), in order.
    headers: tuple[tuple[str, str], ...] = attrs.field(default=(), eq=False)
    # Offsets of ``data`` in the parsed body ((0, 0) for parts not produced by ``parse_form``).
    start: int = attrs.field(default=0, eq=False)
    end: int = attrs.field(default=0, eq=False)

    def text(self, encoding: str = "utf-8") -> str:
        """The data decoded (strictly); raises ``UnicodeDecodeError``."""
        return self.data.decode(encoding)


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def is_multipart(content_type: str | None) -> bool:
    return content_type is not None and _media_type(content_type) == "multipart/form-data"


def _split_params(value: str) -> tuple[str, dict[str, str]]:
    """``'form-data; name="a;b"; filename=x'`` -> ``("form-data", {"name": "a;b", "filename": "x"})``.

    Quoted strings may contain ``;`` and backslash escapes.  Parameter names are lower-cased.
    """
    items: list[str] = []
    buf: list[str] = []
    quoted = False
    i = 0
    while i < len(value):
        c = value[i]
        if quoted:
            if c == "\\" and i + 1 < len(value):
                buf.append(c)
                buf.append(value[i + 1])
                i += 2
                continue
            if c == '"':
                quoted = False
        elif c == '"':
            quoted = True
        elif c == ";":
            items.append("".join(buf))
            buf = []
            i += 1
            continue
        buf.append(c)
        i += 1
    if quoted:
        raise MultipartError("unterminated quoted string in header parameter")
    items.append("".join(buf))
    head = items[0].strip().lower()
    params: dict[str, str] = {}
    for item in items[1:]:
        item = item.strip()
        if not item:
            continue
        key, sep, raw = item.partition("=")
        if not sep:
            continue
        key = key.strip().lower()
        raw = raw.strip()
        if len(raw) >= 2 and raw[0] == raw[-1] == '"':
            raw = re.sub(r"\\(.)", r"\1", raw[1:-1])
        params.setdefault(key, raw)
    return head, params


def _rfc5987(value: str) -> str | None:
    """Decode an RFC 5987 ``filename*`` value (``UTF-8''na%C3%AFve.txt``), or ``None``."""
    charset, sep, rest = value.partition("'")
    if not sep:
        return None
    _lang, sep, encoded = rest.partition("'")
    if not sep:
        return None
    try:
        return unquote_to_bytes(encoded).decode(charset or "utf-8")
    except (LookupError, UnicodeDecodeError):
        return None


def boundary_of(content_type: str) -> bytes:
    """The boundary parameter of a ``multipart/form-data`` content type."""
    if not is_multipart(content_type):
        raise MultipartError(f"not a multipart/form-data content type: {content_type!r}")
    _, params = _split_params(content_type)
    boundary = params.get("boundary")
    if not boundary:
        raise MultipartError("multipart content type has no boundary")
    if len(boundary) > 200:
        raise MultipartError("multipart boundary too long")
    try:
        return boundary.encode("ascii")
    except UnicodeEncodeError:
        raise MultipartError("multipart boundary is not ASCII") from None


def _decode_header(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def _parse_headers(block: bytes) -> tuple[tuple[str, str], ...]:
    headers: list[tuple[str, str]] = []
    if not block:
        return ()
    for line in block.split(_CRLF):
        if line[:1] in (b" ", b"\t") and headers:  # obsolete folding: continue previous value
            prev_name, prev_value = headers[-1]
            headers[-1] = (prev_name, prev_value + " " + _decode_header(line.strip()))
            continue
        name, sep, value = line.partition(b":")
        if not sep or not name.strip():
            raise MultipartError(f"malformed part header line: {line[:80]!r}")
        headers.append((_decode_header(name.strip()).lower(), _decode_header(value.strip())))
    return tuple(headers)


def parse_form(body: bytes, content_type: str, max_parts: int | None = None) -> list[Part]:
    """Parse a complete ``multipart/form-data`` body.

    Requires CRLF line endings (as every mainstream client sends) and a closing delimiter;
    a preamble before the first delimiter and an epilogue after the last are ignored.
    Raises :class:`MultipartError` on anything malformed, :class:`TooManyParts` as soon as a part
    past ``max_parts`` (None: no limit) begins.
    """
    boundary = boundary_of(content_type)
    dash = b"--" + boundary
    delimiter = _CRLF + dash

    # First delimiter: at offset 0 or after a CRLF ending the preamble.
    if body.startswith(dash):
        pos = len(dash)
    else:
        found = body.find(delimiter)
        if found < 0:
            raise MultipartError("multipart body has no opening boundary")
        pos = found + len(delimiter)

    parts: list[Part] = []
    while True:
        if body.startswith(b"--", pos):
            return parts  # closing delimiter; the rest is epilogue
        if max_parts is not None and len(parts) >= max_parts:
            raise TooManyParts(max_parts)
        # transport padding, then CRLF
        while body[pos : pos + 1] in (b" ", b"\t"):
            pos += 1
        if not body.startswith(_CRLF, pos):
            raise MultipartError("malformed multipart boundary line")
        pos += 2
        if body.startswith(_CRLF, pos):  # no headers at all
            header_block = b""
            data_start = pos + 2
        else:
            header_end = body.find(_CRLF + _CRLF, pos)
            if header_end < 0:
                raise MultipartError("unterminated part headers")
            header_block = body[pos:header_end]
            if delimiter in header_block:
                raise MultipartError("part without a header/body separator")
            data_start = header_end + 4
        data_end = body.find(delimiter, data_start)
        if data_end < 0:
            raise MultipartError("multipart body is truncated (no closing boundary)")
        headers = _parse_headers(header_block)
        parts.append(_make_part(headers, body[data_start:data_end], data_start, data_end))
        pos = data_end + len(delimiter)


def _make_part(headers: tuple[tuple[str, str], ...], data: bytes, start: int, end: int) -> Part:
    disposition = next((v for k, v in headers if k == "content-disposition"), None)
    if disposition is None:
        raise MultipartError("part has no Content-Disposition header")
    kind, params = _split_params(disposition)
    if kind != "form-data":
        raise MultipartError(f"part disposition is {kind!r}, not form-data")
    name = params.get("name")
    if name is None:
        raise MultipartError("part has no name")
    filename = params.get("filename")
    if "filename*" in params:
        decoded = _rfc5987(params["filename*"])
        if decoded is not None:
            filename = decoded
    ctype = next((v for k, v in headers if k == "content-type"), None)
    return Part(
        name=name,
        data=data,
        filename=filename,
        content_type=ctype,
        headers=headers,
        start=start,
        end=end,
    )


def make_boundary() -> bytes:
    """A fresh random boundary."""
    return b"routerd-" + os.urandom(16).hex().encode("ascii")


def _quote(value: str) -> str:
    # As HTTP clients do: backslash-escape ``\\``, percent-encode CR, LF and ``"``.
    return (
        value.replace("\\", "\\\\").replace("\r", "%0D").replace("\n", "%0A").replace('"', "%22")
    )


def part_header(part: Part) -> bytes:
    """The header block (without the blank line) ``build_form`` writes for a part."""
    disposition = f'form-data; name="{_quote(part.name)}"'
    if part.filename is not None:
        disposition += f'; filename="{_quote(part.filename)}"'
    lines = [f"Content-Disposition: {disposition}"]
    if part.content_type is not None:
        if "\r" in part.content_type or "\n" in part.content_type:
            raise MultipartError("content type contains a line break")
        lines.append(f"Content-Type: {part.content_type}")
    return "\r\n".join(lines).encode("utf-8")


def build_form(parts: Iterable[Part], boundary: bytes | str) -> bytes:
    """Serialise ``parts`` as a ``multipart/form-data`` body with ``boundary`` (bytes or str).

    Raises :class:`MultipartError` for an invalid boundary or when some part's data contains
    the delimiter (the body would not parse back).
    """
    if isinstance(boundary, bytes):
        try:
            text_boundary = boundary.decode("ascii")
        except UnicodeDecodeError:
            raise MultipartError("boundary is not ASCII") from None
    else:
        text_boundary = boundary
    if not _BOUNDARY_RE.fullmatch(text_boundary):
        raise MultipartError(f"invalid multipart boundary: {boundary!r}")
    boundary = text_boundary.encode("ascii")
    dash = b"--" + boundary
    out: list[bytes] = []
    for part in parts:
        # The parser ends a part's data at the first CRLF--boundary; it must be the one we add.
        if (part.data + _CRLF + dash).find(_CRLF + dash) != len(part.data):
            raise MultipartError("part data contains the multipart boundary")
        out.append(dash + _CRLF + part_header(part) + _CRLF + _CRLF + part.data + _CRLF)
    out.append(dash + b"--" + _CRLF)
    return b"".join(out)
