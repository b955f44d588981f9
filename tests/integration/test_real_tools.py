"""Tool calls through routerd with the official ``anthropic`` and ``openai`` SDKs, against the real
llama-server: Messages, Responses and chat completions, each forced, streamed and continued with the tool's
result (:mod:`tests.integration.sdk_tools`).

The model is the tool-calling tiny GGUF (``TinyModels.tools``): its template knows tools (llama-server b11434
ignores ``tools`` under a template that does not) and it answers every chat with a ``get_weather`` call of
``{"city": "Paris"}``, so its second turn is a call again; what shows the tool's result was read is the
second prompt's length.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import anthropic
import openai
import pytest
import pytest_twisted
from twisted.internet.threads import deferToThread

from tests.integration.nodes import RunningNode, start_node
from tests.integration.real_backends import RealServers, TinyModels, real_node_config
from tests.integration.sdk_tools import chat_tool_flow, messages_tool_flow, responses_tool_flow
from tests.support_models.llama_gguf import TOOL_ARGUMENTS

pytestmark = [pytest.mark.slow, pytest.mark.real]


@pytest_twisted.async_yield_fixture(scope="module")
async def node(tmp_path_factory: pytest.TempPathFactory, real_servers: RealServers,
               tiny_models: TinyModels) -> AsyncIterator[RunningNode]:
    # the tools' system prompt is ~570 of the tiny tokenizer's tokens: one slot of 2048
    models = {"caller": {"model": tiny_models.tools, "contextsize": 2048, "parallel": 1}}
    running = await start_node(real_node_config(tmp_path_factory.mktemp("real-tools"), real_servers, models))
    yield running
    await running.stop()


async def test_anthropic_sdk_tool_use_on_the_real_llama_server(node: RunningNode) -> None:
    client = anthropic.Anthropic(base_url=node.url, api_key="unused", max_retries=0)
    turns = await deferToThread(messages_tool_flow, client, "caller")
    assert turns.second_input > turns.first_input
    block = turns.second.content[-1]
    assert block.type == "tool_use" and block.input == json.loads(TOOL_ARGUMENTS)


async def test_openai_sdk_responses_function_call_on_the_real_llama_server(node: RunningNode) -> None:
    client = openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0)
    turns = await deferToThread(responses_tool_flow, client, "caller")
    assert turns.second_input > turns.first_input
    assert turns.second.output[-1].type == "function_call"
    assert turns.second.output[-1].arguments == TOOL_ARGUMENTS


async def test_openai_sdk_chat_tool_calls_on_the_real_llama_server(node: RunningNode) -> None:
    client = openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0)
    turns = await deferToThread(chat_tool_flow, client, "caller")
    assert turns.second_input > turns.first_input
    calls = turns.second.choices[0].message.tool_calls
    assert calls and calls[0].function.arguments == TOOL_ARGUMENTS
