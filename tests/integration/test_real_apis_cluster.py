"""Issue 34's "done when", on real backends: a Claude-style client (the ``anthropic`` SDK) and a Responses
client (the ``openai`` SDK) pointed at a routerd master get their answers from the real llama-server of the
slave that holds the model, and the master counts and limits their usage as it does chat's.

The lightest cluster that shows it: the master holds no model (so every answer is forwarded) and one slave
serves ``tiny`` (the tiny GGUF) with llama-server.  Two keys: ``open`` (no limit) and ``metered``
(``tokens_per_minute: 1``: the first request is let in, its usage fills the minute, the next is refused).
The simulated version, with a stream longer than the relay's tail, is ``test_apis_cluster.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import openai
import pytest
import pytest_twisted
import treq
from twisted.internet.threads import deferToThread

from tests.integration.nodes import Pair, all_healthy, knows, plan_cluster, start_cluster, write_models
from tests.integration.real_backends import LLAMA_ANSWER, RealServers, TinyModels, real_node_config

pytestmark = [pytest.mark.slow, pytest.mark.real]

OPEN, METERED = "sk-real-apis-open-0123456789", "sk-real-apis-metered-0123456789"
AUTH = {"auth": {"inference_keys": [
    {"name": "open", "key": OPEN},
    {"name": "metered", "key": METERED, "limits": {"tokens_per_minute": 1}}]}}
ASK = [{"role": "user", "content": "Say hello"}]


@pytest_twisted.async_yield_fixture(scope="module")
async def pair(tmp_path_factory: pytest.TempPathFactory, real_servers: RealServers,
               tiny_models: TinyModels) -> AsyncIterator[Pair]:
    plan = plan_cluster(tmp_path_factory.mktemp("real-apis-cluster"), ["owner"])
    write_models(plan.root / "master", {}, {})
    owner = real_node_config(plan.root / "owner", real_servers,
                             {"tiny": {"model": tiny_models.tiny, "contextsize": 512, "parallel": 1}},
                             plan.slave_sections("owner", sections=AUTH))
    cluster = await start_cluster(plan, plan.master_config(sections=AUTH), {"owner": owner},
                                  ready=lambda r: knows(r, owner="tiny") and all_healthy(r))
    running = Pair(plan, cluster.master, cluster.slaves["owner"])
    yield running
    await running.stop()


async def _site_rows(pair: Pair) -> dict[str, dict[str, Any]]:
    """The latest row per route of the site's request log, as the master serves it."""
    recent = await (await treq.get(pair.master.url + "/router/v1/site/analytics/recent?limit=20")).json()
    rows: dict[str, dict[str, Any]] = {}
    for row in recent["requests"]:
        rows.setdefault(row["route"], row)
    return rows


async def test_sdk_clients_at_the_master_get_the_slaves_llama_server_answers_counted_as_sent(
        pair: Pair) -> None:
    """Messages (plain and streamed) and Responses through the master: forwarded to the owner, the real
    model's sentence under the public ID; the site's request log carries each API's own usage (Messages:
    input with what llama-server's prompt cache served, and output) under the key's name."""
    def run() -> tuple[Any, Any, Any]:
        claude = anthropic.Anthropic(base_url=pair.master.url, api_key=OPEN, max_retries=0)
        raw = claude.messages.with_raw_response.create(model="tiny", max_tokens=32, messages=ASK)
        assert raw.headers.get("x-routerd-node") == "owner"
        reply = raw.parse()
        assert (reply.model, reply.content[0].type, reply.stop_reason) == ("tiny", "text", "end_turn")
        assert reply.content[0].text == LLAMA_ANSWER
        with claude.messages.stream(model="tiny", max_tokens=32, messages=ASK) as stream:
            streamed = stream.get_final_message()
        assert streamed.model == "tiny" and streamed.content[0].text == LLAMA_ANSWER
        client = openai.OpenAI(base_url=pair.master.url + "/v1", api_key=OPEN, max_retries=0)
        response = client.responses.create(model="tiny", input="Say hello", max_output_tokens=32)
        assert response.model == "tiny" and response.output_text == LLAMA_ANSWER
        return reply.usage, streamed.usage, response.usage

    _plain, streamed, responses = await deferToThread(run)
    rows = await _site_rows(pair)
    messages_input = streamed.input_tokens + (streamed.cache_read_input_tokens or 0)
    assert (rows["messages"]["prompt_tokens"], rows["messages"]["completion_tokens"]) == (
        messages_input, streamed.output_tokens)
    assert (rows["responses"]["prompt_tokens"], rows["responses"]["completion_tokens"]) == (
        responses.input_tokens, responses.output_tokens)
    assert {(rows[route]["key_name"], rows[route]["node_id"]) for route in ("messages", "responses")} == {
        ("open", "owner")}
    assert streamed.output_tokens == 10  # the sentence's nine pieces and the end of sequence


async def test_a_keys_token_limit_refuses_messages_and_responses_in_each_apis_error_shape(pair: Pair) -> None:
    """The metered key's first Messages answer fills its minute: the next Messages request is refused 429
    as Anthropic's ``rate_limit_error``, a Responses request as OpenAI's error, while the open key goes on."""
    def run() -> None:
        claude = anthropic.Anthropic(base_url=pair.master.url, api_key=METERED, max_retries=0)
        first = claude.messages.create(model="tiny", max_tokens=32, messages=ASK)
        assert first.content[0].type == "text" and first.content[0].text == LLAMA_ANSWER
        with pytest.raises(anthropic.RateLimitError) as refused:
            claude.messages.create(model="tiny", max_tokens=32, messages=ASK)
        assert isinstance(refused.value.body, dict)
        assert refused.value.body["type"] == "error"
        assert refused.value.body["error"]["type"] == "rate_limit_error"
        assert "tokens_per_minute" in refused.value.body["error"]["message"]
        gpt = openai.OpenAI(base_url=pair.master.url + "/v1", api_key=METERED, max_retries=0)
        with pytest.raises(openai.RateLimitError) as limited:
            gpt.responses.create(model="tiny", input="Say hello", max_output_tokens=32)
        assert limited.value.code == "key_limited"
        still = anthropic.Anthropic(base_url=pair.master.url, api_key=OPEN, max_retries=0)
        assert still.messages.create(model="tiny", max_tokens=32, messages=ASK).model == "tiny"

    await deferToThread(run)
