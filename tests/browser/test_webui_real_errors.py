"""The WebUI's Errors page on a real failed load: a GGUF the real llama-server refuses (cut short) shows
llama.cpp's own cause in the row an operator reads, not only "exit code 1".  One standalone node on the real
llama-server (the real-backend tier's servers and generated models), headless Chromium.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
import pytest_twisted
import treq

from tests.browser.webui import Browser, browsing
from tests.integration.nodes import RunningNode, start_node
from tests.integration.real_backends import RealServers, TinyModels, real_node_config

pytestmark = [pytest.mark.slow, pytest.mark.real]


@attrs.define
class Solo:
    node: RunningNode
    browser: Browser


@pytest_twisted.async_yield_fixture
async def solo(tmp_path: Path, real_servers: RealServers, tiny_models: TinyModels) -> AsyncIterator[Solo]:
    models = {"tiny": {"model": tiny_models.tiny, "contextsize": 512},
              "truncated": {"model": tiny_models.truncated, "contextsize": 512}}
    extra = {"analytics": {"enabled": True}, "cluster": {"node_id": "solo"}}
    node = await start_node(real_node_config(tmp_path, real_servers, models, extra))
    async with browsing(node) as browser:
        yield Solo(node, browser)


def errors_page_shows_llama_cpps_own_cause(b: Browser) -> None:
    b.open("")
    b.tab("errors")
    row = b.wait_text("tr.load-error", "truncated")
    assert "error loading model" in row, row
    assert "data is not within the file bounds" in row, row
    b.screenshot("errors-real")


async def test_the_errors_page_shows_the_real_backends_own_reason_for_a_failed_load(solo: Solo) -> None:
    chat = {"model": "truncated", "messages": [{"role": "user", "content": "hi"}]}
    response = await treq.post(solo.node.url + "/v1/chat/completions", json=chat)
    assert response.code == 502, await response.text()
    flushed = await treq.post(solo.node.url + "/router/v1/site/analytics/flush", json={})
    assert flushed.code == 200
    await solo.browser.do(errors_page_shows_llama_cpps_own_cause, solo.browser)
