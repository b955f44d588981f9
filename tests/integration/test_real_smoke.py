"""Smoke: a standalone node on the real llama-server answers a chat with the tiny model's known sentence."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.nodes import post, start_node
from tests.integration.real_backends import LLAMA_ANSWER, RealServers, TinyModels, real_node_config

pytestmark = [pytest.mark.slow, pytest.mark.real]


async def test_a_chat_through_routerd_is_answered_by_the_real_llama_server(
        tmp_path: Path, real_servers: RealServers, tiny_models: TinyModels) -> None:
    models = {"tiny": {"model": tiny_models.tiny, "contextsize": 512}}
    config = real_node_config(tmp_path, real_servers, models)
    running = await start_node(config)
    try:
        status, body, _ = await post(running.url + "/v1/chat/completions",
                                     {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
        assert status == 200, body
        assert body["choices"][0]["message"]["content"] == LLAMA_ANSWER
    finally:
        await running.stop()
