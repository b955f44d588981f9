"""Cook on a real cluster (issue 22): the master builds a ``.kcpps`` on its slave from the files
the slave's ``models.file_roots`` expose, the model appears in the inventory and serves a chat, and
deleting it takes it out again.  Two real nodes on loopback, simulator backends."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_twisted
import treq

from tests.integration.nodes import (
    FAST_TEXT,
    ClusterPlan,
    RunningNode,
    plan_cluster,
    start_cluster,
    wait_until,
    write_models,
)


@pytest_twisted.async_yield_fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[ClusterPlan, RunningNode, RunningNode]]:
    plan = plan_cluster(tmp_path, ["slave-a"])
    write_models(plan.root / "master", {"chat": {"model": "../weights/chat.sim.json"}}, {"chat": FAST_TEXT})
    write_models(plan.root / "slave-a", {}, {"brewed": FAST_TEXT})  # weights, no config yet
    cluster = await start_cluster(plan, slaves={"slave-a": plan.slave_config(
        "slave-a", sections={"models": {"config_dir": str(plan.root / "slave-a" / "models"),
                                        "file_roots": [str(plan.root / "slave-a" / "weights")]}})})
    yield plan, cluster.master, cluster.slaves["slave-a"]
    await cluster.stop()


async def call(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    response = await (treq.request(method, url, json=body) if body is not None else treq.request(method, url))
    return response.code, json.loads(await response.content())


@pytest_twisted.ensureDeferred
async def test_the_master_cooks_a_model_on_its_slave_that_then_serves_and_is_removed(
        pair: tuple[ClusterPlan, RunningNode, RunningNode]) -> None:
    plan, master, _slave = pair
    site = master.url + "/router/v1/site/cook"
    code, files = await call("GET", site + "/files?node_id=slave-a")
    assert code == 200 and [f["path"] for f in files["files"]] == ["brewed.sim.json"]
    order = {"node_id": "slave-a", "id": "brewed", "files": {"model": "brewed.sim.json"}, "contextsize": 2048}
    code, preview = await call("POST", site + "/preview", order)
    assert code == 200 and preview["check"] == {"ok": True, "errors": []}, preview
    code, applied = await call("POST", site + "/apply", order)
    assert code == 200 and applied["applied"], applied
    written = json.loads((plan.root / "slave-a" / "models" / "brewed.kcpps").read_text())
    assert written["contextsize"] == 2048

    registry = master.node.master.registry  # type: ignore[union-attr]
    await wait_until(lambda: registry.find("slave-a", local_id="brewed") is not None)
    code, answer = await call("POST", master.url + "/v1/chat/completions",
                              {"model": "brewed", "messages": [{"role": "user", "content": "hi"}],
                               "max_tokens": 4})
    assert code == 200 and answer["choices"], answer

    code, unsafe = await call("POST", site + "/preview", {**order, "files": {"model": "../models/x.kcpps"}})
    assert code == 400 and unsafe["error"]["code"] == "unsafe_path"
    code, deleted = await call("DELETE", site + "/brewed?node_id=slave-a")
    assert code == 200 and deleted["deleted"], deleted
    await wait_until(lambda: registry.find("slave-a", local_id="brewed") is None)
