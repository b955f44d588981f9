"""The official ``anthropic`` and ``openai`` Python SDKs drive routerd's Messages, token counting and
Responses routes against the simulated llama-server (which speaks them itself, as llama-server b11434 does).

Both clients are synchronous, so each call runs in a worker thread while the reactor serves the node.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import pytest_twisted
import treq
from twisted.internet.threads import deferToThread

from tests.integration.nodes import FAST_TEXT, RunningNode, node_config, start_node, write_models

MODELS = {"talker": {"model": "../weights/talker.sim.json", "contextsize": 4096},
          "ranker": {"model": "../weights/talker.sim.json", "reranking": True}}
WEIGHTS = {"talker": FAST_TEXT}
#: Every event type of a Messages stream the anthropic SDK parses for a text answer.
MESSAGE_EVENTS = ["message_start", "content_block_start", "content_block_delta", "content_block_stop",
                  "message_delta", "message_stop"]
ASK = [{"role": "user", "content": "Say hello"}]


@pytest_twisted.async_yield_fixture
async def node(tmp_path: Path) -> AsyncIterator[RunningNode]:
    write_models(tmp_path, MODELS, WEIGHTS)
    running = await start_node(node_config(tmp_path))
    yield running
    await running.stop()


def claude(url: str, key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)


@pytest_twisted.ensureDeferred
async def test_anthropic_sdk_messages_stream_and_count_tokens_through_routerd(node: RunningNode) -> None:
    """A Messages answer and a streamed one carry the public model ID and the backend's usage; the stream
    has every event type the SDK parses, in order; count_tokens answers the prompt's tokens."""
    client = claude(node.url)

    def run() -> None:
        reply = client.messages.create(model="talker", max_tokens=5, system="Be brief.", messages=ASK)
        assert reply.model == "talker" and reply.type == "message" and reply.role == "assistant"
        assert reply.stop_reason == "max_tokens"
        assert reply.content[0].type == "text" and reply.content[0].text.strip()
        assert reply.usage.output_tokens == 5 and reply.usage.input_tokens > 0
        with client.messages.stream(model="talker", max_tokens=4, messages=ASK) as stream:
            events = list(stream)
            final = stream.get_final_message()
        kinds = [e.type for e in events if e.type in MESSAGE_EVENTS]
        assert [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k] == MESSAGE_EVENTS
        start = next(e for e in events if e.type == "message_start")
        assert start.message.model == "talker"  # the model rewritten inside the stream's message
        deltas = "".join(e.delta.text for e in events
                         if e.type == "content_block_delta" and e.delta.type == "text_delta")
        assert final.content[0].type == "text" and final.content[0].text == deltas != ""
        assert final.usage.output_tokens == 4 and final.stop_reason == "max_tokens"
        counted = client.messages.count_tokens(model="talker", messages=ASK)
        assert counted.input_tokens == reply.usage.input_tokens - 2  # "Be brief." is two more words

    await deferToThread(run)


@pytest_twisted.ensureDeferred
async def test_anthropic_sdk_gets_routerds_errors_as_anthropic_errors(node: RunningNode) -> None:
    client = claude(node.url)

    def run() -> None:
        with pytest.raises(anthropic.NotFoundError) as missing:
            client.messages.create(model="missing", max_tokens=5, messages=ASK)
        assert missing.value.body == {"type": "error", "error": {
            "type": "not_found_error", "message": "model 'missing' was not found", "code": "model_not_found"}}
        with pytest.raises(anthropic.BadRequestError) as no_model:
            client.messages.count_tokens(model="", messages=ASK)
        assert isinstance(no_model.value.body, dict) and no_model.value.body["type"] == "error"

    await deferToThread(run)


@pytest_twisted.ensureDeferred
async def test_openai_sdk_responses_with_and_without_stream_through_routerd(node: RunningNode) -> None:
    client = openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0)

    def run() -> None:
        reply = client.responses.create(model="talker", input="Say hello", instructions="Be brief.",
                                        max_output_tokens=5)
        assert reply.model == "talker" and reply.status == "completed"
        assert reply.output_text.strip()
        assert reply.usage is not None and reply.usage.output_tokens == 5 and reply.usage.input_tokens > 0
        events = list(client.responses.create(model="talker", input=ASK, max_output_tokens=4, stream=True))
        kinds = [e.type for e in events]
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        assert "response.output_text.delta" in kinds and "response.output_text.done" in kinds
        done = events[-1]
        assert done.type == "response.completed"
        assert done.response.model == "talker" and done.response.usage is not None
        assert done.response.usage.output_tokens == 4
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert done.response.output_text == text != ""

    await deferToThread(run)


@pytest_twisted.ensureDeferred
async def test_openai_sdk_gets_a_clear_400_for_the_responses_server_state(node: RunningNode) -> None:
    """routerd keeps no conversation: continuing a stored response, or asking to store one, is refused
    before it queues (OpenAI's envelope, code unsupported_server_state); store false passes."""
    client = openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0)

    def run() -> None:
        for extra in ({"previous_response_id": "resp_123"}, {"store": True}):
            with pytest.raises(openai.BadRequestError) as refused:
                client.responses.create(model="talker", input="Say hello", max_output_tokens=2, **extra)
            assert refused.value.code == "unsupported_server_state", extra
        kept = client.responses.create(model="talker", input="hi", max_output_tokens=2, store=False)
        assert kept.output_text

    await deferToThread(run)


def streams_under_limits(url: str, keys: list[dict[str, Any]]) -> list[Any]:
    """Two 4-token Messages streams of ``talker`` with each key in turn: each one's output tokens, or the
    Anthropic error type it was refused with."""
    outcomes: list[Any] = []
    for key in keys:
        client = claude(url, str(key["key"]))
        for _ in range(2):
            try:
                with client.messages.stream(model="talker", max_tokens=4, messages=ASK) as stream:
                    outcomes.append(stream.get_final_message().usage.output_tokens)
            except anthropic.RateLimitError as limited:
                assert isinstance(limited.body, dict)
                outcomes.append(limited.body["error"]["type"])
    return outcomes


@pytest_twisted.ensureDeferred
async def test_a_keys_tokens_per_minute_counts_a_messages_streams_input_and_output(
        node: RunningNode, tmp_path: Path) -> None:
    """A key whose limit is exactly one streamed Messages request's tokens (input from its message_start,
    output from its message_delta) is full after one (429 in Anthropic's envelope); a key one token over
    is not."""
    counted = await (await treq.post(node.url + "/v1/messages/count_tokens",
                                     json={"model": "talker", "messages": ASK})).json()
    used = counted["input_tokens"] + 4
    keys = [{"name": name, "key": f"sk-sdk-apis-{name}-0123456789", "limits": {"tokens_per_minute": limit}}
            for name, limit in (("exact", used), ("over", used + 1))]
    root = tmp_path / "keyed"
    write_models(root, MODELS, WEIGHTS)
    keyed = await start_node(node_config(root, {"auth": {"inference_keys": keys}}))
    try:
        outcomes = await deferToThread(streams_under_limits, keyed.url, keys)
        assert outcomes == [4, "rate_limit_error", 4, 4], used
    finally:
        await keyed.stop()


@pytest_twisted.ensureDeferred
async def test_analytics_rows_name_each_api_and_count_its_own_usage(node: RunningNode) -> None:
    """A Messages stream, a Responses stream and a rerank each leave a request row of their own route kind,
    with the tokens their API's usage reported (a rerank on a config with "reranking": true runs)."""
    def run() -> tuple[Any, Any]:
        with claude(node.url).messages.stream(model="talker", max_tokens=3, messages=ASK) as stream:
            message = stream.get_final_message()
        client = openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0)
        events = list(client.responses.create(model="talker", input="Say hello", max_output_tokens=2,
                                              stream=True))
        return message.usage, events[-1].response.usage

    messages_usage, responses_usage = await deferToThread(run)
    ranked = await treq.post(node.url + "/v1/rerank", json={"model": "ranker", "query": "a",
                                                            "documents": ["a b", "c"]})
    assert ranked.code == 200
    rerank_usage = (await ranked.json())["usage"]
    recent = await (await treq.get(node.url + "/router/v1/site/analytics/recent?limit=3")).json()
    rows = {row["route"]: row for row in recent["requests"]}
    assert (rows["messages"]["prompt_tokens"], rows["messages"]["completion_tokens"]) == (
        messages_usage.input_tokens, 3)
    assert (rows["responses"]["prompt_tokens"], rows["responses"]["completion_tokens"]) == (
        responses_usage.input_tokens, 2)
    assert (rows["rerank"]["prompt_tokens"], rows["rerank"]["model"]) == (rerank_usage["prompt_tokens"],
                                                                          "ranker")
    assert all(row["lane"] == "text" and row["status"] == "ok" for row in rows.values())
