"""Issue 22 with lending (master, owner and helper with simulator processes): a lent request is the
owner's ``lent`` row and the helper's ``borrowed`` row, so the site counts each request once and shows
how much work lending moved."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest_twisted
import treq
from twisted.internet import defer

from tests.integration.lending_support import JOB, Trio, ask_chat, start_trio, text_models, warm_and_link


@pytest_twisted.async_yield_fixture
async def trio(tmp_path: Path) -> AsyncIterator[Trio]:
    running = await start_trio(tmp_path, text_models(alpha=JOB), text_models(beta=JOB))
    for node in (running.master, running.owner, running.helper):  # analytics on, from the start
        node.node.analytics.config = attrs.evolve(node.node.analytics.config, enabled=True)
    yield running
    await running.stop()


@pytest_twisted.ensureDeferred
async def test_lent_requests_count_once_lent_on_the_owner_and_borrowed_on_the_helper(trio: Trio) -> None:
    await warm_and_link(trio)  # 3 + 3 requests served where their models are
    results = await defer.gatherResults(
        [defer.Deferred.fromCoroutine(ask_chat(trio.master.url, "alpha")) for _ in range(10)])
    assert all(code == 200 for code, _, _ in results)
    lent = sum(1 for _, _, r in results if r.headers.getRawHeaders(b"x-routerd-lent-to"))
    assert lent > 0, "some of the backlog went to the helper"
    response = await treq.post(trio.master.url + "/router/v1/site/analytics/flush")
    assert response.code == 200
    response = await treq.get(trio.master.url + "/router/v1/site/analytics?period=1h")
    site = json.loads(await response.content())
    models = {(m["model"], m["node_id"]): m for m in site["models"]}
    assert models[("alpha", "owner")]["lent"] == lent
    assert models[("alpha", "owner")]["requests"] == 3 + 10 - lent
    assert models[("beta", "helper")]["borrowed"] == lent
    assert models[("beta", "helper")]["requests"] == 3 + lent
    assert site["totals"]["requests"] == 16 and site["totals"]["lent"] == site["totals"]["borrowed"] == lent
