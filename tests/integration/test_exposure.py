"""A live keyless node on loopback (the embedded default's shape) against what a web page could make
a browser send: the drive-by Cook apply (another origin, ``text/plain``, no preflight) and a chat
under a rebound ``Host`` are refused; curl-shaped calls and same-origin pages are served.  Cook's
backend flags stay on the box, and a megabyte model name is a short 400."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_twisted
import treq

from tests.integration.nodes import FAST_TEXT, RunningNode, node_config, start_node, write_models

DRIVE_BY = {"id": "drive-by", "files": {"model": "ok.sim.json"}, "extra_args": ["--host", "0.0.0.0"]}


@pytest_twisted.async_yield_fixture
async def node(tmp_path: Path) -> AsyncIterator[RunningNode]:
    write_models(tmp_path, {"chat": {"model": "../weights/chat.sim.json"}},
                 {"chat": FAST_TEXT, "ok": FAST_TEXT})
    running = await start_node(node_config(tmp_path, {"models": {"file_roots": [str(tmp_path / "weights")]}}))
    yield running
    await running.stop()


async def post(url: str, body: Any, headers: dict[str, str]) -> tuple[int, Any]:
    response = await treq.post(url, data=json.dumps(body).encode(), headers=headers)
    return response.code, json.loads(await response.content())


@pytest_twisted.ensureDeferred
async def test_a_drive_by_from_another_origin_is_refused_and_changes_nothing(
        node: RunningNode, tmp_path: Path) -> None:
    code, body = await post(node.url + "/router/v1/site/cook/apply", DRIVE_BY, {
        "Content-Type": "text/plain;charset=UTF-8", "Origin": "https://evil.example",
        "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"})
    assert code == 403 and body["error"]["code"] == "cross_origin", body
    assert not (tmp_path / "models" / "drive-by.kcpps").exists()
    code, body = await post(node.url + "/v1/chat/completions", {"model": "chat", "messages": []}, {
        "Content-Type": "application/json", "Host": "rebound.evil.example:8080",
        "Origin": "http://rebound.evil.example:8080"})
    assert code == 421 and body["error"]["code"] == "unknown_host", body


@pytest_twisted.ensureDeferred
async def test_curl_and_the_nodes_own_pages_are_served(node: RunningNode) -> None:
    chat = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    code, body = await post(node.url + "/v1/chat/completions", chat, {"Content-Type": "application/json"})
    assert code == 200 and body["choices"], body
    order = {"id": "brewed", "files": {"model": "ok.sim.json"}}
    code, body = await post(node.url + "/router/v1/site/cook/preview", order, {
        "Content-Type": "application/json", "Origin": node.url, "Sec-Fetch-Site": "same-origin"})
    assert code == 200 and body["check"]["ok"], body


@pytest_twisted.ensureDeferred
async def test_backend_flags_cannot_leave_the_box_and_huge_model_names_are_refused(
        node: RunningNode, tmp_path: Path) -> None:
    json_type = {"Content-Type": "application/json"}
    for args in (["--host", "0.0.0.0"], ["-m", "/outside/secret.txt"]):
        order = {"id": "flagged", "files": {"model": "ok.sim.json"}, "extra_args": args}
        code, body = await post(node.url + "/router/v1/site/cook/apply", order, json_type)
        assert code == 400 and body["error"]["code"] == "unsafe_extra_arg", body
    assert not (tmp_path / "models" / "flagged.kcpps").exists()
    response = await treq.post(node.url + "/v1/chat/completions", headers=json_type,
                               data=json.dumps({"model": "x" * (1 << 20), "messages": []}).encode())
    content = await response.content()
    assert response.code == 400 and len(content) < 500 and b"256 bytes" in content
