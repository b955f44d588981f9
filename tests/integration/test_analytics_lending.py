"""Issue 22 with lending (master, owner and helper with simulator processes): a lent request is the
owner's ``lent`` row and the helper's ``borrowed`` row, so the site counts each request once and shows
how much work lending moved; issue 32: the helper's row is under the model the client asked for (its
own model second), and the recent list shows a lent request once, with its owner and helper."""

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
    models = {(m["model"], m["node_id"], m["local_id"]): m for m in site["models"]}
    assert models[("alpha", "owner", "alpha")]["lent"] == lent
    assert models[("alpha", "owner", "alpha")]["requests"] == 3 + 10 - lent
    assert models[("alpha", "helper", "beta")]["borrowed"] == lent
    assert models[("alpha", "helper", "beta")]["requests"] == lent
    assert models[("beta", "helper", "beta")]["requests"] == 3
    assert site["totals"]["requests"] == 16 and site["totals"]["lent"] == site["totals"]["borrowed"] == lent


@pytest_twisted.ensureDeferred
async def test_a_lent_request_is_one_row_of_the_recent_list_with_its_owner_and_helper(trio: Trio) -> None:
    await warm_and_link(trio)
    results = await defer.gatherResults(
        [defer.Deferred.fromCoroutine(ask_chat(trio.master.url, "alpha")) for _ in range(10)])
    lent_ids = {r.headers.getRawHeaders(b"x-routerd-request-id")[0].decode() for _, _, r in results
                if r.headers.getRawHeaders(b"x-routerd-lent-to")}
    assert lent_ids, "some of the backlog went to the helper"
    response = await treq.get(trio.master.url + "/router/v1/site/analytics/recent?limit=100")
    rows = json.loads(await response.content())["requests"]
    assert len(rows) == 16 and len({r["request_id"] for r in rows}) == 16  # one row a request
    for row in rows:
        if row["request_id"] in lent_ids:
            assert (row["model"], row["node_id"], row["local_id"]) == ("alpha", "helper", "beta")
            assert (row["lent"], row["owner"], row["helper"]) == (True, "owner/alpha", "helper/beta")
        else:
            assert (row["lent"], row["owner"], row["helper"]) == (False, None, None)
    response = await treq.get(trio.master.url + "/router/v1/site/analytics/recent?model=alpha&limit=100")
    rows = json.loads(await response.content())["requests"]
    assert len(rows) == 13 and {r["request_id"] for r in rows} >= lent_ids
