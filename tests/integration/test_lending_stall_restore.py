"""The stall check and restore after borrow with real nodes and simulator backends.

Stall: a helper whose backend hangs keeps its lent work while it still lists it (the master asks
after ``offload_lent_stall_timeout`` with no change); once it no longer has it, the master reclaims
every request lent to it and the owner serves them.  Restore: a helper whose model was displaced by
borrowed work with the restore flag reloads it after ``offload_restore_delay``; a native request
arriving first cancels that.
"""

from __future__ import annotations

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
    start_trio,
    text_models,
    warm_and_link,
)
from tests.integration.nodes import TOKEN, wait_until

STALL = {**LENDING, "offload_lent_stall_timeout": "1s", "offload_restore_delay": "1s"}


@pytest_twisted.async_yield_fixture
async def trio(tmp_path: Path) -> AsyncIterator[Trio]:
    """Owner ``alpha``; helper ``beta`` (linked) and its own ``xray``."""
    running = await start_trio(tmp_path, text_models(alpha=JOB), text_models(beta=JOB, xray=JOB),
                               master_extra=STALL, slave_extra=STALL)
    yield running
    await running.stop()


async def _sim_control(trio: Trio, body: dict[str, Any]) -> None:
    (text,) = [s for s in trio.helper.node.runtimes.status() if s.kind == "text"]
    assert text.port is not None
    response = await treq.post(f"http://127.0.0.1:{text.port}/sim/control", json=body)
    assert response.code == 200, await response.content()


def _sleep(seconds: float) -> defer.Deferred[None]:
    return task.deferLater(reactor, seconds, lambda: None)


@pytest_twisted.ensureDeferred
async def test_a_stalled_helper_keeps_work_it_still_lists_and_loses_all_of_it_once_not(trio: Trio) -> None:
    await warm_and_link(trio)
    await _sim_control(trio, {"hang": True})  # the helper's backend never answers
    helper = trio.helper.node.lending
    asked: list[int] = []
    real = helper.borrowed_requests
    forgot = False

    def borrowed_requests() -> list[dict[str, Any]]:
        listed = [] if forgot else real()
        asked.append(len(listed))
        return listed

    helper.borrowed_requests = borrowed_requests  # type: ignore[method-assign]
    burst = [defer.Deferred.fromCoroutine(ask_chat(trio.master.url, "alpha")) for _ in range(6)]
    tracker = trio.master.node.coordinator.stall.tracker  # type: ignore[union-attr]
    await wait_until(lambda: tracker.outstanding("helper"), timeout=3)
    # the first question, a stall timeout later: the helper still runs them, so it keeps them
    await wait_until(lambda: asked, timeout=3)
    assert asked[0] > 0
    assert tracker.outstanding("helper")
    assert await trio.master.node.lending.decisions.query(outcome="stall_reclaimed") == []
    # now the helper no longer has them: the next question reclaims every one, the owner serves them
    forgot = True
    results = await defer.gatherResults(burst).addTimeout(15, reactor)
    assert [code for code, _, _ in results] == [200] * 6
    assert [payload["model"] for _, payload, _ in results] == ["alpha"] * 6
    assert all(r.headers.getRawHeaders(b"x-routerd-node") == [b"owner"] for _, _, r in results)
    reclaimed = await trio.master.node.lending.decisions.query(outcome="stall_reclaimed")
    assert reclaimed
    assert {(r["owner_node_id"], r["helper_node_id"], r["lane"]) for r in reclaimed} == {
        ("owner", "helper", "text")}
    returned = await trio.owner.node.lending.decisions.query(outcome="returned")
    assert {r["request_id"] for r in reclaimed} <= {r["request_id"] for r in returned}
    assert tracker.outstanding("helper") == []
    assert trio.owner.node.lending.queues["text"].lent("alpha") == []
    await _sim_control(trio, {"hang": False})


BORROWED = {"authorization": f"Bearer {TOKEN}", "x-routerd-offload": "1", "x-routerd-offload-load": "1",
            "x-routerd-offload-owner": "owner", "x-routerd-offload-owner-model": "alpha"}


async def _borrowed_chat(trio: Trio, *, restore: bool) -> int:
    headers = {**BORROWED, **({"x-routerd-offload-restore": "1"} if restore else {})}
    response = await treq.post(trio.helper.url + "/router/v1/node/inference/v1/chat/completions",
                               json=chat("beta"), headers=headers)
    await response.content()
    return int(response.code)


async def _link_restoring(trio: Trio) -> None:
    response = await treq.post(trio.master.url + "/router/v1/site/text-routing-groups", json={
        "anchor": {"node_id": "owner", "model_id": "alpha"},
        "lends_to": [{"node_id": "helper", "model_id": "beta", "load_if_unloaded": True,
                      "restore_after_borrow": True}],
        "acknowledge_different_weights": True})
    assert response.code == 200, await response.content()
    await wait_until(lambda: trio.helper.node.lending.queues["text"].is_enrolled("beta"))


async def _helper_holds_xray(trio: Trio) -> None:
    await _link_restoring(trio)
    response = await treq.post(trio.helper.url + "/router/v1/node/inference/v1/chat/completions",
                               json=chat("xray"), headers={"authorization": f"Bearer {TOKEN}"})
    assert response.code == 200, await response.content()
    assert trio.helper.node.runtimes.loaded_config("text") == "xray.kcpps"


@pytest_twisted.ensureDeferred
async def test_a_helper_reloads_the_model_borrowed_work_displaced_after_the_restore_delay(trio: Trio) -> None:
    helper = trio.helper.node
    await _helper_holds_xray(trio)
    sent_at = reactor.seconds()
    assert await _borrowed_chat(trio, restore=True) == 200
    assert helper.runtimes.loaded_config("text") == "beta.kcpps"  # borrowed work displaced xray
    await wait_until(lambda: helper.runtimes.loaded_config("text") == "xray.kcpps", timeout=5)
    assert reactor.seconds() - sent_at >= 1.0  # not before the restore delay
    assert helper.samples.own_work_at >= sent_at + 1.0  # the restore was own work: idle-for starts after it
    # without the restore flag the helper keeps the linked model
    assert await _borrowed_chat(trio, restore=False) == 200
    await _sleep(1.5)
    assert helper.runtimes.loaded_config("text") == "beta.kcpps"


@pytest_twisted.ensureDeferred
async def test_a_native_request_arriving_first_cancels_the_pending_restore(trio: Trio) -> None:
    helper = trio.helper.node
    await _helper_holds_xray(trio)
    assert await _borrowed_chat(trio, restore=True) == 200
    assert helper.runtimes.loaded_config("text") == "beta.kcpps"
    code, payload, _ = await ask_chat(trio.helper.url, "beta")  # the helper's own request for beta
    assert code == 200 and payload["model"] == "beta"
    await _sleep(1.5)
    assert helper.runtimes.loaded_config("text") == "beta.kcpps"
    assert not helper.restorer.plan.pending
