"""Keys and the cluster token on a real node over HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest_twisted
import treq

from tests.integration.nodes import FAST_TEXT, RunningNode, node_config, start_node, write_models

INF = "inference-key-0123456789"
ADM = "admin-key-0123456789abc"
TOKEN = "cluster-token-0123456789"


@pytest_twisted.async_yield_fixture
async def node(tmp_path: Path) -> AsyncIterator[RunningNode]:
    write_models(tmp_path, {"alpha": {"model": "../weights/alpha.sim.json"}}, {"alpha": FAST_TEXT})
    config = node_config(tmp_path, {"auth": {"inference_keys": [INF], "admin_keys": [ADM]},
                                    "cluster": {"token": TOKEN}})
    running = await start_node(config)
    yield running
    await running.stop()


def _auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@pytest_twisted.ensureDeferred
async def test_each_route_class_needs_its_own_credential(node: RunningNode) -> None:
    url = node.url
    assert (await treq.get(url + "/v1/models")).code == 401
    assert (await treq.get(url + "/v1/models", headers=_auth(ADM))).code == 200  # admin opens inference
    assert (await treq.get(url + "/v1/models", headers=_auth(INF))).code == 200
    assert (await treq.get(url + "/router/v1/models", headers=_auth(INF))).code == 401
    assert (await treq.get(url + "/router/v1/models", headers=_auth(ADM))).code == 200
    assert (await treq.get(url + "/router/v1/node/state", headers=_auth(ADM))).code == 401
    state = await treq.get(url + "/router/v1/node/state", headers=_auth(TOKEN))
    assert state.code == 200
    assert (await state.json())["node_id"] == "local"
    ollama = await treq.get(url + "/api/tags")
    assert ollama.code == 401 and isinstance((await ollama.json())["error"], str)
    health = await treq.get(url + "/health")
    assert health.code == 200
    assert await health.json() == {"status": "ok"}  # no node details without a key
    detailed = await (await treq.get(url + "/health", headers=_auth(INF))).json()
    assert detailed == {"status": "ok", "node_id": "local", "role": "standalone"}
    assert (await treq.get(url + "/metrics")).code == 401
    assert (await treq.get(url + "/metrics", headers=_auth(INF))).code == 401
    assert (await treq.get(url + "/metrics", headers=_auth(ADM))).code == 200


@pytest_twisted.ensureDeferred
async def test_a_key_authorised_chat_is_served(node: RunningNode) -> None:
    response = await treq.post(node.url + "/v1/chat/completions", headers=_auth(INF), json={
        "model": "alpha", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert response.code == 200
    assert (await response.json())["model"] == "alpha"
