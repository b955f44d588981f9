"""The simulated sd-server, driven in-process: A1111 and OpenAI image routes and their timing."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from routerd.sim.harness import SimHarness
from routerd.sim.weights import write_weights


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    return write_weights(tmp_path / "sdxl-a.sim.json", "image", "sdxl-a", load_ms=200,
                         ms_per_step_megapixel=40)


def make(weights: Path, *flags: str) -> SimHarness:
    return SimHarness.loaded(["sd-server", "-m", str(weights), *flags])


async def call(sim: SimHarness, method: str, path: str, body: object = None) -> tuple[int, Any]:
    d = sim.stub.request(method, sim.url(path), json=body) if body is not None else sim.stub.request(
        method, sim.url(path))
    response = await sim.settle(d)
    return response.code, json.loads(await sim.stub.content(response))


def is_png(b64: str) -> bool:
    return base64.b64decode(b64).startswith(b"\x89PNG\r\n\x1a\n")


@pytest_twisted.ensureDeferred
async def test_loading_then_health_and_model_list(weights: Path) -> None:
    sim = SimHarness(["sd-server", "-m", str(weights)])
    sim.start()
    assert (await call(sim, "GET", "/sdapi/v1/sd-models"))[0] == 503
    assert (await call(sim, "GET", "/health"))[0] == 503
    sim.advance(0.2)
    assert await call(sim, "GET", "/health") == (200, {"status": "ok"})
    code, models = await call(sim, "GET", "/sdapi/v1/sd-models")
    assert code == 200
    assert [(m["title"], m["model_name"], m["filename"]) for m in models] == [
        ("sdxl-a", "sdxl-a", str(weights))]


@pytest_twisted.ensureDeferred
async def test_txt2img_takes_steps_times_megapixels_times_batch_and_returns_pngs(weights: Path) -> None:
    sim = make(weights)
    start = sim.clock.seconds()
    body = {"prompt": "a red fox", "steps": 10, "width": 1000, "height": 500, "batch_size": 2, "seed": 7}
    code, answer = await call(sim, "POST", "/sdapi/v1/txt2img", body)
    assert sim.clock.seconds() - start == pytest.approx(10 * 0.5 * 2 * 0.040)
    assert code == 200
    assert len(answer["images"]) == 2 and all(is_png(i) for i in answer["images"])
    assert answer["images"][0] != answer["images"][1]
    assert answer["parameters"]["steps"] == 10 and answer["parameters"]["batch_size"] == 2
    info = json.loads(answer["info"])
    assert (info["seed"], info["width"], info["height"]) == (7, 1000, 500)
    again = (await call(sim, "POST", "/sdapi/v1/txt2img", body))[1]
    assert again["images"] == answer["images"]


@pytest_twisted.ensureDeferred
async def test_txt2img_defaults_are_20_steps_at_512x512(weights: Path) -> None:
    sim = make(weights)
    start = sim.clock.seconds()
    code, answer = await call(sim, "POST", "/sdapi/v1/txt2img", {"prompt": "x"})
    assert code == 200 and len(answer["images"]) == 1
    assert sim.clock.seconds() - start == pytest.approx(20 * 0.262144 * 0.040)


@pytest_twisted.ensureDeferred
async def test_openai_generations_parse_size_and_n(weights: Path, tmp_path: Path) -> None:
    sim = make(weights)
    start = sim.clock.seconds()
    code, answer = await call(sim, "POST", "/v1/images/generations",
                              {"prompt": "a fox", "n": 3, "size": "256x256", "response_format": "b64_json"})
    assert sim.clock.seconds() - start == pytest.approx(20 * 0.065536 * 3 * 0.040)
    assert code == 200 and isinstance(answer["created"], int)
    assert len(answer["data"]) == 3 and all(is_png(d["b64_json"]) for d in answer["data"])
    other = make(write_weights(tmp_path / "b.sim.json", "image", "sdxl-b"))
    changed = (await call(other, "POST", "/v1/images/generations",
                          {"prompt": "a fox", "n": 3, "size": "256x256"}))[1]
    assert changed["data"][0]["b64_json"] != answer["data"][0]["b64_json"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/images/generations", {"n": 1}),
        ("/v1/images/generations", {"prompt": "x", "size": "big"}),
        ("/v1/images/generations", {"prompt": "x", "n": 0}),
        ("/v1/images/generations", {"prompt": "x", "response_format": "url"}),
        ("/sdapi/v1/txt2img", {"prompt": "x", "steps": "many"}),
        ("/sdapi/v1/txt2img", {"prompt": 5}),
    ],
)
@pytest_twisted.ensureDeferred
async def test_invalid_image_requests_get_400(weights: Path, path: str, body: object) -> None:
    code, answer = await call(make(weights), "POST", path, body)
    assert code == 400 and answer["error"]["code"] == 400


@pytest_twisted.ensureDeferred
async def test_one_image_at_a_time(weights: Path) -> None:
    sim = make(weights)
    start = sim.clock.seconds()
    first = sim.stub.post(sim.url("/sdapi/v1/txt2img"), json={"prompt": "a"})
    second = sim.stub.post(sim.url("/sdapi/v1/txt2img"), json={"prompt": "b"})
    await sim.settle(first)
    await sim.settle(second)
    assert sim.clock.seconds() - start == pytest.approx(2 * 20 * 0.262144 * 0.040)


@pytest_twisted.ensureDeferred
async def test_vid_gen_is_a_job_that_takes_steps_times_megapixels_times_frames(weights: Path) -> None:
    """sd-server's native video job: 202 with an ID and poll_url at once, queued then generating,
    completed after steps × megapixels × frames × ms_per_step_megapixel (33 frames for 34 asked)."""
    sim = make(weights)
    start = sim.clock.seconds()
    body = {"prompt": "waves", "width": 1000, "height": 500, "video_frames": 34, "fps": 8,
            "sample_params": {"sample_steps": 10}}
    code, accepted = await call(sim, "POST", "/sdcpp/v1/vid_gen", body)
    assert code == 202
    assert (accepted["kind"], accepted["status"]) == ("vid_gen", "queued")
    assert accepted["poll_url"] == f"/sdcpp/v1/jobs/{accepted['id']}"
    assert sim.clock.seconds() == start
    sim.advance(0.01)
    code, running = await call(sim, "GET", accepted["poll_url"])
    assert (code, running["status"], running["result"]) == (200, "generating", None)
    sim.advance(10 * 0.5 * 33 * 0.040)
    code, done = await call(sim, "GET", accepted["poll_url"])
    assert done["status"] == "completed"
    assert done["result"]["frame_count"] == 33 and done["result"]["fps"] == 8
    assert done["result"]["mime_type"] == "video/webm"
    assert base64.b64decode(done["result"]["b64_json"]).startswith(b"SIMVIDEO")


@pytest_twisted.ensureDeferred
async def test_a_queued_job_cancels_a_generating_one_refuses_and_unknown_ids_are_404(weights: Path) -> None:
    sim = make(weights)
    _, first = await call(sim, "POST", "/sdcpp/v1/vid_gen", {"prompt": "a"})
    _, second = await call(sim, "POST", "/sdcpp/v1/vid_gen", {"prompt": "b"})
    sim.advance(0.001)
    code, body = await call(sim, "GET", second["poll_url"])
    assert (body["status"], body["queue_position"]) == ("queued", 1)
    assert (await call(sim, "POST", first["poll_url"] + "/cancel"))[0] == 409
    code, body = await call(sim, "POST", second["poll_url"] + "/cancel")
    assert (code, body["status"], body["error"]["code"]) == (200, "cancelled", "cancelled")
    assert (await call(sim, "GET", "/sdcpp/v1/jobs/job_nope")) == (404, {"error": "job not found"})
    assert (await call(sim, "POST", "/sdcpp/v1/vid_gen", {"output_format": "mp4"}))[0] == 400
