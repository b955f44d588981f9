"""A load a helper began only for borrowed work stops when that work goes back (spec "A helper's own
work"): its own request for its other model loads that model at once instead of waiting for the
borrowed model's load and a switch back.  A master, an owner and a helper on loopback with
simulator backends.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest_twisted
from twisted.internet import defer

from tests.integration.lending_support import LENDING, ask_chat, start_trio, text_models, warm_and_link
from tests.integration.nodes import FAST_TEXT, post, wait_until

#: A job generates for about a second on either node.
JOB = {**FAST_TEXT, "load_ms": 30, "gen_tokens_per_s": 20}
#: The helper's linked model takes 3 s to load; its own other model 0.3 s.
SLOW_LOAD = {**JOB, "load_ms": 3000}
QUICK_LOAD = {**JOB, "load_ms": 300}
SETTINGS = {**LENDING, "scheduling_backend_depth": 1}


@pytest_twisted.ensureDeferred
async def test_the_helpers_own_request_does_not_wait_for_a_load_begun_for_borrowed_work(
        tmp_path: Path) -> None:
    trio = await start_trio(tmp_path, text_models(alpha=JOB), text_models(beta=SLOW_LOAD, gamma=QUICK_LOAD),
                            master_extra=SETTINGS, slave_extra=SETTINGS)
    try:
        await warm_and_link(trio)
        helper = trio.helper.node
        store = helper.store
        assert store is not None
        code, body, _ = await post(trio.helper.url + "/router/v1/load", {"model": "gamma"})
        assert code == 200, body
        assert helper.runtimes.loaded_config("text") == "gamma.kcpps"
        burst = [defer.Deferred.fromCoroutine(ask_chat(trio.owner.url, "alpha")) for _ in range(10)]
        slot = helper.runtimes.slot("text")
        await wait_until(lambda: slot.status().state == "loading" and slot.status().model_id == "beta",
                         timeout=10)
        began = time.time()
        code, body, _ = await ask_chat(trio.helper.url, "gamma")
        answered = time.time()
        took = answered - began
        assert code == 200 and body["model"] == "gamma"
        # gamma's load and one job, not the rest of beta's 3 s load and a switch back
        assert took < 4.0, took
        results = await defer.gatherResults(burst)
        # beta's load was stopped: none finished while the own request waited (later lent work of the
        # burst may load it again)
        finished = [s.finished_at_ms for s in await store.load_samples(0, "beta.kcpps")]
        assert not [ms for ms in finished if began * 1000 <= ms <= answered * 1000], finished
        assert [code for code, _, _ in results] == [200] * 10  # the borrowed one ran at its owner
        rows = await helper.lending.decisions.query(outcome="borrowed_returned", limit=50)  # type: ignore[union-attr]
        assert any(row["reason"] == "own_work_arrived" for row in rows)
    finally:
        await trio.stop()
