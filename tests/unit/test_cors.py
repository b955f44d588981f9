"""CORS (``server.cors_origins``): listed origins get CORS headers and preflight answers; others
do not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from routerd.config.load import ConfigError, parse_config
from tests.unit.node_fixture import TEXT, World

ORIGIN = "https://chat.example.internal"
PREFLIGHT = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type"}


def _node(tmp_path: Path, origins: list[str]) -> tuple[World, object]:
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT}, server={"cors_origins": origins},
                      auth={"inference_keys": ["inference-key-0123456789abcdef"]})
    world.start(node)
    return world, node


def _header(response: object, name: str) -> str | None:
    values = response.headers.getRawHeaders(name)  # type: ignore[attr-defined]
    return values[0] if values else None


def test_a_listed_origins_preflight_is_answered_without_a_key(tmp_path: Path) -> None:
    world, node = _node(tmp_path, [ORIGIN])
    response, body = world.call("OPTIONS", node, "/v1/chat/completions", headers=PREFLIGHT)
    assert response.code == 204 and body == b""
    assert _header(response, "Access-Control-Allow-Origin") == ORIGIN
    assert "POST" in (_header(response, "Access-Control-Allow-Methods") or "")
    assert _header(response, "Access-Control-Allow-Headers") == "authorization, content-type"


def test_an_unlisted_origins_preflight_is_refused_without_cors_headers(tmp_path: Path) -> None:
    world, node = _node(tmp_path, [ORIGIN])
    response, body = world.call("OPTIONS", node, "/v1/chat/completions",
                                headers={**PREFLIGHT, "Origin": "https://evil.example"})
    assert response.code == 403 and "cors_origins" in json.loads(body)["error"]["message"]
    assert _header(response, "Access-Control-Allow-Origin") is None


def test_a_listed_origins_request_carries_the_allow_origin_header_even_on_an_error(tmp_path: Path) -> None:
    world, node = _node(tmp_path, [ORIGIN])
    ok, _ = world.call("GET", node, "/v1/models", headers={
        "Origin": ORIGIN, "Authorization": "Bearer inference-key-0123456789abcdef"})
    assert ok.code == 200 and _header(ok, "Access-Control-Allow-Origin") == ORIGIN
    assert "X-Routerd-Node" in (_header(ok, "Access-Control-Expose-Headers") or "")
    refused, _ = world.call("GET", node, "/v1/models", headers={"Origin": ORIGIN})
    assert refused.code == 401 and _header(refused, "Access-Control-Allow-Origin") == ORIGIN
    other, _ = world.call("GET", node, "/v1/models", headers={
        "Origin": "https://evil.example", "Authorization": "Bearer inference-key-0123456789abcdef"})
    assert other.code == 200 and _header(other, "Access-Control-Allow-Origin") is None


def test_without_cors_origins_no_preflight_is_answered(tmp_path: Path) -> None:
    world, node = _node(tmp_path, [])
    response, _ = world.call("OPTIONS", node, "/v1/chat/completions", headers=PREFLIGHT)
    assert response.code != 204 and _header(response, "Access-Control-Allow-Origin") is None


def test_cors_origins_must_be_origins() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"server": {"cors_origins": ["https://ok.example:8443", "chat.example/path"]},
                      "models": {"config_dir": "."}}, base_dir="/", env={})
    assert "'chat.example/path'" in str(err.value) and "ok.example" not in str(err.value)
    config = parse_config({"server": {"cors_origins": ["*", "https://a.example/"]},
                           "models": {"config_dir": "."}}, base_dir="/", env={})
    assert config.server.cors_origins == ("*", "https://a.example")
