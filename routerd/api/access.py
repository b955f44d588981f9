"""The one access line both HTTP edges write, and the answer heads they write themselves.

``log_access`` renders ``method path status bytes ms model node lent_to request_id client`` once
(namespace ``routerd.access``).  Every value a client chose (path, model, client address as
forwarded) is escaped first: a control byte, a quote or a non-printable character becomes a
backslash escape, so a text log line stays one line and the JSON log one valid object per line
whatever a request carried.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from twisted.logger import LogLevel
from twisted.web.http import RESPONSES

from routerd.errors import ErrorStyle, StatusError, error_answer
from routerd.logs import ACCESS_FORMAT, QuickLogger, gate, literal

access_log = QuickLogger(namespace="routerd.access")

def printable(text: str) -> str:
    """``text`` with every character that is not printable ASCII-or-Unicode escaped (``\\x1b``,
    ``\\n`` …); spaces and quotes too, so a value never splits or fakes a field."""
    if text.isprintable() and " " not in text and '"' not in text:
        return text  # the common case: one C pass
    return text.encode("unicode_escape").decode("ascii").replace(" ", "\\x20").replace('"', '\\"')


def log_access(*, method: str, path: str, status: int, bytes: int, ms: int | None,  # noqa: A002
               model: str, node: str, lent_to: str, request_id: str, client: str) -> None:
    """Logs one access line (both HTTP edges; see the module docstring).  Rendered here by
    str.format (C): an observer then formats a literal, not ten fields through twisted's
    Python-level formatter."""
    # the four values a client chose, checked in one pass: clean as they nearly always are, one
    # isprintable call instead of 4 printable frames, 4 dict.get, 4 isinstance (trees.py --profile)
    sent = method + path + model + client
    if not sent.isprintable() or " " in sent or '"' in sent:
        method, path, model, client = printable(method), printable(path), printable(model), printable(client)
    fields = {"method": method, "path": path, "status": status, "bytes": bytes, "ms": ms, "model": model,
              "node": node, "lent_to": lent_to, "request_id": request_id, "client": client}
    line = ACCESS_FORMAT.format_map(fields)
    access_log.info(literal(line), **fields)


def access_logged() -> bool:
    """Whether access lines are written at all (info enabled): else nothing is gathered for them."""
    return LogLevel.info in gate.levels  # the gate's own test, one frame: asked once a request


def answer_head(status: int, headers: Sequence[bytes], length: int | None, close: bool,
                date: bytes, has_type: bool) -> bytes:
    """An HTTP/1.1 answer head: ``headers`` (a flat list, each name followed by its value), then
    ``Content-Length`` (or chunked when ``length`` is None), a JSON content type unless
    ``has_type``, ``Connection: close`` when ``close``, and ``Date``.  Both the lean channel's
    answers and head-time refusals are written by it; the status line is rendered once per status,
    the field lines by one format of as many ``name: value`` lines as there are headers, and the
    head by one more (a loop over the headers and a join were 114 opcodes a request, ops.py)."""
    count = len(headers)
    lines = _LINES[count] if count < _LINES_KEPT else b"%b: %b\r\n" * (count // 2)
    return b"%b%b%b%b%bdate: %b\r\n\r\n" % (
        _STATUS_LINES[status] if status in _STATUS_LINES else _status_line(status),
        lines % tuple(headers),
        b"" if has_type else b"content-type: application/json\r\n",
        b"transfer-encoding: chunked\r\n" if length is None else b"content-length: %d\r\n" % length,
        b"connection: close\r\n" if close else b"",
        date)


#: Formats of ``n // 2`` field lines for a flat list of ``n`` names and values.
_LINES_KEPT = 64
_LINES = [b"%b: %b\r\n" * (count // 2) for count in range(_LINES_KEPT)]


#: ``HTTP/1.1 <status> <reason>`` lines rendered once per status (bounded).
_STATUS_LINES: dict[int, bytes] = {}


def _status_line(status: int) -> bytes:
    line = b"HTTP/1.1 %d %s\r\n" % (status, RESPONSES.get(status, b"Unknown"))
    if len(_STATUS_LINES) < 64:
        _STATUS_LINES[status] = line
    return line


def refusal(err: StatusError, family: ErrorStyle, headers: Iterable[tuple[bytes, bytes]],
            date: bytes) -> bytes:
    """The whole answer to a request refused before its body was read (admission, a malformed head,
    a deadline): the one error answer (:func:`~routerd.errors.error_answer`) in the route's error
    ``family`` after ``headers`` (CORS), with ``Connection: close``."""
    status, own, body = error_answer(err, family)
    flat = [part for pair in (*headers, *own) for part in pair]
    return answer_head(status, flat, len(body), True, date, True) + body


__all__ = ["access_log", "access_logged", "answer_head", "log_access", "printable", "refusal"]
