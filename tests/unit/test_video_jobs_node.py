"""Video jobs through real nodes in memory (one ``task.Clock``, the sd-server simulator, no sockets):
``POST /sdcpp/v1/vid_gen`` is routed through the image runtime, answered 202 with a routerd job ID,
the runtime stays held by the job until it ends, and its polls and cancels reach the backend that
runs it — on the node itself, or through the master that forwarded it.

A job here is 20 steps of 512×512 and 5 frames at 1 000 ms per step-megapixel: about 26 simulated
seconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from routerd.node import Node
from tests.unit.node_fixture import World, master_cluster, slave_cluster

PAINT = {"kind": "image", "weights": "paint", "ms_per_step_megapixel": 1000, "load_ms": 100}
OTHER = {"kind": "image", "weights": "other", "ms_per_step_megapixel": 1000, "load_ms": 100}
TIMED = {"extra_args": ["--sim-time-scale", "1"]}  # the simulator's timing model, on the world's clock
VIDEO = {"prompt": "a lighthouse at dusk", "width": 512, "height": 512, "video_frames": 5,
         "sample_params": {"sample_steps": 20}}
JOB_S = 20 * 0.262144 * 5  # 26.2 s


def _json(body: bytes) -> Any:
    return json.loads(body)


def _box(tmp_path: Path) -> tuple[World, Node]:
    world = World(tmp_path)
    node = world.node("box", {"paint": PAINT, "other": OTHER}, sdcpp=TIMED)
    world.start(node)
    return world, node


def _submit(world: World, node: Node, model: str = "paint-paint") -> tuple[Any, dict[str, Any]]:
    response, body = world.call("POST", node, "/sdcpp/v1/vid_gen", json={"model": model, **VIDEO})
    return response, _json(body)


def _image_slot(node: Node) -> Any:
    return next(s for s in node.runtimes.status() if s.kind == "image")


def _poll_until_done(world: World, node: Node, job_id: str) -> dict[str, Any]:
    for _ in range(400):
        response, body = world.call("GET", node, f"/sdcpp/v1/jobs/{job_id}")
        assert response.code == 200, body
        document = _json(body)
        if document["status"] in ("completed", "failed", "cancelled"):
            return document
        world.clock.advance(0.5)
    raise AssertionError("the job never ended")


def test_a_video_job_is_answered_202_with_a_routerd_poll_url_and_its_result_comes_back(
        tmp_path: Path) -> None:
    world, node = _box(tmp_path)
    response, accepted = _submit(world, node)

    assert response.code == 202, accepted
    job_id = accepted["id"]
    assert job_id.startswith("rjob_") and accepted["poll_url"] == f"/sdcpp/v1/jobs/{job_id}"
    assert accepted["kind"] == "vid_gen" and accepted["status"] == "queued"
    assert accepted["model"] == "paint-paint"
    assert response.headers.getRawHeaders(b"x-routerd-node") == [b"box"]
    done = _poll_until_done(world, node, job_id)
    assert done["id"] == job_id and done["status"] == "completed"
    assert done["result"]["frame_count"] == 5 and done["result"]["mime_type"] == "video/webm"
    assert done["result"]["weights"] == "paint"  # the backend of the model the job named ran it
    assert done["result"]["b64_json"]


def test_the_runtime_stays_held_until_the_job_ends_so_no_switch_happens_under_it(tmp_path: Path) -> None:
    """The runtime lease outlives the 202: the slot keeps one user for the whole job, and an image
    request for another model (a switch) is answered only after the job ended."""
    world, node = _box(tmp_path)
    _, accepted = _submit(world, node)
    submitted = world.clock.seconds()
    world.clock.advance(1.0)
    slot = _image_slot(node)
    assert slot.users == 1 and slot.model_id == "paint"
    assert [a["route"] for a in node.state_document()["active_requests"]] == ["/sdcpp/v1/vid_gen"]

    http = world.network.client(world.clock)
    switching = http.request("POST", f"http://{world.netlocs[node]}/v1/images/generations",
                             json={"model": "other-other", "prompt": "a cat", "size": "512x512"})
    answered: list[float] = []
    switching.addCallback(lambda _r: answered.append(world.clock.seconds()))
    done = _poll_until_done(world, node, accepted["id"])
    assert done["status"] == "completed"
    assert not answered, "the switch waited for the job"
    world.run(switching)
    assert answered[0] >= submitted + JOB_S
    assert _image_slot(node).model_id == "other"


def test_the_jobs_duration_is_a_measured_video_sample_not_an_image_one(tmp_path: Path) -> None:
    world, node = _box(tmp_path)
    _, accepted = _submit(world, node)
    _poll_until_done(world, node, accepted["id"])
    world.clock.advance(2.0)
    store = world.stores["box"]
    video = world.run(store.request_samples(None, "video", 0, status=None))
    assert [(s.model_id, s.status) for s in video] == [("paint-paint", "ok")]
    assert video[0].work == (20.0 * 512 * 512 * 5,)
    assert JOB_S * 1000 <= video[0].duration_ms <= (JOB_S + 1.5) * 1000
    assert world.run(store.request_samples(None, "image", 0, status=None)) == []


def test_a_queued_job_is_cancelled_and_a_generating_one_refuses_with_409(tmp_path: Path) -> None:
    world, node = _box(tmp_path)
    _, first = _submit(world, node)
    _, second = _submit(world, node)  # the same model: both run in the one process, one at a time
    world.clock.advance(0.2)

    response, body = world.call("POST", node, f"/sdcpp/v1/jobs/{first['id']}/cancel")
    assert response.code == 409, body
    assert _json(body)["error"]["code"] == "job_not_cancellable"
    response, body = world.call("POST", node, f"/sdcpp/v1/jobs/{second['id']}/cancel")
    assert response.code == 200, body
    assert _json(body)["status"] == "cancelled" and _json(body)["id"] == second["id"]
    world.clock.advance(1.0)
    assert _image_slot(node).users == 1  # the cancelled job gave its runtime back at once
    assert _poll_until_done(world, node, first["id"])["status"] == "completed"
    world.clock.advance(1.0)
    assert _image_slot(node).users == 0


def test_an_unknown_job_is_404_and_a_kobold_or_text_model_cannot_take_a_video_job(tmp_path: Path) -> None:
    world, node = _box(tmp_path)
    response, body = world.call("GET", node, "/sdcpp/v1/jobs/rjob_00112233")
    assert response.code == 404 and _json(body)["error"]["code"] == "job_not_found"
    response, body = world.call("POST", node, "/sdcpp/v1/jobs/rjob_00112233/cancel")
    assert response.code == 404 and _json(body)["error"]["code"] == "job_not_found"
    response, body = world.call("POST", node, "/sdcpp/v1/vid_gen", json={"model": "nope", **VIDEO})
    assert response.code == 404


def _pair(tmp_path: Path) -> tuple[World, Node, Node]:
    world = World(tmp_path)
    slave = world.node("slave", {"paint": PAINT}, sdcpp=TIMED,
                       cluster=slave_cluster())
    master = world.node("master", {}, cluster=master_cluster())
    world.start(slave, master)
    return world, master, slave


def test_a_master_forwards_the_job_and_passes_its_polls_and_cancels_to_the_owning_node(
        tmp_path: Path) -> None:
    world, master, slave = _pair(tmp_path)
    response, accepted = _submit(world, master)
    assert response.code == 202, accepted
    assert response.headers.getRawHeaders(b"x-routerd-node") == [b"slave"]
    _, queued = _submit(world, master)
    world.clock.advance(0.2)
    assert _image_slot(slave).users == 2

    response, body = world.call("POST", master, f"/sdcpp/v1/jobs/{queued['id']}/cancel")
    assert response.code == 200 and _json(body)["status"] == "cancelled"
    response, body = world.call("POST", master, f"/sdcpp/v1/jobs/{accepted['id']}/cancel")
    assert response.code == 409
    done = _poll_until_done(world, master, accepted["id"])
    assert done["status"] == "completed" and done["id"] == accepted["id"]
    assert done["result"]["weights"] == "paint"
    response, _ = world.call("GET", master, "/sdcpp/v1/jobs/rjob_unknown")
    assert response.code == 404


def test_a_job_whose_backend_dies_fails_and_gives_its_runtime_back(tmp_path: Path) -> None:
    world, node = _box(tmp_path)
    _, accepted = _submit(world, node)
    world.clock.advance(1.0)
    [process] = [p for p in world.launcher.running if p.name == "sd-server"]
    process.exit(3, "simulated crash")
    done = _poll_until_done(world, node, accepted["id"])
    assert done["status"] == "failed" and done["error"]["code"] == "backend_lost"
    world.clock.advance(1.0)
    assert node.local.jobs_running == 0 and node.state_document()["active_requests"] == []
    response, _ = _submit(world, node)  # the runtime loads again for the next job
    assert response.code == 202


def test_a_drain_waits_for_running_jobs_and_a_stop_ends_the_ones_left(tmp_path: Path) -> None:
    world, node = _box(tmp_path)
    _, first = _submit(world, node)
    world.run(node.drain(JOB_S + 5))
    assert node.local.jobs_running == 0
    response, body = world.call("GET", node, f"/sdcpp/v1/jobs/{first['id']}")
    assert _json(body)["status"] == "completed"

    world2, node2 = _box(tmp_path / "second")
    _, second = _submit(world2, node2)
    world2.clock.advance(1.0)
    world2.run(node2.stop())
    assert node2.jobs.table.jobs[second["id"]].status == "failed"
    assert node2.local.jobs_running == 0


ALICE, BOB, ADMIN = "sk-alice-0123456789", "sk-bob-0123456789", "sk-admin-0123456789"
KEYS = {"inference_keys": [{"name": "alice", "key": ALICE}, {"name": "bob", "key": BOB}],
        "admin_keys": [ADMIN]}


def _bearer(key: str) -> dict[str, Any]:
    return {"headers": {"Authorization": f"Bearer {key}"}}


def _keyed_pair(tmp_path: Path) -> tuple[World, Node, Node]:
    world = World(tmp_path)
    slave = world.node("slave", {"paint": PAINT}, sdcpp=TIMED, auth=KEYS, cluster=slave_cluster())
    master = world.node("master", {}, auth=KEYS, cluster=master_cluster())
    world.start(slave, master)
    return world, master, slave


def test_a_job_belongs_to_the_key_that_submitted_it_on_the_master_and_on_the_node_running_it(
        tmp_path: Path) -> None:
    """Another key's poll or cancel is the 404 of an unknown job (its existence is not revealed),
    through the master and on the slave running the job; the owner and an admin key see it."""
    world, master, slave = _keyed_pair(tmp_path)
    response, body = world.call("POST", master, "/sdcpp/v1/vid_gen", json={"model": "paint-paint", **VIDEO},
                                **_bearer(ALICE))
    assert response.code == 202, body
    job_id = _json(body)["id"]
    unknown = world.call("GET", master, "/sdcpp/v1/jobs/rjob_00112233", **_bearer(BOB))[1]
    for node in (master, slave):
        calls = (("GET", f"/sdcpp/v1/jobs/{job_id}"), ("POST", f"/sdcpp/v1/jobs/{job_id}/cancel"))
        for method, path in calls:
            response, body = world.call(method, node, path, **_bearer(BOB))
            assert response.code == 404, (node.node_id, method, body)
            assert _json(body)["error"]["code"] == "job_not_found"
            assert _json(body)["error"]["message"] == _json(unknown)["error"]["message"].replace(
                "rjob_00112233", job_id)
        for key in (ALICE, ADMIN):
            response, body = world.call("GET", node, f"/sdcpp/v1/jobs/{job_id}", **_bearer(key))
            assert response.code == 200 and _json(body)["id"] == job_id, (node.node_id, body)
    response, body = world.call("POST", master, f"/sdcpp/v1/jobs/{job_id}/cancel", **_bearer(ALICE))
    assert response.code in (200, 409), body  # the owner's cancel reaches the backend


def test_on_a_keyless_node_every_caller_is_the_same_principal(tmp_path: Path) -> None:
    world, node = _box(tmp_path)
    _, accepted = _submit(world, node)
    response, body = world.call("GET", node, f"/sdcpp/v1/jobs/{accepted['id']}",
                                headers={"Authorization": "Bearer anything"})
    assert response.code == 200 and _json(body)["id"] == accepted["id"]
