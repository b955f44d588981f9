"""One request head, built the same way by both HTTP edges.

The lean channel (:mod:`routerd.api.channel`) splits a head itself; twisted.web's ``HTTPChannel``
(:class:`routerd.api.site.NodeHTTPChannel`) parses the ones handed to it.  Both give the request line
and the field lines to :func:`build_head`, which applies the message rules of RFC 9110 §5 and
RFC 9112 and returns the one :class:`RequestHead` every later rule reads (admission, routing, the
access line), or raises :class:`~routerd.errors.HTTPError` (400, 431, 501, 505):

- the method is a token; the version ``HTTP/1.0`` or ``HTTP/1.1`` (another ``HTTP/x.y``: 505);
- the target is origin-form (``/`` then printable ASCII, no spaces, no control bytes, nothing
  at or above 0x80): it is copied into backend request lines and log lines, so nothing else passes;
- at most :data:`MAX_FIELDS` field lines of at most :data:`MAX_LINE` bytes each (431); names are
  tokens; values hold no control bytes but HTAB (no NUL, CR, LF, DEL);
- repeated lines of a list field are joined in order with ``", "`` (RFC 9110 §5.3), so
  ``X-Forwarded-For`` written twice by two proxies reads as one list; a repeated singleton field
  (:data:`SINGLETONS`: ``Authorization``, ``Host``, ``Content-Length``, ``Content-Type``) is a 400,
  never "first wins" on one edge and "last wins" on the other;
- an HTTP/1.1 request has exactly one ``Host`` (RFC 9112 §3.2);
- ``Content-Length`` is 1–19 digits; with ``Transfer-Encoding`` it is a 400 (RFC 9112 §6.3, request
  smuggling); the only transfer coding taken is ``chunked`` (501 otherwise), and not in HTTP/1.0.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable

from routerd.errors import HTTPError

#: Bytes of a whole head (request line, field lines and their line ends).
MAX_HEAD_BYTES = 16 * 1024
#: Field lines of one head.
MAX_FIELDS = 100
#: Bytes of one line (the request line or one field line).
MAX_LINE = 8 * 1024
#: Fields a request may carry once only.
SINGLETONS = frozenset({"authorization", "host", "content-length", "content-type"})

_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_TARGET = re.compile(rb"/[\x21-\x7e]*")
_VERSION = re.compile(rb"HTTP/[0-9]\.[0-9]")
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_LENGTH = re.compile(rb"[0-9]{1,19}")
_VERSIONS = frozenset({b"HTTP/1.1", b"HTTP/1.0"})
#: One shared object for the versions and methods every request repeats: a held request keeps no
#: copy of its own.
_SHARED_VERSION = {b"HTTP/1.1": b"HTTP/1.1", b"HTTP/1.0": b"HTTP/1.0"}
_SHARED_METHOD = {name.encode(): name for name in ("POST", "GET", "HEAD", "PUT", "DELETE", "OPTIONS",
                                                   "PATCH")}
_NO_FIELDS: dict[str, str] = {}
#: Field names already checked (a token) and lower-cased, as sent: clients send the same dozen
#: names on every request, and the check and the decode were a fifth of the head's cost (edge
#: micro-benchmark, 28.4 -> 26 us per request).  Bounded: names a client invents are checked anew.
_NAMES: dict[bytes, str] = {}
_NAMES_KEPT = 512
#: The same names decoded (what :func:`clean_head` looks up).
_TEXT_NAMES: dict[str, str] = {}
_LENGTH_TEXT = re.compile(r"[0-9]{1,19}")
#: One field line, from a line start: the name with its colon (none when missing) and the value
#: without the whitespace around it (from its first to its last byte that is no SP or HTAB), no
#: control byte but HTAB in the value, none in the name.  A line holding another control byte, or a
#: CR or LF that ends no line, matches nowhere, so fewer lines are found than it has CRs or LFs: one
#: pattern, the lines counted, where a search for control bytes (an alternation with look-arounds,
#: tried at every byte) and a lazy value (the line's end tried after every byte) cost ~48k machine
#: instructions a head, ~4 % of a request's (~15k now; cg.py).
_FIELD_LINE = re.compile(r"(?m)^([^:\x00-\x1f\x7f]*:?)[ \t]*"
                         r"([^\x00-\x08\x0a-\x1f\x7f]*[^\x00-\x20\x7f]|)[ \t]*\r\n")
#: The names of a clean head's field lines as sent (each with its colon) -> their lower-case names,
#: for the name sequences already checked (clients send the same names in the same order on every
#: request: one lookup, where the names were checked one by one: clean_head 146 -> 94 opcodes; ops.py).
#: Bounded: past _SEQUENCES_KEPT sequences a head's names are checked anew.
_SEQUENCES: dict[tuple[str, ...], tuple[str, ...]] = {}
_SEQUENCES_KEPT = 256
#: Raw paths -> their text, one shared string each (bounded).
_PATHS: dict[bytes, str] = {}
_PATHS_KEPT = 256


def _path(raw: bytes) -> str:
    path = sys.intern(raw.decode("ascii"))  # one shared string per path (held requests keep it)
    if len(_PATHS) < _PATHS_KEPT:
        _PATHS[raw] = path
    return path


def bad_request(message: str) -> HTTPError:
    return HTTPError(400, message, "invalid_request_error", "bad_request")


def head_too_large(message: str) -> HTTPError:
    return HTTPError(431, message, "invalid_request_error", "request_header_fields_too_large")


class RequestHead:
    """What a request's head says, after the rules above.  ``fields`` maps lower-case names to
    their (joined) values; ``length`` is the ``Content-Length`` (None when absent)."""

    __slots__ = ("method", "target", "path", "query", "version", "fields", "length", "chunked", "close")

    def __init__(self, method: str, target: bytes, version: bytes, fields: dict[str, str],
                 length: int | None, chunked: bool, close: bool) -> None:
        self.method = method
        self.target = target
        raw_path, _, self.query = target.partition(b"?")  # (bytes `in` costs a dropped TypeError)
        # the decoded path of a raw path seen before, one shared string: no call (trees.py --profile)
        self.path = _PATHS[raw_path] if raw_path in _PATHS else _path(raw_path)
        self.version = _SHARED_VERSION[version] if version in _SHARED_VERSION else version
        self.fields = fields
        self.length = length
        self.chunked = chunked
        self.close = close

    def field(self, name: str) -> str | None:
        return self.fields.get(name)

    def keep_only(self, names: Iterable[str]) -> None:
        """Let go of every field but ``names``, and of the raw target (``path`` and ``query`` stay):
        a held request keeps the few values its access line reads."""
        fields = self.fields
        kept = {}
        for name in names:  # a loop, not a comprehension: no frame of its own
            if name in fields:
                kept[name] = fields[name]
        self.fields = kept or _NO_FIELDS
        self.target = b""


def check_request_line(method: bytes, target: bytes, version: bytes) -> None:
    """The request line's rules (see the module docstring)."""
    if version not in _VERSIONS:  # (both match _VERSION: only another version is matched)
        if _VERSION.fullmatch(version) is None:
            raise bad_request("malformed HTTP version")
        raise HTTPError(505, "only HTTP/1.0 and HTTP/1.1 are served", "invalid_request_error",
                        "http_version_not_supported")
    if method not in _SHARED_METHOD and _TOKEN.fullmatch(method) is None:  # the known ones are tokens
        raise bad_request("malformed request method")
    if len(target) > MAX_LINE:
        raise HTTPError(414, "request target is too long", "invalid_request_error", "uri_too_long")
    if _TARGET.fullmatch(target) is None:
        raise bad_request("request target must be a path of printable ASCII (origin-form)")


def build_head(method: bytes, target: bytes, version: bytes,
               lines: Iterable[tuple[bytes, bytes]]) -> RequestHead:
    """The head of a request line and its field lines ``(name, value)`` in arrival order (names in
    any case, values with or without their optional whitespace)."""
    check_request_line(method, target, version)
    fields: dict[str, str] = {}
    count = 0
    for name, value in lines:
        count += 1
        if count > MAX_FIELDS:
            raise head_too_large(f"more than {MAX_FIELDS} header fields")
        if len(name) + len(value) > MAX_LINE:
            raise head_too_large(f"a header field line is longer than {MAX_LINE} bytes")
        key = _NAMES.get(name)
        if key is None:
            if _TOKEN.fullmatch(name) is None:
                raise bad_request("malformed header field name")
            key = name.decode("ascii").lower()
            if len(_NAMES) < _NAMES_KEPT:
                _NAMES[name] = key
                _TEXT_NAMES[name.decode("ascii")] = key
        value = value.strip(b" \t")
        if _BAD_VALUE.search(value) is not None:
            raise bad_request("control character in a header field value")
        text = value.decode("latin-1")
        known = fields.get(key)
        if known is None:
            fields[key] = text
        elif key in SINGLETONS:
            raise bad_request(f"repeated {key} header field")
        elif text:
            fields[key] = f"{known}, {text}" if known else text
    return _framed(method, target, version, fields)


def head_of_lines(method: bytes, target: bytes, version: bytes, lines: list[bytes]) -> RequestHead:
    """:func:`build_head` of raw field lines ``name: value`` (a line without a colon is a 400, as
    twisted.web's channel refuses it; a name that is no token, obs-fold or a space before the
    colon, is refused by :func:`build_head`, as :class:`~routerd.api.site.NodeHTTPChannel` refuses it)."""
    pairs = []
    for line in lines:
        name, colon, value = line.partition(b":")
        if not colon:
            raise bad_request("malformed request head")
        pairs.append((name, value))
    return build_head(method, target, version, pairs)


def content_length(value: bytes) -> int:
    """A ``Content-Length`` value (1–19 digits, optional whitespace around) as a number, else a 400."""
    value = value.strip(b" \t")
    if _LENGTH.fullmatch(value) is None:
        raise bad_request("Content-Length must be 1 to 19 digits")
    return int(value)


def transfer_coding(value: bytes) -> bool:
    """A ``Transfer-Encoding`` value: ``chunked`` is taken (True), any other coding is a 501."""
    if value.strip(b" \t").lower() != b"chunked":
        raise HTTPError(501, "only the chunked transfer coding is accepted", "invalid_request_error",
                        "not_implemented")
    return True


def _framed(method: bytes, target: bytes, version: bytes, fields: dict[str, str]) -> RequestHead:
    # membership tests and subscripts rather than dict.get: no calls for an absent field
    http11 = version == b"HTTP/1.1"
    if http11 and "host" not in fields:
        raise bad_request("an HTTP/1.1 request needs a Host header field")
    length: int | None = None
    if "content-length" in fields:
        raw_length = fields["content-length"]
        # 1-19 ASCII digits (a value is stripped already): one match, else content_length's rule
        length = int(raw_length) if _LENGTH_TEXT.fullmatch(raw_length) is not None \
            else content_length(raw_length.encode("latin-1"))
    chunked = False
    if "transfer-encoding" in fields:
        if length is not None:
            raise bad_request("Content-Length and Transfer-Encoding together")
        if not http11:
            raise bad_request("Transfer-Encoding in an HTTP/1.0 request")
        chunked = transfer_coding(fields["transfer-encoding"].encode("latin-1"))
    connection = fields["connection"].lower() if "connection" in fields else ""
    if http11:
        close = "close" in connection and "close" in _tokens(connection)
    else:
        close = "keep-alive" not in _tokens(connection)
    return RequestHead(_SHARED_METHOD[method] if method in _SHARED_METHOD else method.decode("ascii"), target,
                       version, fields, length, chunked, close)


def clean_head(method: bytes, target: bytes, version: bytes, size: int,
               field_lines: bytes) -> RequestHead | None:
    """What :func:`build_head` returns for a head with nothing to refuse or join, built in a few C
    calls; None for any other head (then :func:`build_head` takes it line by line and refuses what
    it refuses).  ``size``: the head's bytes; ``field_lines``: its field lines, each ending in CRLF.

    Taken: a head of at most :data:`MAX_LINE` bytes (no line can be too long), a known method and
    version, at most :data:`MAX_FIELDS` fields, each with a colon, a name :func:`build_head` has
    already checked, sent once, and no control byte anywhere but the line ends.  The lean channel
    calls it for every head (the per-field rules were ~40 calls a request, ~10 here;
    trees.py --profile); tests/unit/test_edge_fast_paths.py holds it to :func:`build_head`.  Each
    field line must end in CRLF (the lean channel's do: a head's field lines up to its blank line)."""
    if size > MAX_LINE or method not in _SHARED_METHOD or version not in _VERSIONS \
            or _TARGET.fullmatch(target) is None:
        return None
    text = field_lines.decode("latin-1")
    found = _FIELD_LINE.findall(text)
    count = len(found)
    # a line with a control byte, or a CR or LF outside a line end: more CRs or LFs than lines
    if text.count("\r") != count or text.count("\n") != count:
        return None
    if found:
        names, values = zip(*found, strict=True)
        keys = _SEQUENCES[names] if names in _SEQUENCES else _checked_names(names)
        if keys is None:
            return None
        fields = dict(zip(keys, values, strict=True))
    else:
        fields = {}
    try:
        return _framed(method, target, version, fields)
    except HTTPError:
        return None


def _checked_names(names: tuple[str, ...]) -> tuple[str, ...] | None:
    """The lower-case names of a clean head's field names as sent (each with its colon), or None
    unless each has its colon, is a name :func:`build_head` has already checked, is sent once and
    they are at most :data:`MAX_FIELDS`; kept in :data:`_SEQUENCES` while it has room."""
    if len(names) > MAX_FIELDS:
        return None
    keys = []
    for sent in names:
        name = sent[:-1]
        if not sent.endswith(":") or name not in _TEXT_NAMES:
            return None
        keys.append(_TEXT_NAMES[name])
    if len(set(keys)) != len(keys):
        return None
    checked = tuple(keys)
    if len(_SEQUENCES) < _SEQUENCES_KEPT:
        _SEQUENCES[names] = checked
    return checked


def _tokens(value: str) -> set[str]:
    return {part.strip() for part in value.split(",")}


__all__ = ["MAX_FIELDS", "MAX_HEAD_BYTES", "MAX_LINE", "SINGLETONS", "RequestHead", "bad_request",
           "build_head", "check_request_line", "clean_head", "content_length", "head_of_lines",
           "head_too_large", "transfer_coding"]
