"""``GET /openapi.json``: the hand-kept OpenAPI document (``routerd/api/openapi.yaml``, shipped as
package data) rendered as JSON.  Key-free like ``/health``'s unauthenticated view — it describes
the API, not the node — but, like every path, only to callers on ``server.allowed_cidrs``.

The document names no backend family itself: a schema marked ``x-backend-modes: true`` is given
the declared families' names as its ``enum`` when the document is read (:mod:`routerd.families`),
so a new family appears in it without an edit here."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

import yaml
from twisted.web.iweb import IRequest

from routerd.api.facts import EVERY_PHASE
from routerd.api.routes import Routes
from routerd.families import backend_modes

OPENAPI_PATH = "/openapi.json"
#: The mark of a schema whose ``enum`` is every declared backend mode.
BACKEND_MODES_MARK = "x-backend-modes"


def _with_backend_modes(node: Any) -> Any:
    """``node`` with every schema marked :data:`BACKEND_MODES_MARK` enumerating the declared modes."""
    if isinstance(node, dict):
        out = {key: _with_backend_modes(value) for key, value in node.items() if key != BACKEND_MODES_MARK}
        if node.get(BACKEND_MODES_MARK):
            out["enum"] = list(backend_modes())
        return out
    if isinstance(node, list):
        return [_with_backend_modes(item) for item in node]
    return node


@cache
def openapi_document() -> dict[str, Any]:
    """The document as a JSON-ready mapping (YAML aliases resolved, the declared modes filled in)."""
    text = resources.files("routerd.api").joinpath("openapi.yaml").read_text(encoding="utf-8")
    loaded: dict[str, Any] = _with_backend_modes(yaml.safe_load(text))
    return loaded


@cache
def _rendered() -> bytes:
    return json.dumps(openapi_document()).encode()


class OpenAPI:
    routes = Routes()

    @routes.route(OPENAPI_PATH, methods=["GET"], auth="docs", phases=EVERY_PHASE)
    def document(self, request: IRequest) -> bytes:
        request.setHeader(b"content-type", b"application/json")
        return _rendered()


__all__ = ["OPENAPI_PATH", "OpenAPI", "openapi_document"]
