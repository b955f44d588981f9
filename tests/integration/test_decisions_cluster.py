"""The decision log across a real master and slave: rows merged newest first, a stopped node reported."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_twisted
import treq
from twisted.internet import reactor, task

from routerd import __version__
from tests.integration.nodes import (
    TOKEN,
    Pair,
    start_pair,
)


@pytest_twisted.async_yield_fixture
async def pair(tmp_path: Path) -> AsyncIterator[Pair]:
    running = await start_pair(tmp_path)
    yield running
    await running.stop()

async def _get(url: str, **kwargs: Any) -> tuple[int, Any]:
    response = await treq.get(url, **kwargs)
    return response.code, await response.json()


async def _tick() -> None:
    await task.deferLater(reactor, 0.02, lambda: None)


@pytest_twisted.ensureDeferred
async def test_site_decisions_merge_both_nodes_newest_first_and_report_a_stopped_slave(pair: Pair) -> None:
    master_log = pair.master.node.lending.decisions
    assert pair.slave is not None
    slave_log = pair.slave.node.lending.decisions
    master_log.record("plan", "granted", lane="image", trigger="enqueued", owner_node_id="slave-a",
                      owner_model_id="chat", helper_node_id="master", helper_model_id="chat", slots=2)
    await _tick()
    slave_log.record("dispatch", "lease_updated", lane="image", trigger="grant", owner_model_id="chat",
                     helper_node_id="master", helper_model_id="chat", slots=2)
    await _tick()
    slave_log.record("dispatch", "lent", lane="image", owner_model_id="chat", helper_node_id="master",
                     helper_model_id="chat", slots=2, lent_out=1, wait_ms=3)
    await _tick()
    master_log.record("helper", "borrowed_returned", lane="text", reason="own_work_arrived")

    # rows still in the buffers are flushed by the queries themselves
    code, body = await _get(pair.master.url + "/router/v1/site/offload/decisions")
    assert code == 200, body
    assert [(r["node_id"], r["outcome"]) for r in body["records"]] == [
        ("master", "borrowed_returned"), ("slave-a", "lent"), ("slave-a", "lease_updated"),
        ("master", "granted")]
    times = [r["recorded_at"] for r in body["records"]]
    assert times == sorted(times, reverse=True)
    assert {r["router_version"] for r in body["records"]} == {__version__}
    assert body["node_errors"] == []

    code, body = await _get(pair.master.url + "/router/v1/site/offload/decisions?lane=image&limit=2")
    assert [r["outcome"] for r in body["records"]] == ["lent", "lease_updated"]
    code, body = await _get(pair.master.url + "/router/v1/site/offload/decisions?node_id=master")
    assert {r["node_id"] for r in body["records"]} == {"master"}

    # the node API itself needs the cluster token
    code, _ = await _get(pair.slave.url + "/router/v1/node/offload/decisions")
    assert code == 401
    code, body = await _get(pair.slave.url + "/router/v1/node/offload/decisions?kind=dispatch",
                            headers={"authorization": f"Bearer {TOKEN}"})
    assert code == 200 and len(body["records"]) == 2

    code, summary = await _get(pair.master.url + "/router/v1/site/offload/summary")
    assert code == 200, summary
    assert [(n["node_id"], n["in_sync"]) for n in summary["nodes"]] == [("master", True), ("slave-a", True)]
    assert summary["leases"] == [] and "node_errors" not in summary

    # the site routes answer 404 on a slave
    code, _ = await _get(pair.slave.url + "/router/v1/site/offload/decisions")
    assert code == 404

    slave, pair.slave = pair.slave, None
    await slave.stop()  # a stopped node also drops the keep-alive connections the master holds
    code, body = await _get(pair.master.url + "/router/v1/site/offload/decisions")
    assert code == 200
    assert [r["outcome"] for r in body["records"]] == ["borrowed_returned", "granted"]
    assert [e["node_id"] for e in body["node_errors"]] == ["slave-a"]
    code, summary = await _get(pair.master.url + "/router/v1/site/offload/summary")
    assert [n["node_id"] for n in summary["nodes"]] == ["master"]
    assert [e["node_id"] for e in summary["node_errors"]] == ["slave-a"]
