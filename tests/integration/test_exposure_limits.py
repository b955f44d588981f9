"""A live node on loopback against clients that try to pin what every client shares: a key that
trickles two 8 MiB bodies no longer fills the replay budget for another key, and idle connections
from outside ``server.allowed_cidrs`` (from 127.0.0.2, which the config leaves out) no longer take
the connections of the clients inside; behind a trusted proxy the access line names the client
admission decided."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.logger import capturedLogs

from tests.integration.nodes import FAST_TEXT, RunningNode, node_config, start_node, write_models
from tests.integration.rawhttp import RawClient

SLOW = "slow-key-0123456789"
OTHER = "other-key-0123456789"
CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


async def start(tmp_path: Path, extra: dict[str, Any]) -> RunningNode:
    write_models(tmp_path, {"chat": {"model": "../weights/chat.sim.json"}}, {"chat": FAST_TEXT})
    return await start_node(node_config(tmp_path, extra))


@pytest_twisted.async_yield_fixture
async def keyed_node(tmp_path: Path) -> AsyncIterator[RunningNode]:
    running = await start(tmp_path, {"auth": {"inference_keys": [SLOW, OTHER]},
                                     "limits": {"max_body_mb": 8, "replay_buffer_mb": 16}})
    yield running
    await running.stop()


@pytest_twisted.async_yield_fixture
async def fenced_node(tmp_path: Path) -> AsyncIterator[RunningNode]:
    running = await start(tmp_path, {"server": {"bind": "127.0.0.1:0", "allowed_cidrs": ["127.0.0.1/32"],
                                                "max_connections": 16}})
    yield running
    await running.stop()


def port_of(node: RunningNode) -> int:
    return int(node.service.port.getHost().port)


async def open_raw(port: int, source: str = "127.0.0.1") -> RawClient:
    client = RawClient()
    endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port, bindAddress=(source, 0))
    await connectProtocol(endpoint, client)
    return client


async def chat(node: RunningNode, key: str | None = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    response = await treq.post(node.url + "/v1/chat/completions", data=json.dumps(CHAT).encode(),
                               headers=headers)
    return response.code, json.loads(await response.content())


@pytest_twisted.ensureDeferred
async def test_a_key_trickling_two_large_bodies_no_longer_starves_another_key(
        keyed_node: RunningNode) -> None:
    tricklers = []
    for _ in range(2):
        client = await open_raw(port_of(keyed_node))
        assert client.transport is not None
        client.transport.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                               b"Authorization: Bearer " + SLOW.encode() + b"\r\n"
                               b"Content-Type: application/json\r\nContent-Length: 8388608\r\n\r\n{")
        tricklers.append(client)
    try:
        await treq.get(keyed_node.url + "/health")  # both heads have been admitted or refused by now
        # the second declared body is over the slow key's share of the budget: refused at its head
        assert [client.status for client in tricklers] == [0, 503]
        assert b"buffer_full" in tricklers[1].received
        code, body = await chat(keyed_node, OTHER)
        assert code == 200 and body["choices"], body
    finally:
        for client in tricklers:
            client.drop()


@pytest_twisted.ensureDeferred
async def test_idle_connections_from_outside_the_cidrs_do_not_take_the_connections_of_clients_inside(
        fenced_node: RunningNode) -> None:
    outsiders = [await open_raw(port_of(fenced_node), "127.0.0.2") for _ in range(24)]
    try:
        await treq.get(fenced_node.url + "/health")
        refused = [client for client in outsiders if client.status]
        assert len(refused) == 8 and all(client.status == 503 for client in refused)  # beyond 16 outsiders
        for _ in range(3):
            code, body = await chat(fenced_node)
            assert code == 200 and body["choices"], body
    finally:
        for client in outsiders:
            client.drop()


@pytest_twisted.ensureDeferred
async def test_the_access_line_behind_a_trusted_proxy_names_the_forwarded_client(tmp_path: Path) -> None:
    node = await start(tmp_path, {"server": {"bind": "127.0.0.1:0", "trusted_proxies": ["127.0.0.1/32"]}})
    try:
        with capturedLogs() as events:
            response = await treq.post(node.url + "/v1/chat/completions", data=json.dumps(CHAT).encode(),
                                       headers={"Content-Type": "application/json",
                                                "X-Forwarded-For": "10.9.8.7"})
            await response.content()
            await treq.get(node.url + "/health", headers={"X-Forwarded-For": "192.168.4.5"})
        lines = [e for e in events if e.get("log_namespace") == "routerd.access"]
        assert response.code == 200
        assert [(e["path"], e["client"]) for e in lines] == [("/v1/chat/completions", "10.9.8.7"),
                                                            ("/health", "192.168.4.5")]
    finally:
        await node.stop()
