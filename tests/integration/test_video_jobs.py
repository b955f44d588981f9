"""Video jobs end to end (issue 21 §3, "Video routes"): real nodes on loopback, each image model on
its own ``sd-server`` simulator process.  A standalone node, and a master forwarding to a slave:
submit, poll until done, the result comes back, the image runtime stays held by the job meanwhile,
cancel works, an unknown job ID is 404.

A job is 20 steps of 512×512 and 5 frames at 20 ms per step-megapixel: about 525 ms.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_twisted
import treq
from twisted.internet import reactor, task

from tests.integration import nodes
from tests.integration.nodes import RunningNode, wait_until

PAINTER = {"kind": "image", "load_ms": 30, "ms_per_step_megapixel": 20}
IMAGE_ID = "paint-paint"  # <local id>-<weights file name>
VIDEO = {"prompt": "a lighthouse at dusk", "width": 512, "height": 512, "video_frames": 5,
         "sample_params": {"sample_steps": 20}}
JOB_S = 20 * 0.262144 * 5 * 0.020


MODELS = {"paint": {"sdmodel": "../weights/paint.sim.json"}}


async def _call(method: str, url: str, body: Any = None) -> tuple[int, Any, Any]:
    response = await treq.request(method, url, json=body) if body is not None else \
        await treq.request(method, url)
    return response.code, json.loads(await response.content()), response


def _image_users(node: RunningNode) -> int:
    return next(s.users for s in node.node.runtimes.status() if s.kind == "image")


async def _until_done(url: str, job_id: str, node: RunningNode) -> tuple[dict[str, Any], list[int]]:
    """Poll the job until it ends; also the image runtime's users seen at each poll on ``node``."""
    users: list[int] = []
    for _ in range(200):
        code, document, _ = await _call("GET", f"{url}/sdcpp/v1/jobs/{job_id}")
        assert code == 200, document
        if document["status"] in ("completed", "failed", "cancelled"):
            return document, users
        users.append(_image_users(node))
        await task.deferLater(reactor, 0.05, lambda: None)
    raise AssertionError("the job never ended")


@pytest_twisted.async_yield_fixture
async def box(tmp_path: Path) -> AsyncIterator[RunningNode]:
    node = await nodes.start_standalone(tmp_path, MODELS, {"paint": PAINTER})
    yield node
    await node.stop()


@pytest_twisted.ensureDeferred
async def test_a_standalone_node_runs_a_video_job_holding_its_runtime_until_it_ends(box: RunningNode) -> None:
    started = reactor.seconds()
    code, accepted, response = await _call("POST", box.url + "/sdcpp/v1/vid_gen",
                                           {"model": IMAGE_ID, **VIDEO})
    assert code == 202, accepted
    assert accepted["poll_url"] == f"/sdcpp/v1/jobs/{accepted['id']}" and accepted["model"] == IMAGE_ID
    assert response.headers.getRawHeaders(b"x-routerd-node") == [box.node.node_id.encode()]

    document, users = await _until_done(box.url, accepted["id"], box)

    assert document["status"] == "completed" and document["id"] == accepted["id"]
    assert document["result"]["frame_count"] == 5 and document["result"]["weights"] == "paint"
    assert users and set(users) == {1}, "the job held the image runtime while it ran"
    assert reactor.seconds() - started >= JOB_S
    await wait_until(lambda: _image_users(box) == 0)
    code, again, _ = await _call("GET", box.url + accepted["poll_url"])
    assert (code, again["status"]) == (200, "completed")  # kept after the runtime was given back


@pytest_twisted.ensureDeferred
async def test_a_queued_job_is_cancelled_and_an_unknown_job_is_404_on_a_standalone_node(
        box: RunningNode) -> None:
    _, first, _ = await _call("POST", box.url + "/sdcpp/v1/vid_gen", {"model": IMAGE_ID, **VIDEO})
    _, second, _ = await _call("POST", box.url + "/sdcpp/v1/vid_gen", {"model": IMAGE_ID, **VIDEO})
    code, cancelled, _ = await _call("POST", box.url + second["poll_url"] + "/cancel")
    assert (code, cancelled["status"]) == (200, "cancelled"), cancelled
    code, refused, _ = await _call("POST", box.url + first["poll_url"] + "/cancel")
    assert (code, refused["error"]["code"]) == (409, "job_not_cancellable")
    document, _ = await _until_done(box.url, first["id"], box)
    assert document["status"] == "completed"
    code, missing, _ = await _call("GET", box.url + "/sdcpp/v1/jobs/rjob_0000")
    assert (code, missing["error"]["code"]) == (404, "job_not_found")


@pytest_twisted.ensureDeferred
async def test_a_master_forwards_a_video_job_and_its_polls_and_cancels_to_the_slave(tmp_path: Path) -> None:
    plan = nodes.plan_cluster(tmp_path, ["slave-a"])
    nodes.write_models(plan.root / "slave-a", MODELS, {"paint": PAINTER})
    nodes.write_models(plan.root / "master", {}, {})
    cluster = await nodes.start_cluster(plan, ready=lambda r: nodes.knows(r, **{"slave-a": "paint"}))
    master, slave = cluster.master, cluster.slaves["slave-a"]
    try:
        code, accepted, response = await _call("POST", master.url + "/sdcpp/v1/vid_gen",
                                               {"model": IMAGE_ID, **VIDEO})
        assert code == 202, accepted
        assert response.headers.getRawHeaders(b"x-routerd-node") == [b"slave-a"]
        _, queued, _ = await _call("POST", master.url + "/sdcpp/v1/vid_gen", {"model": IMAGE_ID, **VIDEO})
        code, cancelled, _ = await _call("POST", master.url + queued["poll_url"] + "/cancel")
        assert (code, cancelled["status"], cancelled["id"]) == (200, "cancelled", queued["id"])

        document, users = await _until_done(master.url, accepted["id"], slave)

        assert document["status"] == "completed" and document["result"]["weights"] == "paint"
        assert users and set(users) == {1}, "the slave's image runtime was held by the job"
        code, missing, _ = await _call("GET", master.url + "/sdcpp/v1/jobs/rjob_0000")
        assert (code, missing["error"]["code"]) == (404, "job_not_found")
    finally:
        await cluster.stop()
