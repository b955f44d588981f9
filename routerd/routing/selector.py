"""Model selector extraction and request-body model replacement (contract §5; cluster spec §5.4, §6.2).

Selector sources, first match wins:

1. JSON body ``model`` (must be a string when present; ``null`` and ``""`` count as absent);
   for a ``multipart/form-data`` body (audio uploads) the form field ``model`` instead;
2. image routes only: JSON ``sd_model_checkpoint``, then ``override_settings.sd_model_checkpoint``;
3. query ``model`` (image routes: then query ``sd_model_checkpoint``);
4. header ``X-Routerd-Model``.

A body that is neither empty nor multipart is parsed as JSON whatever its Content-Type says
(``curl -d`` sends JSON labelled ``application/x-www-form-urlencoded``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Literal

import attrs

from routerd.routing.body import json_loads
from routerd.routing.classify import Route
from routerd.routing.multipart import (
    MultipartError,
    Part,
    TooManyParts,
    boundary_of,
    build_form,
    is_multipart,
    parse_form,
    part_header,
)
from routerd.routing.rewrite import Member, nested_members, object_members, splice

__all__ = [
    "MAX_MODEL_BYTES",
    "MODEL_HEADER",
    "SelectorError",
    "SelectorResult",
    "SelectorSource",
    "model_too_long",
    "parse_json_object",
    "replace_model",
    "select_model",
]

MODEL_HEADER = "X-Routerd-Model"
#: The longest model name a request may give (UTF-8 bytes): a longer one is refused (400) before
#: anything stores, logs or echoes it.
MAX_MODEL_BYTES = 256


def model_too_long(name: str) -> bool:
    """Whether ``name`` is longer than :data:`MAX_MODEL_BYTES` (in UTF-8)."""
    return len(name) > MAX_MODEL_BYTES // 4 and len(name.encode("utf-8", "surrogatepass")) > MAX_MODEL_BYTES


def too_long() -> SelectorError:
    return SelectorError(f"model name is longer than {MAX_MODEL_BYTES} bytes")

SelectorSource = Literal[
    "json",
    "form",
    "sd_model_checkpoint",
    "override_settings",
    "query",
    "query_sd_model_checkpoint",
    "header",
]


class SelectorError(ValueError):
    """The request's selector or body is unusable; answer ``status`` (400) with ``message``."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@attrs.frozen
class SelectorResult:
    """The chosen model (``None``: no selector, allowed on this route) and where it came from.

    ``payload`` is the parsed JSON body (``None`` for an empty or multipart body) and ``form`` the
    parsed multipart parts (``None`` unless multipart), so callers need not parse again.
    """

    model: str | None
    source: SelectorSource | None
    payload: dict[str, Any] | None = attrs.field(default=None, eq=False)
    form: tuple[Part, ...] | None = attrs.field(default=None, eq=False)


def parse_json_object(body: bytes) -> dict[str, Any]:
    """Parse a request body that must be a JSON object; raises :class:`SelectorError`."""
    try:
        value = json_loads(body)
    except RecursionError:
        raise SelectorError("invalid JSON body: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise SelectorError(f"invalid JSON body: {exc}") from None
    if not isinstance(value, dict):
        raise SelectorError("request body must be a JSON object")
    return value


def _string_field(obj: Mapping[str, Any], key: str, label: str) -> str | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise SelectorError(f"{label} must be a string")
    return value or None


def _first_query(query: Mapping[str, list[str]], key: str) -> str | None:
    for value in query.get(key, ()):
        if value:
            return value
    return None


def _header(headers: Mapping[str, str], name: str) -> str | None:
    wanted = name.lower()
    for key, value in headers.items():
        if key.lower() == wanted:
            value = value.strip()
            if value:
                return value
    return None


def _form_model(parts: list[Part]) -> str | None:
    for part in parts:
        if part.name == "model" and part.filename is None:
            try:
                value = part.data.decode("utf-8")
            except UnicodeDecodeError:
                raise SelectorError("model must be a string") from None
            return value or None
    return None


def select_model(
    route: Route,
    body: bytes,
    content_type: str,
    query: Mapping[str, list[str]],
    headers: Mapping[str, str],
    max_parts: int | Callable[[], int] | None = None,
) -> SelectorResult:
    """Find the request's model selector (see the module docstring for the order).

    Raises :class:`SelectorError` for an unparsable body, a non-string selector, or a missing
    model on a route that requires one (``"model is required"``); a form with more than
    ``max_parts`` parts raises :class:`~routerd.routing.multipart.TooManyParts`.  ``max_parts``
    may be a callable (the front's live limit), asked only when the body is a form.
    """
    payload: dict[str, Any] | None = None
    form: tuple[Part, ...] | None = None
    is_image = route.runtime == "image"

    def found(model: str, source: SelectorSource) -> SelectorResult:
        if model_too_long(model):
            raise too_long()
        return SelectorResult(model, source, payload, form)

    if is_multipart(content_type):
        try:
            parts = parse_form(body, content_type, max_parts() if callable(max_parts) else max_parts)
        except TooManyParts:
            raise
        except MultipartError as exc:
            raise SelectorError(f"invalid multipart body: {exc}") from None
        form = tuple(parts)
        model = _form_model(parts)
        if model is not None:
            return found(model, "form")
    elif body.strip():
        payload = parse_json_object(body)
        model = _string_field(payload, "model", "model")
        if model is not None:
            return found(model, "json")
        if is_image:
            model = _string_field(payload, "sd_model_checkpoint", "sd_model_checkpoint")
            if model is not None:
                return found(model, "sd_model_checkpoint")
            overrides = payload.get("override_settings")
            if isinstance(overrides, dict):
                model = _string_field(
                    overrides, "sd_model_checkpoint", "override_settings.sd_model_checkpoint"
                )
                if model is not None:
                    return found(model, "override_settings")

    model = _first_query(query, "model")
    if model is not None:
        return found(model, "query")
    if is_image:
        model = _first_query(query, "sd_model_checkpoint")
        if model is not None:
            return found(model, "query_sd_model_checkpoint")
    model = _header(headers, MODEL_HEADER)
    if model is not None:
        return found(model, "header")
    if route.model_required:
        raise SelectorError("model is required")
    return SelectorResult(None, None, payload, form)


# --------------------------------------------------------------------------- replacement


def _image_places(text: str, members: list[Member]) -> list[Member]:
    """The image selector places in priority order: model, sd_model_checkpoint, overrides."""
    places = [m for m in members if m.key == "model"]
    places += [m for m in members if m.key == "sd_model_checkpoint"]
    for m in members:
        if m.key == "override_settings":
            places += [n for n in nested_members(text, m) if n.key == "sd_model_checkpoint"]
    return places


def _replace_json(route: Route, body: bytes, new_model: str, old_model: str | None) -> bytes:
    if not body.strip():
        return body
    try:
        text = body.decode("utf-8")
        members, brace = object_members(text)
    except RecursionError:
        raise SelectorError("invalid JSON body: nested too deeply") from None
    except ValueError as exc:
        raise SelectorError(f"invalid JSON body: {exc}") from None
    literal = json.dumps(new_model)
    edits: list[tuple[int, int, str]] = []
    model_members = [m for m in members if m.key == "model"]
    if route.runtime == "image":
        places = _image_places(text, members)
        named = [p for p in places if isinstance(p.value, str) and p.value]
        if old_model is None and named:
            old_model = named[0].value
        edits = [(p.start, p.end, literal) for p in named if p.value == old_model]
        if edits or named:
            # Places naming something else are left alone (cluster spec §5.4).
            return splice(text, edits).encode("utf-8") if edits else body
    # Text/audio, or an image body that names no model anywhere: set the top-level ``model``.
    if model_members:
        edits = [(m.start, m.end, literal) for m in model_members]
    else:
        separator = ", " if members else ""
        edits = [(brace + 1, brace + 1, f'"model": {literal}{separator}')]
    return splice(text, edits).encode("utf-8")


def _replace_form(body: bytes, content_type: str, new_model: str) -> bytes:
    try:
        parts = parse_form(body, content_type)
        boundary = boundary_of(content_type)
    except MultipartError as exc:
        raise SelectorError(f"invalid multipart body: {exc}") from None
    value = new_model.encode("utf-8")
    targets = [p for p in parts if p.name == "model" and p.filename is None]
    if targets:
        out: list[bytes] = []
        last = 0
        for part in targets:
            out += [body[last : part.start], value]
            last = part.end
        out.append(body[last:])
        return b"".join(out)
    new_part = Part(name="model", data=value)
    if not parts:
        return build_form([new_part], boundary)
    # Insert a whole new part between the last part's data and the closing delimiter.
    inserted = b"\r\n--" + boundary + b"\r\n" + part_header(new_part) + b"\r\n\r\n" + value
    end = parts[-1].end
    return body[:end] + inserted + body[end:]


def replace_model(
    route: Route,
    body: bytes,
    content_type: str,
    new_model: str,
    *,
    old_model: str | None = None,
) -> bytes:
    """``body`` with its model selector set to ``new_model`` (public ID -> the replica's local ID).

    * JSON, text/audio routes: every top-level ``model`` member gets ``new_model``; with none, a
      ``model`` member is inserted first in the object.
    * JSON, image routes: ``model``, ``sd_model_checkpoint`` and
      ``override_settings.sd_model_checkpoint`` are replaced where they equal ``old_model``
      (default: the body's own selector); when the body names no model at all, ``model`` is set.
    * multipart: the ``model`` field's data is replaced (a ``model`` field is appended if absent).

    Only the selector's bytes change; the rest of the body stays byte-identical.  An empty
    body is returned unchanged.  Raises :class:`SelectorError` for an unparsable body.
    """
    if is_multipart(content_type):
        return _replace_form(body, content_type, new_model)
    return _replace_json(route, body, new_model, old_model)
