"""A draining node answers at once what waits in its router queue (server.drain_timeout): its own
requests 503 ``draining`` with ``Retry-After``, borrowed ones 409 ``offload_returned`` so their owner
runs them; what runs in a backend finishes.  Real nodes on loopback with simulator backends.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest_twisted
from twisted.internet import defer

from tests.integration.lending_support import LENDING, ask_chat, start_trio, text_models, warm_and_link
from tests.integration.nodes import FAST_TEXT, node_config, start_node, wait_until, write_models

#: 20 generated tokens at 20 tokens/s: a job generates for about a second.
SLOW = {**FAST_TEXT, "load_ms": 30, "gen_tokens_per_s": 20}
#: One request in each backend at once, and two lease slots whatever the helper is priced at.
DEPTH_ONE = {**LENDING, "scheduling_backend_depth": 1, "offload_slower_helper_slots": 2,
             "offload_probe_helper_slots": 2}


@pytest_twisted.ensureDeferred
async def test_a_draining_node_refuses_its_held_requests_at_once_and_finishes_the_running_one(
        tmp_path: Path) -> None:
    write_models(tmp_path, {"alpha": {"model": "../weights/alpha.sim.json", "contextsize": 4096}},
                 {"alpha": SLOW})
    solo = await start_node(node_config(tmp_path, {"cluster": {"scheduling_backend_depth": 1}}))
    stopped = False
    try:
        queue = solo.node.lending.queues["text"]
        assert (await ask_chat(solo.url, "alpha"))[0] == 200  # the model is loaded
        running = defer.Deferred.fromCoroutine(ask_chat(solo.url, "alpha"))
        await wait_until(lambda: [e.request_id for e in queue.admitted()] != [])
        await wait_until(lambda: [a.state for a in solo.node.local.active.values()] == ["running"])
        held = [defer.Deferred.fromCoroutine(ask_chat(solo.url, "alpha")) for _ in range(2)]
        await wait_until(lambda: len(queue.pending()) == 2)
        began = time.monotonic()
        stopping = defer.ensureDeferred(solo.stop())
        refused = await defer.gatherResults(held)
        waited = time.monotonic() - began
        assert [(code, body["error"]["code"]) for code, body, _ in refused] == [(503, "draining")] * 2
        assert all(r.headers.getRawHeaders(b"retry-after") == [b"1"] for _, _, r in refused)
        assert waited < 0.5, waited  # at once, not when the running job ends (about 1 s)
        code, body, _ = await running
        assert code == 200 and body["model"] == "alpha"
        await stopping
        stopped = True
    finally:
        if not stopped:
            await solo.stop()


@pytest_twisted.ensureDeferred
async def test_borrowed_work_waiting_at_a_draining_helper_goes_back_and_its_owner_runs_it(
        tmp_path: Path) -> None:
    """Depth 1 everywhere and a two-slot lease: the helper runs one borrowed job and holds the next
    in its router queue.  The helper drains: the held one goes back with 409 and the owner runs it,
    so every client gets its answer (before, the owner passed the helper's 503 on)."""
    trio = await start_trio(tmp_path, text_models(alpha=SLOW), text_models(beta=SLOW),
                            master_extra=DEPTH_ONE, slave_extra=DEPTH_ONE)
    try:
        await warm_and_link(trio)
        helper = trio.helper.node.lending
        burst = [defer.Deferred.fromCoroutine(ask_chat(trio.owner.url, "alpha")) for _ in range(6)]
        states = ["queued", "running"]  # one borrowed job generating, the next held in its router queue
        await wait_until(lambda: sorted(b["state"] for b in helper.borrowed_requests()) == states, timeout=10)
        draining = defer.ensureDeferred(trio.helper.node.drain(30.0))  # what a stop does first
        results = await defer.gatherResults(burst)
        assert [code for code, _, _ in results] == [200] * 6, [body for _, body, _ in results]
        assert all(body["model"] == "alpha" for _, body, _ in results)
        await draining
        rows = await helper.decisions.query(kind="helper", limit=50)  # type: ignore[union-attr]
        assert any(row["outcome"] == "borrowed_returned" for row in rows)
        owner_rows = await trio.owner.node.lending.decisions.query(kind="dispatch", limit=500)  # type: ignore[union-attr]
        assert any(row["outcome"] == "returned" for row in owner_rows)
    finally:
        await trio.stop()
