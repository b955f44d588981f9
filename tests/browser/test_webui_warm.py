"""Issue 33 item 4 in a real headless Chromium: the Models page says, per replica, what kept it warm.
A master with ``routing.replica_choice: affinity`` over two replicas of ``chat`` (its own and
``slave-a``'s) shows each replica's affinity hits and misses after a few sessions; a standalone node
whose one llama-server is shared by three models with ``scheduling.swap_batch`` shows the switch its
order avoided on the model it kept loaded; a node on real llama-server with ``models.slot_keep_count``
shows the KV slot it saved before a swap and restored after, with their sizes.  Before, the page showed
none of it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import pytest_twisted

from tests.browser.webui import Browser, browsing, running_site
from tests.integration.nodes import FAST_TEXT, plan_cluster, post, sim_model, start_standalone, write_models
from tests.integration.real_backends import RealServers, TinyModels
from tests.integration.test_real_kv_slots import interrupted, start, warm
from tests.integration.test_swap_batch_flow import MODELS, WEIGHTS, send_trace, swap_config

pytestmark = pytest.mark.slow


def chat(turn: int) -> dict[str, object]:
    messages: list[dict[str, str]] = [{"role": "system", "content": "you are brief"},
                                      {"role": "user", "content": "hello"}]
    for i in range(turn):
        messages += [{"role": "assistant", "content": f"reply {i}"}, {"role": "user", "content": f"more {i}"}]
    return {"model": "chat", "messages": messages, "max_tokens": 2}


def replica_says(b: Browser, node_id: str, needle: str) -> str:
    return b.wait_text(f'.model-card[data-public-id="chat"] tr[data-node-id="{node_id}"] td.warm', needle)


@pytest_twisted.ensureDeferred
async def test_the_models_page_shows_each_replicas_affinity_hits_and_misses(tmp_path: Path) -> None:
    plan = plan_cluster(tmp_path, ["slave-a"])
    for name in ("master", "slave-a"):
        write_models(plan.root / name, {"chat": sim_model("chat")}, {"chat": FAST_TEXT})
    async with running_site(plan, "chat", sections={"routing": {"replica_choice": "affinity"}}) as site:
        for node_id in ("master", "slave-a"):  # both replicas ready: new sessions spread over them
            status, answer, _response = await post(site.master.url + "/router/v1/site/nodes/load",
                                                   {"node_id": node_id, "model": "chat"})
            assert status == 200, answer
        for turn in range(3):
            for session in ("s1", "s2", "s3", "s4", "s5", "s6"):
                status, _answer, _response = await post(site.master.url + "/v1/chat/completions", chat(turn),
                                                        headers={"X-Session-Id": [session]})
                assert status == 200
        choices = (await site.site_json("/router/v1/site/inventory"))["replica_choices"]
        assert sum(c["affinity_hits"] for c in choices) == 12  # 6 sessions x 2 later turns
        assert {c["node_id"] for c in choices} == {"master", "slave-a"}
        b = site.browser

        def models_page(b: Browser) -> None:
            b.open("models")
            for c in choices:
                said = replica_says(b, c["node_id"],
                                    f"affinity {c['affinity_hits']} hit / {c['affinity_misses']} miss")
                assert "moved" not in said and "swaps" not in said
            assert "kept warm" in b.text('.model-card[data-public-id="chat"] thead')
            b.screenshot("models-warm")

        await b.do(models_page, b)


@pytest_twisted.ensureDeferred
async def test_the_models_page_shows_the_switches_the_swap_order_avoided(tmp_path: Path) -> None:
    node = await start_standalone(tmp_path, MODELS, WEIGHTS, extra={
        **swap_config(2), "cluster": {**swap_config(2)["cluster"], "node_id": "solo"}})
    async with browsing(node) as b:
        assert await send_trace(node) == ["alpha", "alpha", "alpha", "bravo", "charlie"]

        def models_page(b: Browser) -> None:
            b.open("models")
            said = b.wait_text('.model-card[data-public-id="alpha"] tr[data-node-id="solo"] td.warm',
                               "1 swaps avoided (2 served first)")
            assert "affinity" not in said and "slots" not in said
            # a model nothing kept warm has no such column
            assert not b.css('.model-card[data-public-id="bravo"] td.warm')

        await b.do(models_page, b)


@pytest.mark.real
@pytest_twisted.ensureDeferred
async def test_the_models_page_shows_the_kv_slots_kept_across_a_swap(
        tmp_path: Path, real_servers: RealServers, tiny_models: TinyModels) -> None:
    node = await start(tmp_path, real_servers, tiny_models, keep=4)
    node_id = node.node.node_id
    async with browsing(node) as b:
        await interrupted(node)  # chat's slot saved before the swap to other, restored after
        counts = (await warm(node))["chat"]
        assert (counts["kv_slots_saved"], counts["kv_slots_restored"]) == (1, 1)

        def models_page(b: Browser) -> str:
            b.open("models")
            return b.wait_text(f'.model-card[data-public-id="chat"] tr[data-node-id="{node_id}"] td.warm',
                               "slots 1 saved (")

        said = await b.do(models_page, b)
        size = r"\d+(\.\d)? (B|KB|MB|GB)"
        assert re.fullmatch(rf"slots 1 saved \({size}\) / 1 restored \({size}\)", said), said
