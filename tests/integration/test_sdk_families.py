"""The official ``anthropic`` and ``openai`` SDKs through a routerd node whose model runs on the ``kobold``
family (KoboldCpp speaks neither Messages nor Responses: routerd translates them to its chat completions and
counts Messages tokens with its ``/api/extra/tokencount``) and on the ``vllm`` family (vLLM speaks them all:
passed through).  Text, system prompt, streaming with every event type the SDK parses, token counting, and
the key limits charged from the translated answer's usage.

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

from routerd.routing.relay import TAIL_KEEP
from tests.integration.nodes import (
    FAST_TEXT,
    SIM,
    RunningNode,
    all_healthy,
    knows,
    node_config,
    plan_cluster,
    start_cluster,
    start_node,
    write_models,
)
from tests.integration.sdk_tools import RESULT, messages_tool_flow, responses_tool_flow
from tests.integration.test_sdk_apis import claude, streams_under_limits

FAMILIES = {
    "kobold": (
        {"talker": {"model": "../weights/talker.sim.json", "contextsize": 4096}},
        {"backend": {"mode": "kobold"}, "kobold": {"binary_path": [*SIM, "koboldcpp"]}},
    ),
    "vllm": (
        {"talker": {"model": "../weights/talker.sim.json", "vllm": {"settings": {"max_model_length": 4096}}}},
        {"backend": {"mode": "vllm"}, "vllm": {"binary_path": [*SIM, "vllm"]}},
    ),
}
MESSAGE_EVENTS = [
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
]
ASK = [{"role": "user", "content": "Say hello"}]


async def family_node(root: Path, family: str, extra: dict[str, Any] | None = None) -> RunningNode:
    models, sections = FAMILIES[family]
    write_models(root, models, {"talker": FAST_TEXT})
    return await start_node(node_config(root, {**sections, **(extra or {})}))


@pytest_twisted.async_yield_fixture(params=sorted(FAMILIES))
async def node(request: Any, tmp_path: Path) -> AsyncIterator[RunningNode]:
    running = await family_node(tmp_path, request.param)
    yield running
    await running.stop()


@pytest_twisted.ensureDeferred
async def test_anthropic_sdk_messages_streamed_messages_and_count_tokens_on_kobold_and_vllm(
    node: RunningNode,
) -> None:
    client = claude(node.url)

    def run() -> None:
        reply = client.messages.create(model="talker", max_tokens=5, system="Be brief.", messages=ASK)
        assert reply.model == "talker" and reply.type == "message" and reply.role == "assistant"
        assert reply.stop_reason == "max_tokens" and reply.content[0].type == "text"
        assert reply.content[0].text.strip()
        assert reply.usage.output_tokens == 5 and reply.usage.input_tokens > 0
        with client.messages.stream(model="talker", max_tokens=4, system="Be brief.", messages=ASK) as stream:
            events = list(stream)
            final = stream.get_final_message()
        kinds = [e.type for e in events if e.type in MESSAGE_EVENTS]
        assert [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k] == MESSAGE_EVENTS
        deltas = "".join(
            e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"
        )
        assert final.model == "talker" and final.content[0].type == "text" and final.content[0].text == deltas
        assert deltas.strip() and final.stop_reason == "max_tokens"
        assert (final.usage.input_tokens, final.usage.output_tokens) == (reply.usage.input_tokens, 4)
        counted = client.messages.count_tokens(model="talker", system="Be brief.", messages=ASK)
        assert counted.input_tokens > 0

    await deferToThread(run)


@pytest_twisted.ensureDeferred
async def test_openai_sdk_responses_with_and_without_stream_on_kobold_and_vllm(node: RunningNode) -> None:
    client = openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0)

    def run() -> None:
        reply = client.responses.create(
            model="talker", input="Say hello", instructions="Be brief.", max_output_tokens=5
        )
        assert reply.model == "talker" and reply.output_text.strip()
        assert reply.usage is not None and reply.usage.output_tokens == 5 and reply.usage.input_tokens > 0
        events = list(client.responses.create(model="talker", input=ASK, max_output_tokens=4, stream=True))
        kinds = [e.type for e in events]
        # the simulated model always writes up to its limit: a translated answer says so (incomplete,
        # max_output_tokens), as OpenAI does; the vLLM stand-in (llama-server's shapes) says completed
        assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
        assert "response.output_text.delta" in kinds and "response.output_text.done" in kinds
        done = events[-1]
        assert done.type in ("response.completed", "response.incomplete")
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert done.response.model == "talker" and done.response.output_text == text != ""
        assert done.response.usage is not None and done.response.usage.output_tokens == 4

    await deferToThread(run)


@pytest_twisted.ensureDeferred
async def test_kobold_translated_messages_stream_is_charged_once_from_its_chat_usage(tmp_path: Path) -> None:
    """A key whose limit is exactly one translated Messages stream's tokens (the chat answer's prompt and
    completion tokens) is full after one (429 in Anthropic's envelope); a key one token over is not, so the
    stream was charged once, with the right numbers."""
    probe = await family_node(tmp_path / "probe", "kobold")
    try:
        first = await (
            await treq.post(
                probe.url + "/v1/messages", json={"model": "talker", "max_tokens": 4, "messages": ASK}
            )
        ).json()
    finally:
        await probe.stop()
    used = first["usage"]["input_tokens"] + 4
    keys = [
        {"name": name, "key": f"sk-sdk-families-{name}-0123456789", "limits": {"tokens_per_minute": limit}}
        for name, limit in (("exact", used), ("over", used + 1))
    ]
    keyed = await family_node(tmp_path / "keyed", "kobold", {"auth": {"inference_keys": keys}})
    try:
        assert await deferToThread(streams_under_limits, keyed.url, keys) == [4, "rate_limit_error", 4, 4], (
            used
        )
    finally:
        await keyed.stop()


@pytest_twisted.ensureDeferred
async def test_kobold_refuses_rerank_501_and_a_bad_translated_request_is_an_anthropic_400(
    tmp_path: Path,
) -> None:
    node = await family_node(tmp_path, "kobold")
    try:
        ranked = await treq.post(
            node.url + "/v1/rerank", json={"model": "talker", "query": "q", "documents": ["a"]}
        )
        assert ranked.code == 501 and (await ranked.json())["error"]["code"] == "unsupported_backend"

        def run() -> None:
            with pytest.raises(anthropic.BadRequestError) as refused:
                claude(node.url).messages.create(
                    model="talker",
                    max_tokens=4,
                    messages=[
                        {
                            "role": "user",
                            "content": [
                                {
                                    "type": "document",
                                    "source": {"type": "text", "media_type": "text/plain", "data": "x"},
                                }
                            ],
                        }
                    ],
                )
            assert isinstance(refused.value.body, dict) and refused.value.body["type"] == "error"
            assert "document" in refused.value.body["error"]["message"]

        await deferToThread(run)
    finally:
        await node.stop()


@pytest_twisted.ensureDeferred
async def test_a_master_relaying_a_long_translated_kobold_stream_charges_its_whole_usage(
    tmp_path: Path,
) -> None:
    """A Messages stream translated on a kobold slave and relayed by the master, far longer than the tail the
    relay keeps: the master charges the key the chat answer's input and output (reported whole in the last
    events), so a key whose limit is exactly one stream is full after one and a key one token over is not."""
    output = 200
    plan = plan_cluster(tmp_path, ["kob"])
    models, sections = FAMILIES["kobold"]
    write_models(plan.root / "kob", models, {"talker": {**FAST_TEXT, "gen_tokens_per_s": 2000}})
    write_models(plan.root / "master", {}, {})

    def cluster_with(keys: list[dict[str, Any]]) -> Any:
        auth = {"auth": {"inference_keys": keys}}
        return start_cluster(
            plan,
            plan.master_config(sections=auth),
            {"kob": plan.slave_config("kob", sections={**sections, **auth})},
            ready=lambda r: knows(r, kob="talker") and all_healthy(r),
        )

    probe = {"name": "probe", "key": "sk-sdk-families-probe-0123456789"}
    cluster = await cluster_with([probe])
    try:
        asked = await treq.post(
            cluster.master.url + "/v1/messages",
            json={"model": "talker", "max_tokens": 1, "messages": ASK},
            headers={"authorization": "Bearer " + probe["key"]},
        )
        used = (await asked.json())["usage"]["input_tokens"] + output
    finally:
        await cluster.stop()
    keys = [
        {"name": name, "key": f"sk-sdk-families-{name}-0123456789", "limits": {"tokens_per_minute": limit}}
        for name, limit in (("exact", used), ("over", used + 1))
    ]
    cluster = await cluster_with(keys)
    try:

        def run() -> list[object]:
            outcomes: list[object] = []
            for key in keys:
                client = claude(cluster.master.url, str(key["key"]))
                for _ in range(2):
                    try:
                        with client.messages.stream(
                            model="talker", max_tokens=output, messages=ASK
                        ) as stream:
                            events = list(stream)
                            final = stream.get_final_message()
                    except anthropic.RateLimitError as limited:
                        outcomes.append(limited.status_code)
                        continue
                    assert sum(1 for e in events if e.type == "content_block_delta") * 100 > 2 * TAIL_KEEP
                    assert final.model == "talker" and final.usage.input_tokens + output == used
                    outcomes.append(final.usage.output_tokens)
            return outcomes

        assert await deferToThread(run) == [output, 429, output, output]
    finally:
        await cluster.stop()


@pytest_twisted.ensureDeferred
async def test_anthropic_sdk_tool_use_stream_and_tool_result_on_kobold_and_vllm(node: RunningNode) -> None:
    """Tool calls in Messages: translated to KoboldCpp's chat ``tool_calls`` and back (``tool_use`` blocks,
    ``input_json_delta`` events, ``stop_reason: tool_use``, a ``tool_result`` read as the next turn's
    prompt), passed through to vLLM; the same SDK flow as against llama-server."""
    client = anthropic.Anthropic(base_url=node.url, api_key="unused", max_retries=0)
    turns = await deferToThread(messages_tool_flow, client, "talker")
    assert turns.second_input >= turns.first_input + len(RESULT.split())
    assert turns.second.content[0].type == "text"


@pytest_twisted.ensureDeferred
async def test_openai_sdk_responses_function_call_stream_and_output_on_kobold_and_vllm(
        node: RunningNode) -> None:
    """Tool calls in Responses: ``function_call`` items and argument deltas translated from KoboldCpp's chat
    ``tool_calls`` (passed through on vLLM), a ``function_call_output`` read as the next turn's prompt."""
    client = openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0)
    turns = await deferToThread(responses_tool_flow, client, "talker")
    assert turns.second_input >= turns.first_input + len(RESULT.split())
    assert turns.second.output[-1].type == "message" and turns.second.output_text
