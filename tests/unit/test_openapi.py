"""The hand-kept OpenAPI document (``routerd/api/openapi.yaml``): it is a valid OpenAPI 3 document,
it lists exactly the routes the API registers (so it cannot drift silently), every error answer
it describes is the contract's envelope for its path, and every node serves it at
``/openapi.json``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from openapi_spec_validator import validate

from routerd.api.app import build_site
from routerd.api.openapi import openapi_document
from routerd.errors import style_for_path
from routerd.routing.classify import allowed_methods

from .node_fixture import TEXT, World

#: Catch-all rules that only exist to answer 404 in the site envelope: not operations.
_CATCH_ALL = {"/router/v1/site/{path}", "/router/v1/site/"}
#: Klein registers a branch route twice: ``/prefix/`` and ``/prefix/<path:__rest__>``; the
#: document lists the second (``{path}``, or its own name for the parameter).
_BRANCH_ROOTS = {"/router/v1/node/inference/", "/router/v1/node/assets/"}
_RENAMED = {"/router/v1/node/assets/{path}": "/router/v1/node/assets/{sha256}",
            "/ui/{path}": "/ui/{file}"}


def _template(rule: str) -> str:
    """A werkzeug rule as an OpenAPI path template: ``<path:__rest__>`` → ``{path}``."""
    text = re.sub(r"<path:__rest__>", "{path}", rule)
    text = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", text)
    return _RENAMED.get(text, text)


def registered_operations(tmp_path: Path) -> set[tuple[str, str]]:
    """Every (path template, method) a node's API answers, read from the running site's apps."""
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT})
    site = build_site(node)
    dispatch = site.resource.inner  # GuardResource → Dispatch
    found: set[tuple[str, str]] = set()
    for api in dispatch.apis:
        for rule in api.app.url_map.iter_rules():
            if rule.rule in _BRANCH_ROOTS:
                continue
            path = _template(rule.rule)
            if path in _CATCH_ALL:
                continue
            methods = set(rule.methods or ()) - {"HEAD", "OPTIONS"}
            found |= {(path, m.lower()) for m in methods}
    # the inference paths are served without Klein (routerd.api.dispatch.LeanRoutes)
    for raw in dispatch.lean.exact:
        found |= {(raw.decode(), m.lower()) for m in allowed_methods(raw.decode())}
    for prefix, _handler in dispatch.lean.prefixes:
        found.add((prefix.decode() + "{path}", "post"))
    return found


def documented_operations() -> set[tuple[str, str]]:
    methods = {"get", "post", "put", "delete", "patch"}
    return {(path, m) for path, item in openapi_document()["paths"].items() for m in item if m in methods}


def test_the_document_is_valid_openapi() -> None:
    validate(json.loads(json.dumps(openapi_document())))


def test_every_registered_route_is_documented_and_every_documented_one_exists(tmp_path: Path) -> None:
    registered = registered_operations(tmp_path)
    documented = documented_operations()
    assert registered - documented == set(), "routes missing from openapi.yaml"
    assert documented - registered == set(), "openapi.yaml lists routes the API does not answer"


def _error_refs(operation: dict[str, Any]) -> dict[str, Any]:
    return {code: answer for code, answer in operation["responses"].items()
            if code[0] in "45" and code != "503"}


@pytest.mark.parametrize("path", sorted(openapi_document()["paths"]))
def test_every_error_answer_is_the_envelope_of_its_path_family(path: str) -> None:
    """4XX/5XX answers name the OpenAI envelope, or the Ollama one on Ollama paths; every operation
    but /health (whose 503 is its own status document) describes its 4XX errors."""
    components = openapi_document()["components"]
    want = "OllamaError" if style_for_path(path) == "ollama" else "Error"
    for method, operation in openapi_document()["paths"][path].items():
        errors = _error_refs(operation)
        assert "4XX" in errors, f"{method} {path} lists no 4XX answer"
        for code, answer in errors.items():
            assert answer == {"$ref": f"#/components/responses/{want}"}, (method, path, code)
    envelope = components["schemas"][want]
    assert envelope["required"] == ["error"]


def test_every_node_serves_the_document_as_json_without_a_key(tmp_path: Path) -> None:
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT}, auth={"inference_keys": ["inf-key-000000000"],
                                                     "admin_keys": ["adm-key-000000000"]})
    world.start(node)
    response, body = world.call("GET", node, "/openapi.json")
    assert response.code == 200
    assert response.headers.getRawHeaders(b"content-type") == [b"application/json"]
    assert json.loads(body) == openapi_document()
    assert json.loads(body)["openapi"].startswith("3.")
