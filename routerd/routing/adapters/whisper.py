"""OpenAI ``/v1/audio/transcriptions`` and ``/translations`` <-> whisper-server ``/inference``.

The adapters work on already-parsed multipart form fields, each a
``(name, filename | None, content_type | None, data)`` tuple, so they do not
depend on the multipart codec.  Pure functions, no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence

from routerd.routing.adapters import AdapterError

INFERENCE_PATH = "/inference"

# (name, filename or None, content type or None, data)
FormField = tuple[str, str | None, str | None, bytes]

RESPONSE_FORMATS = ("json", "text", "verbose_json", "srt", "vtt")
DEFAULT_RESPONSE_FORMAT = "json"

# Text fields passed on to whisper-server unchanged; everything else the
# OpenAI API accepts (model, stream, timestamp_granularities[], include[],
# chunking_strategy, ...) is dropped.
_KEPT_FIELDS = ("language", "prompt", "temperature")


class WhisperError(Exception):
    """whisper-server answered with an error or an unreadable body (the caller answers 502)."""


def _text_value(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise AdapterError(f"form field {name} must be UTF-8 text") from None


def requested_response_format(fields: Iterable[FormField]) -> str:
    """The ``response_format`` the client asked for (default ``json``)."""
    for name, filename, _ctype, data in fields:
        if name == "response_format" and filename is None:
            return _text_value(data, name) or DEFAULT_RESPONSE_FORMAT
    return DEFAULT_RESPONSE_FORMAT


def openai_transcription_to_whisper(
    fields: Sequence[FormField], *, translate: bool = False
) -> list[FormField]:
    """OpenAI audio form fields -> whisper-server ``/inference`` form fields.

    Keeps ``file`` (given a file name if it had none), ``language``, ``prompt``
    and ``temperature`` (language left to whisper-server's default when absent); sends
    ``response_format`` explicitly (default ``json``); adds ``translate=true``
    for ``/v1/audio/translations``; drops ``model`` and the rest.  Raises
    :class:`AdapterError` for a missing file, an unknown ``response_format`` or
    a non-numeric ``temperature``.
    """
    file_field: FormField | None = None
    kept: dict[str, bytes] = {}
    for name, filename, ctype, data in fields:
        if name == "file":
            if file_field is None:
                file_field = ("file", filename or "audio.wav", ctype or "application/octet-stream", data)
        elif filename is None and (name in _KEPT_FIELDS or name == "response_format"):
            kept.setdefault(name, data)
    if file_field is None or not file_field[3]:
        raise AdapterError("file is required")
    response_format = _text_value(kept.pop("response_format", b""), "response_format")
    response_format = response_format or DEFAULT_RESPONSE_FORMAT
    if response_format not in RESPONSE_FORMATS:
        raise AdapterError(f"response_format must be one of {', '.join(RESPONSE_FORMATS)}")
    if "temperature" in kept:
        raw = _text_value(kept["temperature"], "temperature")
        try:
            float(raw)
        except ValueError:
            raise AdapterError("temperature must be a number") from None
        kept["temperature"] = raw.encode()
    for name in ("language", "prompt"):
        if name in kept:
            _text_value(kept[name], name)  # must be UTF-8 text
    out: list[FormField] = [file_field]
    out.extend((name, None, None, kept[name]) for name in _KEPT_FIELDS if name in kept)
    out.append(("response_format", None, None, response_format.encode()))
    if translate:
        out.append(("translate", None, None, b"true"))
    return out


def _whisper_error(parsed: object) -> str | None:
    if isinstance(parsed, Mapping):
        err = parsed.get("error")
        if isinstance(err, str) and err:
            return err
        if isinstance(err, Mapping) and isinstance(err.get("message"), str):
            return str(err["message"])
    return None


def whisper_to_openai(resp_body: bytes, response_format: str) -> tuple[str, bytes]:
    """A 2xx whisper-server answer -> (Content-Type, OpenAI-shaped body).

    ``json`` -> ``{"text": ...}`` (whitespace-trimmed); ``verbose_json`` ->
    whisper-server's JSON as is; ``text``/``srt``/``vtt`` -> the text as
    ``text/plain``.  Raises :class:`WhisperError` when whisper-server reported an
    error or a JSON answer cannot be read.
    """
    if response_format in ("json", "verbose_json"):
        try:
            parsed: object = json.loads(resp_body)
        except (ValueError, UnicodeDecodeError):
            raise WhisperError("whisper-server returned an unreadable answer") from None
        message = _whisper_error(parsed)
        if message is not None:
            raise WhisperError(message)
        if not isinstance(parsed, Mapping):
            raise WhisperError("whisper-server returned an unexpected answer")
        if response_format == "verbose_json":
            return "application/json", json.dumps(parsed, ensure_ascii=False).encode("utf-8")
        text = parsed.get("text")
        out = {"text": text.strip() if isinstance(text, str) else ""}
        return "application/json", json.dumps(out, ensure_ascii=False).encode("utf-8")
    if resp_body.lstrip().startswith(b"{"):
        # whisper-server reports some failures as JSON whatever the format.
        try:
            message = _whisper_error(json.loads(resp_body))
        except (ValueError, UnicodeDecodeError):
            message = None
        if message is not None:
            raise WhisperError(message)
    return "text/plain; charset=utf-8", resp_body


def whisper_error_to_openai(status: int, body: bytes) -> bytes:
    """A whisper-server error body -> ``{"error": {"message", "type", "code"}}``."""
    try:
        message = _whisper_error(json.loads(body))
    except (ValueError, UnicodeDecodeError):
        message = None
    if message is None:
        message = body.decode("utf-8", "replace").strip()[:2000] or f"backend returned HTTP {status}"
    kind = "invalid_request_error" if 400 <= status < 500 else "server_error"
    err = {"error": {"message": message, "type": kind, "code": kind}}
    return json.dumps(err, ensure_ascii=False).encode("utf-8")
