"""The hand-kept OpenAPI document (``routerd/api/openapi.yaml``): it is a valid OpenAPI 3 document,
it lists exactly the routes the API declares (so it cannot drift silently), every error answer
it describes is the contract's envelope for its path, and every node serves it at
``/openapi.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from openapi_spec_validator import validate

from routerd.api.openapi import openapi_document
from routerd.edge import build_site
from routerd.errors import style_for_path

from .node_fixture import TEXT, World


def registered_operations(tmp_path: Path) -> set[tuple[str, str]]:
    """Every (path template, method) a node's API answers, read from the running site's route
    table (what its dispatcher is built from)."""
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT})
    site = build_site(node)
    dispatch = site.resource.inner  # GuardResource → Dispatch
    return {(path, method.lower()) for declared in dispatch.routes.routes
            for path in declared.docs for method in declared.answered - {"HEAD", "OPTIONS"}}


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
    """4XX/5XX answers name the OpenAI envelope, the Ollama one on Ollama paths, Anthropic's on the
    Messages API's; every operation but /health (whose 503 is its own status document) describes its
    4XX errors."""
    components = openapi_document()["components"]
    want = {"ollama": "OllamaError", "anthropic": "AnthropicError"}.get(style_for_path(path), "Error")
    for method, operation in openapi_document()["paths"][path].items():
        errors = _error_refs(operation)
        assert "4XX" in errors, f"{method} {path} lists no 4XX answer"
        for code, answer in errors.items():
            assert answer == {"$ref": f"#/components/responses/{want}"}, (method, path, code)
    envelope = components["schemas"][want]
    assert envelope["required"] == (["type", "error"] if want == "AnthropicError" else ["error"])


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
