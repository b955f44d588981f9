"""``GET /openapi.json``: the hand-kept OpenAPI document (``routerd/api/openapi.yaml``, shipped as
package data) rendered as JSON.  Key-free like ``/health``'s unauthenticated view — it describes
the API, not the node — but, like every path, only to callers on ``server.allowed_cidrs``."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

import yaml
from twisted.web.iweb import IRequest

from routerd.api.facts import EVERY_PHASE
from routerd.api.routes import Routes

OPENAPI_PATH = "/openapi.json"


@cache
def openapi_document() -> dict[str, Any]:
    """The document as a JSON-ready mapping (YAML aliases resolved)."""
    text = resources.files("routerd.api").joinpath("openapi.yaml").read_text(encoding="utf-8")
    loaded: dict[str, Any] = yaml.safe_load(text)
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
