"""``routing.replica_choice`` on real nodes (issue 33): a master with no model of its own and two
slaves, ``left`` and ``right``, serving the same ``chat`` (one public ID, two replicas), simulator
backends at 1 ms a prompt word and 5 ms a generated token."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_twisted
from twisted.internet import defer

from tests.integration.nodes import (
    FAST_TEXT,
    Cluster,
    plan_cluster,
    post,
    sim_model,
    start_cluster,
    wait_until,
    write_models,
)

SLAVES = ["left", "right"]
#: Fits from four samples, refitted when a test asks (the master pushes its lending settings).
LENDING = {"scheduling_min_samples": 4, "scheduling_refresh_interval": "10m"}


async def site(root: Path, mode: str) -> Cluster:
    plan = plan_cluster(root, SLAVES)
    write_models(plan.root / "master", {}, {})
    for name in SLAVES:
        write_models(plan.root / name, {"chat": sim_model("chat")}, {"chat": FAST_TEXT})
    return await start_cluster(
        plan, master=plan.master_config(LENDING, sections={"routing": {"replica_choice": mode}}),
        slaves={name: plan.slave_config(name, extra_cluster=LENDING) for name in SLAVES},
        ready=lambda r: all(r.find(n, local_id="chat") is not None for n in SLAVES)
        and all(n.healthy for n in r.nodes()))


@pytest_twisted.async_yield_fixture
async def affinity_site(tmp_path: Path) -> AsyncIterator[Cluster]:
    running = await site(tmp_path, "affinity")
    yield running
    await running.stop()


@pytest_twisted.async_yield_fixture
async def least_loaded_site(tmp_path: Path) -> AsyncIterator[Cluster]:
    running = await site(tmp_path, "least_loaded")
    yield running
    await running.stop()


def chat(turns: int = 0, *, max_tokens: int = 3, words: int = 3, persona: str = "brief") -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": f"you are {persona}"},
                                      {"role": "user", "content": " ".join(["hello"] * words)}]
    for i in range(turns):
        messages += [{"role": "assistant", "content": f"reply {i}"}, {"role": "user", "content": f"more {i}"}]
    return {"model": "chat", "messages": messages, "max_tokens": max_tokens}


async def node_of(cluster: Cluster, body: dict[str, Any], **headers: str) -> str:
    status, _answer, response = await post(cluster.master.url + "/v1/chat/completions", body,
                                           headers={k: [v] for k, v in headers.items()})
    assert status == 200
    return str(response.headers.getRawHeaders(b"x-routerd-node")[0].decode())


@pytest_twisted.ensureDeferred
async def test_affinity_keeps_every_turn_of_a_session_on_one_replica(affinity_site: Cluster) -> None:
    """Seven sessions of five turns, the turns of all sessions interleaved (an odd count, so rotation
    would move every session at every turn): each session stays on the node of its first turn, and
    the sessions use both slaves."""
    homes: dict[str, set[str]] = {}
    for turn in range(5):
        for session in range(7):
            node = await node_of(affinity_site, chat(turn), **{"X-Session-Id": f"session-{session}"})
            homes.setdefault(f"session-{session}", set()).add(node)
    assert all(len(nodes) == 1 for nodes in homes.values()), homes
    assert set().union(*homes.values()) == set(SLAVES)


@pytest_twisted.ensureDeferred
async def test_least_loaded_spreads_by_predicted_seconds(least_loaded_site: Cluster) -> None:
    """Once both slaves have fits, a long request (400 tokens, about 2 s) on one slave outweighs
    three short ones (4 tokens) sent at once while it runs: all three go to the other slave, where
    counting requests would tie at one each and send the second short one behind the long one."""
    cluster = least_loaded_site
    # warm-up: varied prompts and answers on both slaves (ties are broken by rotation)
    for i in range(12):
        await node_of(cluster, chat(max_tokens=10 + 15 * (i % 6), words=5 + 20 * (i % 4)))
    for name in SLAVES:
        await cluster.slaves[name].node._refit()
    statuses = await cluster.master.node.master.statuses()  # type: ignore[union-attr]
    assert all(statuses[name].costs.model("chat", "llm") is not None for name in SLAVES), statuses
    long = defer.ensureDeferred(node_of(cluster, chat(max_tokens=400)))
    registry = cluster.registry
    await wait_until(lambda: any(registry.busy(r, "text") for r in registry.usable("chat", "text")))
    shorts = [defer.ensureDeferred(node_of(cluster, chat(max_tokens=4))) for _ in range(3)]
    short_nodes = [await d for d in shorts]
    busy = await long
    assert short_nodes == [next(n for n in SLAVES if n != busy)] * 3
