"""A Messages stream through a master to the slave that holds the model: the model is rewritten both ways, and
the master charges the key the stream's whole usage, its input from the first event (``message_start``) even
when the stream is far longer than the tail the relay keeps."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anthropic
import pytest_twisted
from twisted.internet.threads import deferToThread

from routerd.routing.relay import TAIL_KEEP
from routerd.sim.llama_apis import TEMPLATE_TOKENS
from routerd.sim.timing import count_tokens
from tests.integration.nodes import (
    FAST_TEXT,
    Pair,
    all_healthy,
    knows,
    plan_cluster,
    start_cluster,
    write_models,
)

ASK = [{"role": "user", "content": "Say hello"}]
#: Enough output that the stream is several times the relay's tail.
OUTPUT = 200
#: The simulated llama-server's count of the prompt (its words, and its template's tokens).
INPUT = count_tokens("Say hello") + TEMPLATE_TOKENS
KEYS = [{"name": name, "key": f"sk-apis-cluster-{name}-0123456789", "limits": {"tokens_per_minute": limit}}
        for name, limit in (("exact", INPUT + OUTPUT), ("over", INPUT + OUTPUT + 1))]


@pytest_twisted.async_yield_fixture
async def pair(tmp_path: Path) -> AsyncIterator[Pair]:
    plan = plan_cluster(tmp_path, ["slave-a"])
    write_models(plan.root / "slave-a", {"chat": {"model": "../weights/chat.sim.json", "contextsize": 4096}},
                 {"chat": {**FAST_TEXT, "gen_tokens_per_s": 2000}})
    write_models(plan.root / "master", {}, {})
    auth = {"auth": {"inference_keys": KEYS}}
    cluster = await start_cluster(plan, plan.master_config(sections=auth),
                                  {"slave-a": plan.slave_config("slave-a", sections=auth)},
                                  ready=lambda r: knows(r, **{"slave-a": "chat"}) and all_healthy(r))
    running = Pair(plan, cluster.master, cluster.slaves["slave-a"])
    yield running
    await running.stop()


@pytest_twisted.ensureDeferred
async def test_the_master_charges_a_long_forwarded_messages_streams_input_and_output(pair: Pair) -> None:
    def run() -> list[object]:
        outcomes: list[object] = []
        for key in KEYS:
            client = anthropic.Anthropic(base_url=pair.master.url, api_key=str(key["key"]), max_retries=0)
            for _ in range(2):
                try:
                    with client.messages.stream(model="chat", max_tokens=OUTPUT, messages=ASK) as stream:
                        events = list(stream)
                        final = stream.get_final_message()
                except anthropic.RateLimitError as limited:
                    outcomes.append(limited.status_code)
                    continue
                start = next(e for e in events if e.type == "message_start")
                assert start.message.model == "chat" and start.message.usage.input_tokens == INPUT
                # each content_block_delta event's framing alone is over 100 bytes: message_start is long
                # gone from the relay's tail when the stream ends
                assert sum(1 for e in events if e.type == "content_block_delta") * 100 > 2 * TAIL_KEEP
                outcomes.append(final.usage.output_tokens)
        return outcomes

    assert await deferToThread(run) == [OUTPUT, 429, OUTPUT, OUTPUT]
