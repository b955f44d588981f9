"""``routing.replica_choice: affinity`` on the real llama-server: a master with no model of its own and
two slaves, each running its own llama-server with the tiny model as ``chat`` (one public ID, two
replicas), the servers' RAM prompt cache off (``--cache-ram 0``: a replica holds a conversation's
prefix only in the slot that served it, as a server of a large model does)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_twisted

from tests.integration.nodes import Cluster, plan_cluster, post, start_cluster, write_models
from tests.integration.real_backends import LLAMA_FLAGS, RealServers, TinyModels, real_node_config

pytestmark = [pytest.mark.slow, pytest.mark.real]

SLAVES = ["left", "right"]


@pytest_twisted.async_yield_fixture
async def site(tmp_path_factory: pytest.TempPathFactory, real_servers: RealServers,
               tiny_models: TinyModels) -> AsyncIterator[Cluster]:
    root = tmp_path_factory.mktemp("real-affinity")
    plan = plan_cluster(root, SLAVES)
    write_models(plan.root / "master", {}, {})
    chat = {"chat": {"model": tiny_models.tiny, "contextsize": 2048, "parallel": 2}}
    flags = (*LLAMA_FLAGS, "--cache-ram", "0")
    slaves = {name: real_node_config(root / name, real_servers, chat, plan.slave_sections(name),
                                     llama_flags=flags) for name in SLAVES}
    routing = {"routing": {"replica_choice": "affinity"}}
    running = await start_cluster(
        plan, master=plan.master_config(sections=routing), slaves=slaves,
        ready=lambda r: all(r.find(n, local_id="chat") is not None for n in SLAVES)
        and all(n.healthy for n in r.nodes()))
    yield running
    await running.stop()


@pytest_twisted.ensureDeferred
async def test_affinity_keeps_a_chat_on_the_replica_whose_prompt_cache_holds_it(site: Cluster) -> None:
    """Five turns of one chat (its system prompt and first user turn key it): every turn is served by
    one node, and from the second turn on the answer's usage shows the prompt served from the cache
    (``cached_tokens``).  Under rotation the turns alternate and the second finds nothing cached:
    the other server never saw the chat."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a patient assistant who answers in one short line."},
        {"role": "user", "content": "Tell me about the sea, the sky and the mountains."}]
    nodes, cached = [], []
    for turn in range(5):
        status, answer, response = await post(site.master.url + "/v1/chat/completions", {
            "model": "chat", "messages": messages, "max_tokens": 6, "temperature": 0, "ignore_eos": True})
        assert status == 200, answer
        nodes.append(response.headers.getRawHeaders(b"x-routerd-node")[0].decode())
        cached.append(answer["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0))
        messages += [{"role": "assistant", "content": answer["choices"][0]["message"]["content"]},
                     {"role": "user", "content": f"And then, part {turn}?"}]
    assert len(set(nodes)) == 1, nodes
    assert all(hit > 0 for hit in cached[1:]), cached
