"""Backlog lending end to end: a master, an owner slave and a helper slave with simulator backends.

Time is scaled so a job takes about 100 ms.  Costs are fitted from real samples
of warm-up traffic; the link is made through the master's site API and pushed.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_twisted
import treq
from twisted.internet import defer, reactor, task

from tests.integration.lending_support import (
    JOB,
    LENDING,
    Trio,
    ask_chat,
    chat,
    lend_to_the_master,
    start_trio,
    text_models,
    warm_and_link,
)
from tests.integration.nodes import TOKEN, plan_cluster, start_node, wait_until, write_models


@pytest_twisted.async_yield_fixture
async def trio(tmp_path: Path) -> AsyncIterator[Trio]:
    running = await start_trio(tmp_path, text_models(alpha=JOB), text_models(beta=JOB))
    yield running
    await running.stop()  # the test may have replaced the master


@pytest_twisted.ensureDeferred
async def test_ten_requests_two_in_the_backend_the_rest_held_and_lent_to_an_equal_helper(trio: Trio) -> None:
    await warm_and_link(trio)
    results = await defer.gatherResults(
        [defer.Deferred.fromCoroutine(ask_chat(trio.master.url, "alpha")) for _ in range(10)])
    assert all(code == 200 for code, _, _ in results)
    assert all(payload["model"] == "alpha" for _, payload, _ in results)
    lent = [r for _, _, r in results if r.headers.getRawHeaders(b"x-routerd-lent-to")]
    assert lent, "some of the backlog went to the helper"
    assert all(r.headers.getRawHeaders(b"x-routerd-lent-to") == [b"helper/beta"] for r in lent)
    assert all(r.headers.getRawHeaders(b"x-routerd-node") == [b"helper"] for r in lent)
    # (that this finishes sooner than the owner alone is a benchmark figure: benchmarks/lending.py (a);
    # a wall-clock bound here failed on a loaded CI machine)
    # the decision log shows every step: plan rows on the master, dispatch rows on the owner
    owner_rows = await trio.owner.node.lending.decisions.query(kind="dispatch", limit=500)
    outcomes = {row["outcome"] for row in owner_rows}
    assert {"lease_updated", "lent"} <= outcomes
    master_rows = await trio.master.node.lending.decisions.query(kind="plan", limit=500)
    assert any(row["outcome"] == "granted" for row in master_rows)
    assert trio.owner.node.lending.queues["text"].pending() == []
    # and /metrics counts them: lent requests on the owner, plan durations on the master
    owner_metrics = (await (await treq.get(trio.owner.url + "/metrics")).content()).decode()
    assert 'routerd_lending_decisions_total{kind="dispatch",lane="text",outcome="lent",reason=""}' \
        in owner_metrics
    master_metrics = (await (await treq.get(trio.master.url + "/metrics")).content()).decode()
    plans = [line for line in master_metrics.splitlines()
             if line.startswith("routerd_lending_plan_duration_seconds_count")]
    assert plans and float(plans[0].split()[-1]) > 0


@pytest_twisted.ensureDeferred
async def test_a_helpers_own_request_returns_borrowed_work_and_the_owner_reruns_it(trio: Trio) -> None:
    await warm_and_link(trio)
    burst = [defer.Deferred.fromCoroutine(ask_chat(trio.master.url, "alpha")) for _ in range(10)]
    await task.deferLater(reactor, 0.15, lambda: None)
    own = defer.Deferred.fromCoroutine(ask_chat(trio.master.url, "beta"))
    results = await defer.gatherResults([*burst, own])
    assert all(code == 200 for code, _, _ in results)
    # nothing was lost or answered twice: every request got one answer of its own model
    assert [payload["model"] for _, payload, _ in results] == ["alpha"] * 10 + ["beta"]
    helper_rows = await trio.helper.node.lending.decisions.query(kind="helper", limit=500)
    owner_rows = await trio.owner.node.lending.decisions.query(kind="dispatch", limit=500)
    if any(row["outcome"] == "borrowed_returned" for row in helper_rows):
        assert any(row["outcome"] == "returned" for row in owner_rows)


@pytest_twisted.ensureDeferred
async def test_a_200_request_burst_loses_nothing_and_answers_each_once(trio: Trio) -> None:
    await warm_and_link(trio)
    results = await defer.gatherResults(
        [defer.Deferred.fromCoroutine(ask_chat(trio.master.url, "alpha")) for _ in range(200)])
    assert [code for code, _, _ in results] == [200] * 200
    ids = [r.headers.getRawHeaders(b"x-routerd-request-id")[0] for _, _, r in results]
    assert len(set(ids)) == 200
    assert all(payload["model"] == "alpha" for _, payload, _ in results)
    assert any(r.headers.getRawHeaders(b"x-routerd-lent-to") for _, _, r in results)
    for node in (trio.owner, trio.helper):
        queue = node.node.lending.queues["text"]
        assert queue.pending() == [] and queue.admitted() == [] and queue.lent("alpha") == []


@pytest_twisted.ensureDeferred
async def test_owners_keep_serving_their_own_queue_when_the_master_is_down(trio: Trio) -> None:
    await warm_and_link(trio)
    await trio.master.stop()
    results = await defer.gatherResults(
        [defer.Deferred.fromCoroutine(ask_chat(trio.owner.url, "alpha"))
         for _ in range(6)])
    assert [code for code, _, _ in results] == [200] * 6
    assert not any(r.headers.getRawHeaders(b"x-routerd-lent-to") for _, _, r in results)
    # restart so the fixture's teardown has a master to stop
    trio.master = await start_node(trio.plan.master_config(LENDING))


@pytest_twisted.ensureDeferred
async def test_a_helper_that_dies_with_lent_work_hands_it_back_to_the_owner(trio: Trio) -> None:
    await warm_and_link(trio)
    burst = [defer.Deferred.fromCoroutine(ask_chat(trio.master.url, "alpha")) for _ in range(8)]
    await wait_until(lambda: trio.owner.node.lending.queues["text"].lent_count("alpha") > 0, timeout=3)
    await trio.helper.node.runtimes.stop()  # the helper's backend goes away with lent work in it
    results = await defer.gatherResults(burst)
    codes = [code for code, _, _ in results]
    # every accepted request is answered exactly once; the ones caught mid-answer may fail,
    # but none is left hanging and the owner re-ran what came back
    assert len(codes) == 8
    assert codes.count(200) >= 6
    assert trio.owner.node.lending.queues["text"].lent("alpha") == []


@pytest_twisted.ensureDeferred
async def test_a_borrowed_request_needing_a_forbidden_load_is_handed_back_unloaded(trio: Trio) -> None:
    await warm_and_link(trio)
    helper = trio.helper.node
    await helper.runtimes.unload("all")
    headers = {"authorization": f"Bearer {TOKEN}", "x-routerd-offload": "1"}
    response = await treq.post(trio.helper.url + "/router/v1/node/inference/v1/chat/completions",
                               json=chat("beta"), headers=headers)
    body = json.loads(await response.content())
    assert response.code == 409
    assert body["error"]["code"] == "offload_returned"
    assert helper.runtimes.loaded_config("text") is None  # nothing was loaded
    # with the load flag the same borrowed request is served
    headers["x-routerd-offload-load"] = "1"
    response = await treq.post(trio.helper.url + "/router/v1/node/inference/v1/chat/completions",
                               json=chat("beta"), headers=headers)
    assert response.code == 200


@pytest_twisted.ensureDeferred
async def test_the_helper_lists_the_borrowed_work_it_holds(trio: Trio) -> None:
    await warm_and_link(trio)
    seen: list[dict[str, Any]] = []

    async def watch() -> None:
        for _ in range(40):
            response = await treq.get(trio.helper.url + "/router/v1/node/offload/borrowed",
                                      headers={"authorization": f"Bearer {TOKEN}"})
            seen.extend((await response.json())["borrowed"])
            await task.deferLater(reactor, 0.02, lambda: None)

    watching = defer.Deferred.fromCoroutine(watch())
    await defer.gatherResults([defer.Deferred.fromCoroutine(ask_chat(trio.master.url, "alpha"))
                               for _ in range(10)])
    await watching
    assert seen, "borrowed work was listed while the burst ran"
    owners = {(b["owner_node_id"], b["owner_model_id"], b["lane"]) for b in seen}
    assert owners == {("owner", "alpha", "text")}
    assert trio.helper.node.lending.borrowed_requests() == []


@pytest_twisted.ensureDeferred
async def test_the_site_summary_lists_live_leases_with_their_remaining_time(trio: Trio) -> None:
    """Issue 8 item 2: the master's lease book shows in ``GET /router/v1/site/offload/summary``."""
    await warm_and_link(trio)
    seen: list[dict[str, Any]] = []

    async def watch() -> None:
        for _ in range(40):
            response = await treq.get(trio.master.url + "/router/v1/site/offload/summary")
            seen.extend((await response.json())["leases"])
            await task.deferLater(reactor, 0.02, lambda: None)

    watching = defer.Deferred.fromCoroutine(watch())
    await defer.gatherResults([defer.Deferred.fromCoroutine(ask_chat(trio.master.url, "alpha"))
                               for _ in range(10)])
    await watching
    assert seen, "a live lease was listed while the burst ran"
    assert {(x["owner_node_id"], x["owner_model_id"], x["helper_node_id"], x["helper_model_id"])
            for x in seen} == {("owner", "alpha", "helper", "beta")}
    assert all(0 < x["expires_in_ms"] <= x["ttl_ms"] for x in seen)


@pytest_twisted.ensureDeferred
async def test_when_the_master_is_the_helper_it_serves_lent_work_in_process(tmp_path: Path) -> None:
    plan = plan_cluster(tmp_path, ["owner"])
    write_models(plan.root / "master", {"gamma": {"model": "../weights/gamma.sim.json", "contextsize": 4096}},
                 {"gamma": JOB})
    write_models(plan.root / "owner", {"alpha": {"model": "../weights/alpha.sim.json", "contextsize": 4096}},
                 {"alpha": JOB})
    master = await start_node(plan.master_config(LENDING))  # the master has no public_url at all
    owner = await start_node(plan.slave_config("owner", extra_cluster=LENDING))
    try:
        registry = master.node.master.registry  # type: ignore[union-attr]
        await wait_until(lambda: registry.node("owner") is not None)
        for model in ("alpha", "gamma"):
            for _ in range(3):
                code, _, _ = await ask_chat(master.url, model)
                assert code == 200
        await lend_to_the_master(master, owner)
        results = await defer.gatherResults(
            [defer.Deferred.fromCoroutine(ask_chat(master.url, "alpha")) for _ in range(8)])
        assert all(code == 200 for code, _, _ in results)
        lent = [r for _, _, r in results if r.headers.getRawHeaders(b"x-routerd-lent-to")]
        assert lent and all(r.headers.getRawHeaders(b"x-routerd-lent-to") == [b"master/gamma"] for r in lent)
        assert all(r.headers.getRawHeaders(b"x-routerd-node") == [b"master"] for r in lent)
        assert all(payload["model"] == "alpha" for _, payload, _ in results)
    finally:
        await owner.stop()
        await master.stop()
