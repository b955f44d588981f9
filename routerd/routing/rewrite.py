"""Model-ID rewriting in answers (cluster spec §5.5): local/node IDs -> public IDs.

Works incrementally on a streamed body: ``make_rewriter(content_type, mapping)`` gives an object
with ``feed(chunk) -> bytes`` and ``flush() -> bytes``.  Only the **top-level** ``model`` string of
a JSON object is ever changed (or, in an object without one, the ``model`` of its ``message`` or
``response`` object: the first event of an Anthropic Messages stream, the Responses API's events),
and it is changed by splicing the new string literal over the old one, so every other byte (spacing,
number formatting, key order, escapes) stays as it was.  When nothing needs rewriting the output is
byte-identical to the input.

* JSON (``application/json``, ``*+json``): buffered up to a cap, rewritten on ``flush``; past the
  cap the body passes through unchanged (logged).  A non-JSON body passes through unchanged.
* SSE (``text/event-stream``): per line; each ``data:`` line holding a JSON object is rewritten;
  ``data: [DONE]``, comments, ``event:``/``id:`` lines, blank lines and non-JSON ``data:`` lines are
  kept as they are.  Lines end at LF, CR or CRLF (SSE's rules).
* NDJSON (``application/x-ndjson``, ``application/ndjson``): per LF-terminated line.
* anything else: identity.

Line rewriters emit each complete line as soon as its terminator arrives and never hold more than
one partial line.  Output never depends on how the input was split into chunks.

A line is only parsed when it contains the bytes ``"model"`` (a key spelled with JSON escapes,
e.g. ``"mod\\u0065l"``, is therefore not recognised; no backend writes that).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Literal

import attrs
from twisted.logger import Logger

from routerd.routing.body import json_loads_text

__all__ = [
    "DEFAULT_MAX_JSON_BYTES",
    "DEFAULT_MAX_LINE_BYTES",
    "ModelMapping",
    "JsonRewriter",
    "Member",
    "NdjsonRewriter",
    "RewriteKind",
    "Rewriter",
    "SseRewriter",
    "make_rewriter",
    "nested_members",
    "object_members",
    "rewrite_json_model",
    "rewrite_kind",
    "splice",
]

_log = Logger()

ModelMapping = Callable[[str], str | None]
RewriteKind = Literal["json", "sse", "ndjson", "identity"]

DEFAULT_MAX_JSON_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_LINE_BYTES = 16 * 1024 * 1024

_MODEL_KEY = b'"model"'
_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()
# The json package's (C-accelerated) string scanner; public in practice, absent from typeshed.
_scanstring: Callable[[str, int, bool], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- JSON object scanning


def _skip(text: str, i: int) -> int:
    """Index of the first non-JSON-whitespace character at or after ``i``."""
    m = _WS.match(text, i)
    return m.end() if m is not None else i


@attrs.frozen
class Member:
    """One member of a JSON object: its key, its decoded value, and the value's span in the text."""

    key: str
    value: Any
    start: int
    end: int


def _object_at(text: str, pos: int) -> tuple[list[Member], int]:
    """Scan the JSON object whose ``{`` is at ``pos``; returns its members and the index after ``}``.

    Raises ``ValueError`` when the text there is not a valid JSON object.  Member values are
    decoded with the C-accelerated json scanner.
    """
    if text[pos : pos + 1] != "{":
        raise ValueError("not a JSON object")
    members: list[Member] = []
    i = _skip(text, pos + 1)
    if text[i : i + 1] == "}":
        return members, i + 1
    while True:
        if text[i : i + 1] != '"':
            raise ValueError("expected a string key")
        key, i = _scanstring(text, i + 1, True)
        i = _skip(text, i)
        if text[i : i + 1] != ":":
            raise ValueError("expected ':'")
        i = _skip(text, i + 1)
        start = i
        value, i = _DECODER.raw_decode(text, i)
        members.append(Member(key, value, start, i))
        i = _skip(text, i)
        c = text[i : i + 1]
        if c == ",":
            i = _skip(text, i + 1)
            continue
        if c == "}":
            return members, i + 1
        raise ValueError("expected ',' or '}'")


def object_members(text: str) -> tuple[list[Member], int]:
    """Members of the JSON document ``text``, which must be exactly one object (plus whitespace).

    Returns the members (in document order, duplicates kept) and the index of the opening ``{``.
    Raises ``ValueError`` otherwise.
    """
    brace = _skip(text, 0)
    members, end = _object_at(text, brace)
    if _skip(text, end) != len(text):
        raise ValueError("extra data after the JSON object")
    return members, brace


def nested_members(text: str, member: Member) -> list[Member]:
    """Members of an object-valued member (spans relative to ``text``); ``[]`` if not an object."""
    if not isinstance(member.value, dict):
        return []
    members, _ = _object_at(text, member.start)
    return members


def splice(text: str, edits: list[tuple[int, int, str]]) -> str:
    """Replace non-overlapping ``(start, end, replacement)`` spans of ``text``."""
    out: list[str] = []
    last = 0
    for start, end, replacement in sorted(edits):
        out.append(text[last:start])
        out.append(replacement)
        last = end
    out.append(text[last:])
    return "".join(out)


def rewrite_json_model(body: bytes, mapping: ModelMapping) -> bytes:
    """``body`` with its top-level ``model`` string replaced by ``mapping(model)``.

    Returns ``body`` itself (the same object) when it is not a UTF-8 JSON object, has no
    top-level string ``model``, or ``mapping`` returns ``None`` or the same value.

    The hot path of every streamed chunk: the document is validated by the C JSON
    decoder, and the top-level ``"model"`` keys are found by one regex pass over its strings and
    brackets, not by decoding it member by member.
    """
    if _MODEL_KEY not in body or _left_alone(body, mapping):
        return body
    try:
        text = body.decode("utf-8")
        parsed = json_loads_text(text)
    except (ValueError, RecursionError):  # incl. UnicodeDecodeError, JSONDecodeError
        return body
    if not isinstance(parsed, dict):
        return body
    if "model" in parsed:
        found = _top_level_model_strings(text)
    elif any(isinstance(parsed.get(key), dict) for key in CARRIERS):
        found = _carried_model_strings(text)
    else:
        return body
    edits: list[tuple[int, int, str]] = []
    for start, end, old in found:
        new = mapping(old)
        if new is not None and new != old:
            edits.append((start, end, json.dumps(new)))
    if not edits:
        return body
    return splice(text, edits).encode("utf-8")


_MODEL_STRING = re.compile(rb'"model"[ \t\n\r]*:[ \t\n\r]*"([^"\\]*)"')


def _left_alone(body: bytes, mapping: ModelMapping) -> bool:
    """Whether every ``"model"`` in ``body`` is followed by a plain string that ``mapping`` leaves
    as it is: then nothing can change, at any depth, valid JSON or not, and nothing is decoded
    (a backend already naming the model as the client did: every chunk of a stream)."""
    values = _MODEL_STRING.findall(body)
    if len(values) != body.count(_MODEL_KEY):
        return False
    for raw in set(values):
        try:
            value = raw.decode("utf-8")
        except UnicodeDecodeError:
            return False
        new = mapping(value)
        if new is not None and new != value:
            return False
    return True


#: The members of a stream event that carry the whole answer, its ``model`` included: Anthropic's
#: ``message_start`` (``message``) and the Responses API's ``response.*`` events (``response``).
CARRIERS = ("message", "response")


def _carried_model_strings(text: str) -> list[tuple[int, int, str]]:
    """Span and value of the string ``model`` of each :data:`CARRIERS` object of the object ``text``."""
    members, _ = object_members(text)
    out: list[tuple[int, int, str]] = []
    for member in members:
        if member.key in CARRIERS:
            out += [(m.start, m.end, m.value) for m in nested_members(text, member)
                    if m.key == "model" and isinstance(m.value, str)]
    return out


# A JSON string, escapes included (the unrolled form: no per-character alternation).
_STRINGS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')


def _top_level_model_strings(text: str) -> list[tuple[int, int, str]]:
    """Span and value of every string-valued ``"model"`` member of the object ``text`` (valid JSON).

    Each ``"model"`` found is a top-level key when the text before it, with its strings removed,
    holds no open string and one more opening than closing bracket, and a ``:`` follows it.
    """
    out: list[tuple[int, int, str]] = []
    pos = text.find('"model"')
    while pos >= 0:
        before = _STRINGS.sub("", text[:pos])
        if '"' not in before and (before.count("{") + before.count("[")
                                  - before.count("}") - before.count("]")) == 1:
            colon = _skip(text, pos + 7)
            if text[colon : colon + 1] == ":":
                start = _skip(text, colon + 1)
                if text[start : start + 1] == '"':
                    value, end = _scanstring(text, start + 1, True)
                    out.append((start, end, value))
        pos = text.find('"model"', pos + 1)
    return out


# --------------------------------------------------------------------------- rewriters


class Rewriter:
    """Identity rewriter; the base of the others."""

    kind: RewriteKind = "identity"

    def feed(self, chunk: bytes) -> bytes:
        return chunk

    def flush(self) -> bytes:
        return b""


class _HoldingRewriter(Rewriter):
    """A rewriter that holds bytes back (``_pending``, ``_pending_len`` long) until it can rewrite
    them, up to ``_max`` bytes."""

    def __init__(self, mapping: ModelMapping, max_bytes: int) -> None:
        self._mapping = mapping
        self._max = max_bytes
        self._pending: list[bytes] = []
        self._pending_len = 0

    def _take_pending(self) -> bytes:
        """Everything held back, no longer held."""
        out = b"".join(self._pending)
        self._pending = []
        self._pending_len = 0
        return out


class JsonRewriter(_HoldingRewriter):
    kind: RewriteKind = "json"

    def __init__(self, mapping: ModelMapping, max_bytes: int = DEFAULT_MAX_JSON_BYTES) -> None:
        super().__init__(mapping, max_bytes)
        self._passthrough = False

    def feed(self, chunk: bytes) -> bytes:
        if self._passthrough:
            return chunk
        self._pending.append(chunk)
        self._pending_len += len(chunk)
        if self._pending_len > self._max:
            _log.warn(
                "JSON answer over {max} bytes: model IDs passed through unrewritten", max=self._max
            )
            self._passthrough = True
            return self._take_pending()
        return b""

    def flush(self) -> bytes:
        if self._passthrough:
            return b""
        return rewrite_json_model(self._take_pending(), self._mapping)


class _LineRewriter(_HoldingRewriter):
    """Shared machinery: split at line terminators, transform each line's content."""

    def __init__(self, mapping: ModelMapping, max_line: int = DEFAULT_MAX_LINE_BYTES) -> None:
        super().__init__(mapping, max_line)
        # Inside a line longer than the cap: pass bytes through until its terminator.
        self._overflow = False

    # Subclasses define these three.
    def _first_terminator(self, data: bytes) -> int:
        raise NotImplementedError

    def _last_terminator(self, data: bytes) -> int:
        raise NotImplementedError

    def _transform_lines(self, data: bytes) -> bytes:
        """Rewrite ``data``, which is one or more complete lines (terminators included)."""
        raise NotImplementedError

    def _transform(self, content: bytes) -> bytes:
        """Rewrite one line's content (no terminator)."""
        raise NotImplementedError

    def _too_long(self) -> bytes:
        _log.warn(
            "streamed line over {max} bytes: model IDs passed through unrewritten", max=self._max
        )
        self._overflow = True
        return self._take_pending()

    def feed(self, chunk: bytes) -> bytes:
        if not chunk:
            return b""
        head = b""
        if self._overflow:
            first = self._first_terminator(chunk)
            if first < 0:
                return chunk
            self._overflow = False
            head, chunk = chunk[: first + 1], chunk[first + 1 :]
            if not chunk:
                return head
        last = self._last_terminator(chunk)
        if last < 0:
            self._pending.append(chunk)
            self._pending_len += len(chunk)
            if self._pending_len > self._max:
                return head + self._too_long()
            return head
        if self._pending:
            self._pending.append(chunk[: last + 1])
            complete = b"".join(self._pending)
        else:
            complete = chunk[: last + 1]
        rest = chunk[last + 1 :]
        if rest:
            self._pending = [rest]
            self._pending_len = len(rest)
        else:
            self._pending = []
            self._pending_len = 0
        out = head + self._transform_lines(complete)
        if self._pending_len > self._max:
            out += self._too_long()
        return out

    def flush(self) -> bytes:
        if self._overflow:
            self._overflow = False
            return b""
        content = self._take_pending()
        return self._transform(content) if content else b""


class SseRewriter(_LineRewriter):
    kind: RewriteKind = "sse"

    def _first_terminator(self, data: bytes) -> int:
        lf, cr = data.find(b"\n"), data.find(b"\r")
        if lf < 0:
            return cr
        if cr < 0:
            return lf
        return min(lf, cr)

    def _last_terminator(self, data: bytes) -> int:
        lf = data.rfind(b"\n")
        if not data[lf + 1:]:  # a chunk ending in LF (every whole event): no CR after it
            return lf
        return max(lf, data.rfind(b"\r"))

    def _transform_lines(self, data: bytes) -> bytes:
        if _MODEL_KEY not in data or _left_alone(data, self._mapping):
            return data  # no model, or none that changes: the block passes as it came
        out: list[bytes] = []
        for line in data.splitlines(keepends=True):  # bytes split only at \n, \r, \r\n
            content = line.rstrip(b"\r\n")
            out.append(self._transform(content) + line[len(content) :])
        return b"".join(out)

    def _transform(self, content: bytes) -> bytes:
        if not content.startswith(b"data:") or _MODEL_KEY not in content or len(content) > self._max:
            return content
        start = 6 if content[5:6] == b" " else 5
        payload = content[start:]
        new = rewrite_json_model(payload, self._mapping)
        return content if new is payload else content[:start] + new


class NdjsonRewriter(_LineRewriter):
    kind: RewriteKind = "ndjson"

    def _first_terminator(self, data: bytes) -> int:
        return data.find(b"\n")

    def _last_terminator(self, data: bytes) -> int:
        return data.rfind(b"\n")

    def _transform_lines(self, data: bytes) -> bytes:
        if _MODEL_KEY not in data or _left_alone(data, self._mapping):
            return data  # no model, or none that changes: the block passes as it came
        # ``data`` ends with b"\n", so the last element is b"" and join restores every LF.
        return b"\n".join(self._transform(content) for content in data.split(b"\n"))

    def _transform(self, content: bytes) -> bytes:
        # A CR before the LF is JSON whitespace and survives the splice untouched.
        if _MODEL_KEY not in content or len(content) > self._max:
            return content
        return rewrite_json_model(content, self._mapping)


def rewrite_kind(content_type: str | None) -> RewriteKind:
    """Which rewriter a response ``Content-Type`` gets."""
    if not content_type:
        return "identity"
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "application/json" or media.endswith("+json"):
        return "json"
    if media == "text/event-stream":
        return "sse"
    if media in ("application/x-ndjson", "application/ndjson"):
        return "ndjson"
    return "identity"


def _memoised(mapping: ModelMapping, limit: int = 256) -> ModelMapping:
    cache: dict[str, str | None] = {}

    def lookup(old: str) -> str | None:
        try:
            return cache[old]
        except KeyError:
            new = mapping(old)
            if len(cache) < limit:
                cache[old] = new
            return new

    return lookup


def make_rewriter(
    content_type: str | None,
    mapping: ModelMapping,
    *,
    max_json_bytes: int = DEFAULT_MAX_JSON_BYTES,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
) -> Rewriter:
    """A rewriter for an answer of ``content_type``; ``mapping(old) -> new | None`` (None: leave).

    ``mapping`` is called at most once per distinct model value seen by this rewriter.
    """
    kind = rewrite_kind(content_type)
    if kind == "json":
        return JsonRewriter(_memoised(mapping), max_json_bytes)
    if kind == "sse":
        return SseRewriter(_memoised(mapping), max_line_bytes)
    if kind == "ndjson":
        return NdjsonRewriter(_memoised(mapping), max_line_bytes)
    return Rewriter()
