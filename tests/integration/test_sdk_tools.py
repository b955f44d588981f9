"""Tool calls through routerd with the official ``anthropic`` and ``openai`` SDKs, against the simulated
llama-server: Messages (``tool_use``, ``input_json_delta``, then a ``tool_result``), Responses
(``function_call`` items and argument deltas, then a ``function_call_output``) and chat completions
(``tool_calls``, then a ``role: tool`` message), each forced, streamed and continued
(:mod:`tests.integration.sdk_tools`).  The simulator answers the tool's result with text (its rule,
:mod:`routerd.sim.tools`: unforced, it calls only a tool the user's last text names)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anthropic
import openai
import pytest_twisted
from twisted.internet.threads import deferToThread

from tests.integration.nodes import FAST_TEXT, RunningNode, node_config, start_node, write_models
from tests.integration.sdk_tools import (
    RESULT,
    chat_tool_flow,
    messages_tool_flow,
    responses_tool_flow,
)


@pytest_twisted.async_yield_fixture
async def node(tmp_path: Path) -> AsyncIterator[RunningNode]:
    write_models(tmp_path, {"talker": {"model": "../weights/talker.sim.json", "contextsize": 4096}},
                 {"talker": FAST_TEXT})
    running = await start_node(node_config(tmp_path))
    yield running
    await running.stop()


def openai_client(node: RunningNode) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0)


@pytest_twisted.ensureDeferred
async def test_anthropic_sdk_tool_use_stream_and_tool_result_through_routerd(node: RunningNode) -> None:
    client = anthropic.Anthropic(base_url=node.url, api_key="unused", max_retries=0)
    turns = await deferToThread(messages_tool_flow, client, "talker")
    # the result is read: the second prompt holds the first, the call and RESULT's words
    assert turns.second_input >= turns.first_input + len(RESULT.split())
    assert turns.second.stop_reason == "max_tokens" and turns.second.content[0].type == "text"


@pytest_twisted.ensureDeferred
async def test_openai_sdk_responses_function_call_stream_and_output_through_routerd(
        node: RunningNode) -> None:
    turns = await deferToThread(responses_tool_flow, openai_client(node), "talker")
    assert turns.second_input >= turns.first_input + len(RESULT.split())
    assert turns.second.output[-1].type == "message" and turns.second.output_text


@pytest_twisted.ensureDeferred
async def test_openai_sdk_chat_tool_calls_stream_and_tool_message_through_routerd(node: RunningNode) -> None:
    turns = await deferToThread(chat_tool_flow, openai_client(node), "talker")
    assert turns.second_input >= turns.first_input + len(RESULT.split())
    choice = turns.second.choices[0]
    assert choice.finish_reason == "length" and choice.message.content and not choice.message.tool_calls
