"""The rack at a glance on a real master and slave (simulator backends, real HTTP): after the master's
health poll, its site inventory carries each node's telemetry — host CPU and memory, "no GPU" on this
machine, each runtime's model, queue and llama-server's own counters, and the needs-attention flags."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_twisted
import treq
from twisted.internet import reactor, task

from routerd.telemetry.attention import THRASH_LOADS
from tests.integration.nodes import (
    FAST_TEXT,
    Cluster,
    all_healthy,
    knows,
    plan_cluster,
    post,
    sim_model,
    start_cluster,
    write_models,
)

pytestmark = pytest.mark.slow


@pytest_twisted.async_yield_fixture(scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    """One cluster for the module: the metrics test loads nothing and only reads host gauges, so the
    inventory test's counts of the slave's loads hold whichever of the two runs first."""
    plan = plan_cluster(tmp_path_factory.mktemp("rack"), ["slave-a"])
    write_models(plan.root / "master", {"chat": sim_model("chat")}, {"chat": FAST_TEXT})
    write_models(plan.root / "slave-a", {
        "alpha": sim_model("alpha"), "beta": sim_model("beta"),
        "broken": sim_model("alpha", extra_args=["--sim-fail-load"]),
    }, {"alpha": {**FAST_TEXT, "load_ms": 10}, "beta": {**FAST_TEXT, "load_ms": 10}})
    running = await start_cluster(plan, ready=lambda r: knows(r, **{"slave-a": "beta"}) and all_healthy(r))
    yield running
    await running.stop()


async def inventory(cluster: Cluster) -> dict[str, Any]:
    answer: dict[str, Any] = await (await treq.get(cluster.master.url + "/router/v1/site/inventory")).json()
    return answer


async def load_on_slave(cluster: Cluster, model: str) -> int:
    code, _, _ = await post(cluster.master.url + "/router/v1/site/nodes/load",
                            {"node_id": "slave-a", "model": model})
    return code


@pytest_twisted.ensureDeferred
async def test_the_master_s_inventory_carries_every_node_s_telemetry_after_a_poll(cluster: Cluster) -> None:
    slave = cluster.slaves["slave-a"]
    for n in range(THRASH_LOADS):  # alpha, beta, alpha, ...: swap thrash on the slave's text runtime
        assert await load_on_slave(cluster, ("alpha", "beta")[n % 2]) == 200
    assert await load_on_slave(cluster, "broken") != 200
    assert await load_on_slave(cluster, "beta") == 200
    code, answer, _ = await post(slave.url + "/v1/chat/completions", {
        "model": "beta", "messages": [{"role": "user", "content": "count to three"}], "max_tokens": 5})
    assert code == 200, answer
    master_agent = cluster.master.node.master
    assert master_agent is not None
    seen: dict[str, Any] = {}

    async def polled() -> bool:
        # the slave answers a poll with its latest reading and starts the next (at most one a second):
        # a poll after the next reading brings it in
        await task.deferLater(reactor, 0.1, lambda: None)
        await master_agent.poll_all()
        nodes = {n["node_id"]: n for n in (await inventory(cluster))["nodes"]}
        seen.update(nodes)
        text = {r["kind"]: r for r in (nodes["slave-a"]["telemetry"] or {}).get("runtimes", [])}.get("text")
        return bool(text and text["counters"] and text["counters"]["tokens_predicted_total"])

    for _ in range(60):
        if await polled():
            break
    else:
        raise AssertionError(f"the slave's counters never reached the master: {seen.get('slave-a')}")
    for node_id in ("master", "slave-a"):
        telemetry = seen[node_id]["telemetry"]
        assert telemetry is not None, node_id
        host = telemetry["host"]
        assert host["cpu_count"] >= 1 and 0 <= host["cpu_percent"] <= 100
        assert 0 < host["memory_used_bytes"] < host["memory_total_bytes"]
        assert telemetry["gpu"]["state"] == "none" and telemetry["gpu"]["gpus"] == []  # no GPU here
    slave_reading = seen["slave-a"]["telemetry"]
    text = {r["kind"]: r for r in slave_reading["runtimes"]}["text"]
    assert text["backend"] == "llama-server" and text["state"] == "ready" and text["model_id"] == "beta"
    assert text["loaded_since_ms"] and text["last_load_ms"] is not None and text["queue_depth"] == 0
    assert text["loads"] == THRASH_LOADS + 1 and text["failed_loads"] == 1
    counters = text["counters"]
    assert counters["tokens_predicted_total"] == 5 and counters["prompt_tokens_total"] > 0
    assert counters["requests_processing"] == 0 and counters["requests_deferred"] == 0
    codes = sorted(flag["code"] for flag in slave_reading["attention"])
    assert codes == ["failed_loads", "swap_thrash"]
    assert seen["master"]["telemetry"]["attention"] == []  # the master itself is quiet


@pytest_twisted.ensureDeferred
async def test_the_nodes_metrics_carry_the_host_gauges(cluster: Cluster) -> None:
    master_agent = cluster.master.node.master
    assert master_agent is not None
    await master_agent.poll_all()
    text = (await (await treq.get(cluster.master.url + "/metrics")).text())
    assert "\nrouterd_host_cpu_percent " in text and "\nrouterd_host_memory_total_bytes " in text
    assert "\nrouterd_gpu_utilization_percent{" not in text  # no GPU on this machine
