"""The official ``anthropic`` and ``openai`` SDKs through routerd to the real llama-server, which speaks
Anthropic's Messages (and token counting), OpenAI's Responses and rerank itself: routerd passes each through
with the model rewritten both ways, counts its tokens from the API's own usage, and keeps no Responses state.

One node serves the module: ``tiny`` (the tiny GGUF) and ``ranker`` (the same GGUF with ``"reranking": true``
in its config: routerd starts it with ``--reranking``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import openai
import pytest
import pytest_twisted
from twisted.internet.threads import deferToThread

from tests.integration.nodes import RunningNode, post, start_node
from tests.integration.real_backends import LLAMA_ANSWER, RealServers, TinyModels, real_node_config

pytestmark = [pytest.mark.slow, pytest.mark.real]

ASK = [{"role": "user", "content": "Say hello"}]
MESSAGE_EVENTS = ["message_start", "content_block_start", "content_block_delta", "content_block_stop",
                  "message_delta", "message_stop"]


@pytest_twisted.async_yield_fixture(scope="module")
async def node(tmp_path_factory: pytest.TempPathFactory, real_servers: RealServers,
               tiny_models: TinyModels) -> AsyncIterator[RunningNode]:
    models = {"tiny": {"model": tiny_models.tiny, "contextsize": 512},
              "ranker": {"model": tiny_models.tiny, "contextsize": 512, "reranking": True}}
    running = await start_node(real_node_config(tmp_path_factory.mktemp("real-apis"), real_servers, models))
    yield running
    await running.stop()


async def test_anthropic_sdk_messages_and_stream_on_the_real_llama_server(node: RunningNode) -> None:
    client = anthropic.Anthropic(base_url=node.url, api_key="unused", max_retries=0)

    def run() -> None:
        reply = client.messages.create(model="tiny", max_tokens=32, messages=ASK)
        assert reply.model == "tiny"  # llama-server names its GGUF path: rewritten to the public ID
        assert reply.content[0].type == "text" and reply.content[0].text == LLAMA_ANSWER
        assert reply.stop_reason == "end_turn" and reply.usage.output_tokens == 10
        with client.messages.stream(model="tiny", max_tokens=32, messages=ASK) as stream:
            events = list(stream)
            final = stream.get_final_message()
        kinds = [e.type for e in events if e.type in MESSAGE_EVENTS]
        assert [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k] == MESSAGE_EVENTS
        assert next(e for e in events if e.type == "message_start").message.model == "tiny"
        assert final.content[0].type == "text" and final.content[0].text == LLAMA_ANSWER
        assert final.usage.output_tokens == 10
        counted = client.messages.count_tokens(model="tiny", messages=ASK)
        assert counted.input_tokens > 0

    await deferToThread(run)


async def test_openai_sdk_responses_and_stream_on_the_real_llama_server(node: RunningNode) -> None:
    client = openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0)

    def run() -> None:
        reply = client.responses.create(model="tiny", input="Say hello", max_output_tokens=32)
        assert reply.model == "tiny" and reply.output_text == LLAMA_ANSWER
        assert reply.usage is not None and reply.usage.output_tokens == 10
        events = list(client.responses.create(model="tiny", input=ASK, max_output_tokens=32, stream=True))
        done = events[-1]
        assert done.type == "response.completed" and done.response.model == "tiny"
        assert done.response.output_text == LLAMA_ANSWER
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert text == LLAMA_ANSWER
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model="tiny", input="hi", previous_response_id="resp_1")
        assert refused.value.code == "unsupported_server_state"

    await deferToThread(run)


async def test_rerank_runs_on_a_model_started_with_reranking_and_is_refused_by_one_without(
        node: RunningNode) -> None:
    body: dict[str, Any] = {"query": "tiny", "documents": ["a tiny model", "a large one"]}
    status, answer, _ = await post(node.url + "/v1/rerank", {**body, "model": "ranker"})
    assert status == 200, answer
    assert answer["model"] == "ranker" and sorted(r["index"] for r in answer["results"]) == [0, 1]
    status, answer, _ = await post(node.url + "/rerank", {**body, "model": "ranker", "top_n": 1})
    assert status == 200 and len(answer["results"]) == 1, answer
    status, answer, _ = await post(node.url + "/v1/rerank", {**body, "model": "tiny"})
    assert status == 501 and "--reranking" in answer["error"]["message"], answer
