"""Image-lane lending end to end (issue 8 item 1): a master, an owner slave and a helper slave, each
image model on its own ``sd-server`` simulator process.

The owner's samples, its fit and its queue stats must all be keyed by the image ID its link names,
so the master prices the owner and grants by the cost rule (not just one-request probes).  A job is
20 steps of 512×512 at 20 ms per step-megapixel: about 105 ms.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_twisted
import treq
from twisted.internet import defer

from tests.integration.lending_support import Trio, image_models, link, start_trio

PAINTER = {"kind": "image", "load_ms": 30, "ms_per_step_megapixel": 20}
OWNER_IMAGE, HELPER_IMAGE = "paint-paint", "brush-brush"  # <local id>-<weights file name>
JOB = {"prompt": "a lighthouse at dusk", "size": "512x512", "steps": 20}


@pytest_twisted.async_yield_fixture
async def trio(tmp_path: Path) -> AsyncIterator[Trio]:
    running = await start_trio(tmp_path, image_models(paint=PAINTER), image_models(brush=PAINTER))
    yield running
    await running.stop()


async def _image(url: str, model: str) -> tuple[int, dict[str, Any], Any]:
    response = await treq.post(url + "/v1/images/generations", json={"model": model, **JOB})
    return response.code, json.loads(await response.content()), response


@pytest_twisted.ensureDeferred
async def test_a_burst_of_same_size_image_jobs_is_granted_and_partly_served_by_the_helper(trio: Trio) -> None:
    for model in (OWNER_IMAGE, HELPER_IMAGE):
        for _ in range(3):
            code, body, _ = await _image(trio.master.url, model)
            assert code == 200, body
    for node, image_id in ((trio.owner, OWNER_IMAGE), (trio.helper, HELPER_IMAGE)):
        await node.node._refit()
        assert node.node.lending.costs.model(image_id, "image") is not None, "fitted under the image ID"
    await link(trio, "image", OWNER_IMAGE, HELPER_IMAGE)

    results = await defer.gatherResults(
        [defer.Deferred.fromCoroutine(_image(trio.master.url, OWNER_IMAGE)) for _ in range(8)])

    assert [code for code, _, _ in results] == [200] * 8
    assert all(len(payload["data"]) == 1 for _, payload, _ in results)
    lent = [r for _, _, r in results if r.headers.getRawHeaders(b"x-routerd-lent-to")]
    assert lent, "some of the burst went to the helper"
    assert all(r.headers.getRawHeaders(b"x-routerd-lent-to") == [f"helper/{HELPER_IMAGE}".encode()]
               for r in lent)
    assert all(r.headers.getRawHeaders(b"x-routerd-node") == [b"helper"] for r in lent)
    plans = await trio.master.node.lending.decisions.query(kind="plan", limit=500)
    granted = [row for row in plans if row["outcome"] == "granted"]
    assert granted, [(r["outcome"], r.get("reason")) for r in plans]  # the cost rule, not probes only
    assert {(row["lane"], row["owner_model_id"], row["helper_model_id"]) for row in granted} == {
        ("image", OWNER_IMAGE, HELPER_IMAGE)}
    assert not any(row.get("reason") == "owner_unpriced" for row in plans)
    owner_rows = await trio.owner.node.lending.decisions.query(kind="dispatch", outcome="lent", limit=500)
    assert len(owner_rows) == len(lent)
    assert trio.owner.node.lending.queues["image"].pending() == []
