"""Helper-side returns and the per-request gates end to end: a master, an owner slave and a helper
slave with simulator backends (reference §6/§7, §10 scenario 53).

* A helper whose linked model is gone hands lent work back; the owner answers every request.
* A borrowed request still waiting for its model to load goes back when the helper's own work
  arrives, and the owner serves it.
* A queued request too big for the helper's context window stays with the owner while short ones
  are lent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest_twisted
import treq
from twisted.internet import defer, reactor, task

from routerd.catalog.catalog import Catalog
from tests.integration.nodes import (
    FAST_TEXT,
    ClusterPlan,
    RunningNode,
    plan_cluster,
    start_node,
    wait_until,
    write_models,
)

LENDING = {"scheduling_min_samples": 2, "offload_probe_idle": "100ms", "scheduling_refresh_interval": "10m"}
JOB = {**FAST_TEXT, "load_ms": 30, "gen_tokens_per_s": 200}  # ~100 ms per 20-token answer


@attrs.define
class Trio:
    plan: ClusterPlan
    master: RunningNode
    owner: RunningNode
    helper: RunningNode

    async def stop(self) -> None:
        for running in (self.helper, self.owner, self.master):
            await running.stop()


async def start_trio(root: Path, *, helper_weights: Mapping[str, Any] = JOB, helper_context: int = 4096,
                     quiet_registry: bool = False) -> Trio:
    """``quiet_registry``: the master learns of model changes only at registration (no re-polls)."""
    plan = plan_cluster(root, ["owner", "helper"])
    (plan.root / "master" / "models").mkdir(parents=True)
    write_models(plan.root / "owner", {"alpha": {"model": "../weights/alpha.sim.json", "contextsize": 4096}},
                 {"alpha": JOB})
    write_models(plan.root / "helper",
                 {"beta": {"model": "../weights/beta.sim.json", "contextsize": helper_context}},
                 {"beta": helper_weights})
    master_extra: dict[str, Any] = dict(LENDING)
    slave_extra: dict[str, Any] = dict(LENDING)
    if quiet_registry:
        master_extra["health_interval"] = "10m"
        slave_extra["sync_interval"] = "10m"
    master = await start_node(plan.master_config(master_extra))
    owner = await start_node(plan.slave_config("owner", extra_cluster=slave_extra))
    helper = await start_node(plan.slave_config("helper", extra_cluster=slave_extra))
    registry = master.node.master.registry  # type: ignore[union-attr]
    await wait_until(lambda: registry.find("helper", local_id="beta") is not None
                     and registry.find("owner", local_id="alpha") is not None)
    return Trio(plan, master, owner, helper)


def chat(model: str, content: str = "tell me a short story please") -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 20}


async def _chat(url: str, model: str, content: str = "tell me a short story please",
                ) -> tuple[int, dict[str, Any], Any]:
    response = await treq.post(url + "/v1/chat/completions", json=chat(model, content))
    return response.code, json.loads(await response.content()), response


async def _warm_and_link(trio: Trio) -> None:
    for model in ("alpha", "beta"):
        for _ in range(3):
            code, _, _ = await _chat(trio.master.url, model)
            assert code == 200
    for node in (trio.owner, trio.helper):
        await node.node._refit()
    response = await treq.post(trio.master.url + "/router/v1/site/text-routing-groups", json={
        "anchor": {"node_id": "owner", "model_id": "alpha"},
        "lends_to": [{"node_id": "helper", "model_id": "beta", "load_if_unloaded": True}],
        "acknowledge_different_weights": True})
    assert response.code == 200, await response.content()
    await wait_until(lambda: trio.owner.node.lending.queues["text"].is_owner("alpha")
                     and trio.helper.node.lending.queues["text"].is_enrolled("beta"))


def _header(response: Any, name: bytes) -> str | None:
    values = response.headers.getRawHeaders(name)
    return values[0].decode() if values else None


async def _sleep(seconds: float) -> None:
    await task.deferLater(reactor, seconds, lambda: None)


@pytest_twisted.ensureDeferred
async def test_a_helper_that_lost_the_linked_model_hands_lent_work_back_and_the_owner_answers_all(
        tmp_path: Path) -> None:
    trio = await start_trio(tmp_path, quiet_registry=True)
    try:
        await _warm_and_link(trio)
        # the helper's model goes away after the link was made (the master has not noticed yet)
        helper = trio.helper.node
        (trio.plan.root / "helper" / "models" / "beta.kcpps").unlink()
        helper.catalog = Catalog.scan(helper.config.models.config_dir, helper.config.backend.mode)
        assert helper.catalog.get("beta") is None
        results = await defer.gatherResults(
            [defer.Deferred.fromCoroutine(_chat(trio.master.url, "alpha")) for _ in range(10)])
        assert [code for code, _, _ in results] == [200] * 10
        assert all(payload["model"] == "alpha" for _, payload, _ in results)
        assert all(_header(r, b"x-routerd-node") == "owner" for _, _, r in results)
        owner_rows = await trio.owner.node.lending.decisions.query(kind="dispatch", limit=500)
        outcomes = [row["outcome"] for row in owner_rows]
        assert "lent" in outcomes and "returned" in outcomes  # lent, handed back with 409, re-run
        assert trio.owner.node.lending.queues["text"].lent("alpha") == []
    finally:
        await trio.stop()


@pytest_twisted.ensureDeferred
async def test_returns_while_loading_a_borrowed_request_waiting_for_its_model_goes_back_to_the_owner(
        tmp_path: Path) -> None:
    trio = await start_trio(tmp_path, helper_weights={**JOB, "load_ms": 800})
    try:
        await _warm_and_link(trio)
        helper = trio.helper.node
        await helper.runtimes.unload("all")  # a borrowed request now has to load beta (0.8 s)
        # an unloaded helper is probed once idle for 12 × probe idle (1.2 s) and switch + restore
        await _sleep(1.3)
        burst = [defer.Deferred.fromCoroutine(_chat(trio.master.url, "alpha")) for _ in range(6)]
        await wait_until(lambda: any(helper.local.waiting_for_runtime(b["request_id"])
                                     for b in helper.lending.borrowed_requests()), timeout=5)
        own = defer.Deferred.fromCoroutine(_chat(trio.helper.url, "beta"))  # the helper's own work
        results = await defer.gatherResults([*burst, own])
        assert [code for code, _, _ in results] == [200] * 7
        assert [payload["model"] for _, payload, _ in results] == ["alpha"] * 6 + ["beta"]
        helper_rows = await helper.lending.decisions.query(outcome="borrowed_returned", limit=50)
        assert [row["reason"] for row in helper_rows] == ["own_work_arrived"]
        owner_rows = await trio.owner.node.lending.decisions.query(outcome="returned", limit=50)
        assert len(owner_rows) == 1  # the owner re-ran it
        # the helper loaded beta once: the load carried on for its own request
        loads = await helper.store.load_samples(0)  # type: ignore[union-attr]
        assert [s.config_filename for s in loads].count("beta.kcpps") == 2  # warm-up + this one
    finally:
        await trio.stop()


@pytest_twisted.ensureDeferred
async def test_a_long_request_stays_with_the_owner_while_short_ones_are_lent(tmp_path: Path) -> None:
    trio = await start_trio(tmp_path, helper_context=256)
    try:
        await _warm_and_link(trio)
        owner = trio.owner.node
        profile = owner.lending.costs.token_profile("alpha")
        assert profile is not None, "a token profile from the warm-up"
        # ~400 words as wide as the measured bytes per token (the simulator counts words): an
        # estimate above the helper's 256-token window, well within the owner's 4096
        width = max(int(profile.conservative_bytes_per_token), 2)
        long_text = ("x" * (width - 1) + " ") * 400
        first = [defer.Deferred.fromCoroutine(_chat(trio.owner.url, "alpha")) for _ in range(2)]
        await wait_until(lambda: len(owner.lending.queues["text"].admitted()) == 2)
        long = defer.Deferred.fromCoroutine(_chat(trio.owner.url, "alpha", long_text))
        await wait_until(lambda: len(owner.lending.queues["text"]) == 3)
        rest = [defer.Deferred.fromCoroutine(_chat(trio.owner.url, "alpha")) for _ in range(9)]
        results = await defer.gatherResults([*first, long, *rest])
        assert [code for code, _, _ in results] == [200] * 12
        long_response = results[2][2]
        assert _header(long_response, b"x-routerd-lent-to") is None
        assert _header(long_response, b"x-routerd-node") == "owner"
        lent = [r for _, _, r in results if _header(r, b"x-routerd-lent-to")]
        assert lent, "short requests were lent"
        assert all(_header(r, b"x-routerd-lent-to") == "helper/beta" for r in lent)
        leases = await owner.lending.decisions.query(outcome="lease_updated", limit=50)
        assert leases
    finally:
        await trio.stop()
