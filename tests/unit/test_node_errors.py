"""One test per error class a node answers on the request path: status and JSON envelope.

OpenAI paths answer ``{"error": {"message", "type", "code"}}``; Ollama ``/api/*`` paths answer
``{"error": "..."}`` (contract §4).  Every node here is real (``node_fixture.World``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from twisted.logger import LogLevel, globalLogPublisher

from routerd.node import Node
from tests.unit.node_fixture import TEXT, World

MESSAGES = [{"role": "user", "content": "hello"}]
KEY = "unit-test-inference-key-42"


def solo(tmp_path: Path, **sections: dict[str, Any]) -> tuple[World, Node]:
    world = World(tmp_path)
    broken = {**TEXT, "kcpps": {"extra_args": ["--sim-fail-load"]}}  # its backend exits while loading
    node = world.node("solo", {"chat": TEXT, "broken": broken}, **sections)
    world.start(node)
    return world, node


def openai_error(body: bytes) -> dict[str, Any]:
    """The error object of an OpenAI envelope, checking it has exactly its three fields."""
    answer = json.loads(body)
    assert set(answer) == {"error"}
    error: dict[str, Any] = answer["error"]
    assert set(error) == {"message", "type", "code"}
    assert isinstance(error["message"], str) and error["message"]
    return error


def ollama_error(body: bytes) -> str:
    answer = json.loads(body)
    assert set(answer) == {"error"}
    assert isinstance(answer["error"], str) and answer["error"]
    return str(answer["error"])


def test_an_unknown_model_is_404_model_not_found(tmp_path: Path) -> None:
    world, node = solo(tmp_path)
    response, body = world.call("POST", node, "/v1/chat/completions",
                                json={"model": "nope", "messages": MESSAGES})

    assert response.code == 404
    error = openai_error(body)
    assert (error["type"], error["code"]) == ("not_found", "model_not_found")
    assert "'nope'" in error["message"]
    assert world.launcher.spawned == []


def test_an_unknown_model_on_an_ollama_path_is_404_with_an_ollama_envelope(tmp_path: Path) -> None:
    world, node = solo(tmp_path)
    response, body = world.call("POST", node, "/api/chat", json={"model": "nope", "messages": MESSAGES})

    assert response.code == 404
    assert "'nope'" in ollama_error(body)


def test_a_body_that_is_not_json_is_400(tmp_path: Path) -> None:
    world, node = solo(tmp_path)
    response, body = world.call("POST", node, "/v1/chat/completions", data=b'{"model": "chat",',
                                headers={b"content-type": [b"application/json"]})

    assert response.code == 400
    assert openai_error(body)["type"] == "invalid_request_error"
    assert world.launcher.spawned == []


def test_a_missing_model_where_one_is_required_is_400(tmp_path: Path) -> None:
    world, node = solo(tmp_path)
    response, body = world.call("POST", node, "/v1/chat/completions", json={"messages": MESSAGES})

    assert response.code == 400
    error = openai_error(body)
    assert error["type"] == "invalid_request_error"
    assert error["message"] == "model is required"


def test_a_missing_model_on_ollama_chat_is_400_with_an_ollama_envelope(tmp_path: Path) -> None:
    world, node = solo(tmp_path)
    response, body = world.call("POST", node, "/api/chat", json={"messages": MESSAGES})

    assert response.code == 400
    assert ollama_error(body) == "model is required"


def test_a_wrong_method_on_an_inference_path_is_405_naming_the_allowed_one(tmp_path: Path) -> None:
    world, node = solo(tmp_path)
    response, body = world.call("GET", node, "/v1/chat/completions")

    assert response.code == 405
    assert response.headers.getRawHeaders(b"allow") == [b"POST"]
    error = openai_error(body)
    assert (error["type"], error["code"]) == ("method_not_allowed", "method_not_allowed")


def test_an_unknown_path_is_404_not_found(tmp_path: Path) -> None:
    world, node = solo(tmp_path)
    response, body = world.call("POST", node, "/v1/no/such/thing", json={"model": "chat"})

    assert response.code == 404
    error = openai_error(body)
    assert (error["type"], error["code"]) == ("not_found", "not_found")


def test_a_body_over_the_limit_is_413_before_the_app_sees_it(tmp_path: Path) -> None:
    world, node = solo(tmp_path, limits={"max_body_mb": 0.001})  # 1048 bytes
    big = json.dumps({"model": "chat", "messages": [{"role": "user", "content": "x" * 2000}]})
    response, body = world.call("POST", node, "/v1/chat/completions", data=big.encode(),
                                headers={b"content-type": [b"application/json"]})

    assert response.code == 413
    error = openai_error(body)
    assert (error["type"], error["code"]) == ("request_too_large", "request_too_large")
    assert world.launcher.spawned == []


def test_a_request_without_an_inference_key_is_401_when_keys_are_configured(tmp_path: Path) -> None:
    world, node = solo(tmp_path, auth={"inference_keys": [KEY]})
    request = {"model": "chat", "messages": MESSAGES, "max_tokens": 2}

    refused, body = world.call("POST", node, "/v1/chat/completions", json=request)
    allowed, _ = world.call("POST", node, "/v1/chat/completions", json=request,
                            headers={b"authorization": [b"Bearer " + KEY.encode()]})

    assert refused.code == 401
    error = openai_error(body)
    assert (error["type"], error["code"]) == ("unauthorized", "unauthorized")
    assert allowed.code == 200


def test_a_missing_key_on_an_ollama_path_is_401_with_an_ollama_envelope(tmp_path: Path) -> None:
    world, node = solo(tmp_path, auth={"inference_keys": [KEY]})
    response, body = world.call("POST", node, "/api/chat", json={"model": "chat", "messages": MESSAGES})

    assert response.code == 401
    assert "key" in ollama_error(body)


def test_a_backend_that_fails_to_load_is_502_load_failed(tmp_path: Path) -> None:
    world, node = solo(tmp_path)
    response, body = world.call("POST", node, "/v1/chat/completions",
                                json={"model": "broken", "messages": MESSAGES})

    assert response.code == 502
    error = openai_error(body)
    assert (error["type"], error["code"]) == ("backend_error", "load_failed")
    assert "'broken'" in error["message"]
    [process] = world.launcher.spawned
    assert process.code == 1  # the simulated backend exited during its load


def test_a_failed_load_is_recorded_as_a_failed_load_and_a_failed_request(tmp_path: Path) -> None:
    world, node = solo(tmp_path)
    world.call("POST", node, "/v1/chat/completions", json={"model": "broken", "messages": MESSAGES})

    store = world.stores["solo"]
    loads = world.run(store.load_samples(0, status=None))
    requests = world.run(store.request_samples(None, "llm", 0, status=None))

    assert [(s.model_id, s.status) for s in loads] == [("broken", "failed")]
    assert [(s.model_id, s.status, s.http_status) for s in requests] == [("broken", "load_failed", 502)]


def test_after_a_failed_load_the_same_node_still_serves_other_models(tmp_path: Path) -> None:
    world, node = solo(tmp_path)
    world.call("POST", node, "/v1/chat/completions", json={"model": "broken", "messages": MESSAGES})
    response, body = world.call("POST", node, "/v1/chat/completions",
                                json={"model": "chat", "messages": MESSAGES, "max_tokens": 2})

    assert response.code == 200
    assert json.loads(body)["model"] == "chat"


def test_a_backends_own_400_reaches_the_client_with_its_status_in_an_openai_envelope(tmp_path: Path) -> None:
    world, node = solo(tmp_path)
    response, body = world.call("POST", node, "/v1/chat/completions",
                                json={"model": "chat", "messages": "not a list"})

    assert response.code == 400
    answer = json.loads(body)
    assert set(answer["error"]) >= {"message", "type", "code"}
    assert "messages" in answer["error"]["message"]
    assert response.headers.getRawHeaders(b"x-routerd-node") == [b"solo"]
    [process] = world.launcher.spawned  # the backend itself refused it
    assert process.running


def test_a_backends_own_400_on_an_ollama_path_becomes_an_ollama_envelope(tmp_path: Path) -> None:
    """The backend refuses a prompt longer than its context; the Ollama client gets its own shape."""
    world = World(tmp_path)
    node = world.node("solo", {"short": {**TEXT, "context": 16}})
    world.start(node)
    response, body = world.call("POST", node, "/api/generate",
                                json={"model": "short", "prompt": "word " * 40, "stream": False})

    assert response.code == 400
    assert "context size" in ollama_error(body)
    assert len(world.launcher.spawned) == 1  # the backend, not the node, refused it


def _log_events() -> tuple[list[dict[str, Any]], Callable[[], None]]:
    seen: list[dict[str, Any]] = []
    globalLogPublisher.addObserver(seen.append)
    return seen, lambda: globalLogPublisher.removeObserver(seen.append)


def _chat_logged(world: Any, node: Any) -> tuple[list[dict[str, Any]], Any, Any]:
    """One chat request through ``node``, with every log event emitted meanwhile."""
    seen, stop = _log_events()
    try:
        response, body = world.call("POST", node, "/v1/chat/completions",
                                    json={"model": "chat", "messages": MESSAGES})
    finally:
        stop()
    return seen, response, body


def test_a_backend_that_refuses_the_connection_is_one_warning_and_a_502_backend_error(tmp_path: Path) -> None:
    world, node = solo(tmp_path, models={"startup_model": "chat"})
    for port in world.launcher.sims:
        world.network.unplug(f"127.0.0.1:{port}")  # the process is up; its port refuses
    seen, response, body = _chat_logged(world, node)

    assert response.code == 502
    error = openai_error(body)
    assert (error["type"], error["code"]) == ("backend_error", "backend_error")
    assert "refused" in error["message"]
    request_id = response.headers.getRawHeaders(b"x-routerd-request-id")[0].decode()
    warned = [e for e in seen if e.get("request_id") == request_id and e["log_level"] == LogLevel.warn]
    assert len(warned) == 1 and "refused" in warned[0]["reason"]
    assert [e for e in seen if e["log_level"] in (LogLevel.critical, LogLevel.error)] == []


def test_an_unexpected_exception_on_the_request_path_still_logs_its_traceback(tmp_path: Path) -> None:
    """A bug is not an expected backend failure: it is logged critical with its traceback (and the
    client still gets one 502)."""
    world, node = solo(tmp_path, models={"startup_model": "chat"})

    async def bug(*_args: Any, **_kwargs: Any) -> bytes:
        raise ZeroDivisionError("a bug")

    node.local.serve = bug  # type: ignore[method-assign]
    node.lending.run_local = bug  # what a request admitted by the router queue runs
    seen, response, body = _chat_logged(world, node)

    assert response.code == 502
    assert openai_error(body)["code"] == "backend_error"
    failures = [e for e in seen if e["log_level"] == LogLevel.critical and "log_failure" in e]
    assert len(failures) == 1 and failures[0]["log_failure"].check(ZeroDivisionError)
