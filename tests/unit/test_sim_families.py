"""The koboldcpp and vllm simulator families, driven in-process on a task.Clock."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from routerd.sim.harness import SimHarness
from routerd.sim.wav import wav_duration
from routerd.sim.weights import write_weights


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    write_weights(tmp_path / "t1.sim.json", "text", "T1", load_ms=100, context=64)
    write_weights(tmp_path / "t2.sim.json", "text", "T2", load_ms=500)
    write_weights(tmp_path / "img.sim.json", "image", "I1", load_ms=10)
    write_weights(tmp_path / "voice.sim.json", "tts", "V1", load_ms=10, realtime_factor=0.5)
    admin = tmp_path / "admin"
    admin.mkdir()
    (admin / "all.kcpps").write_text(json.dumps({
        "model": str(tmp_path / "t1.sim.json"), "sdmodel": str(tmp_path / "img.sim.json"),
        "ttsmodel": str(tmp_path / "voice.sim.json")}))
    (admin / "other.kcpps").write_text(json.dumps({"model": str(tmp_path / "t2.sim.json")}))
    return tmp_path


def kobold(root: Path, *extra: str) -> SimHarness:
    sim = SimHarness(["koboldcpp", "--config", str(root / "admin" / "all.kcpps"), "--admin",
                      "--adminpassword", "pw", "--admindir", str(root / "admin"), *extra])
    sim.start_loaded()
    return sim


async def get_json(sim: SimHarness, path: str) -> tuple[int, Any]:
    response = await sim.settle(sim.stub.get(sim.url(path)))
    return response.code, json.loads(await sim.settle(response.content()))


async def post(sim: SimHarness, path: str, body: dict[str, Any], **kw: Any) -> tuple[int, bytes]:
    response = await sim.settle(sim.stub.post(sim.url(path), json=body, **kw))
    return response.code, await sim.settle(response.content())


@pytest_twisted.ensureDeferred
async def test_kobold_one_process_serves_text_image_and_speech_and_reports_them(weights: Path) -> None:
    sim = kobold(weights)
    code, version = await get_json(sim, "/api/extra/version")
    assert code == 200 and version["tts"] is True and version["txt2img"] is True
    assert version["embeddings"] is False and version["transcribe"] is False
    code, body = await post(sim, "/api/v1/generate", {"prompt": "hi there", "max_length": 4})
    assert code == 200 and json.loads(body)["results"][0]["completion_tokens"] == 4
    code, body = await post(sim, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                         "max_tokens": 3})
    assert code == 200 and json.loads(body)["usage"]["completion_tokens"] == 3
    code, audio = await post(sim, "/api/extra/tts", {"input": "hello there world"})
    assert code == 200 and audio[:4] == b"RIFF" and wav_duration(audio) == pytest.approx(1.2)
    code, image = await post(sim, "/sdapi/v1/txt2img", {"prompt": "cat", "steps": 2})
    assert code == 200 and json.loads(image)["images"]


@pytest_twisted.ensureDeferred
async def test_kobold_reload_config_swaps_the_weights_and_is_not_live_while_loading(weights: Path) -> None:
    sim = kobold(weights)
    _, before = await post(sim, "/api/v1/generate", {"prompt": "same prompt", "max_length": 4})
    code, body = await post(sim, "/api/admin/reload_config", {"filename": "other.kcpps"},
                            headers={"Authorization": "Bearer pw"})
    assert code == 200 and json.loads(body) == {"success": True}
    code, _ = await get_json(sim, "/api/extra/version")
    assert code == 503  # loading the new config: not live
    sim.advance(0.6)
    code, version = await get_json(sim, "/api/extra/version")
    assert code == 200 and version["tts"] is False and version["config"] == "other"
    _, after = await post(sim, "/api/v1/generate", {"prompt": "same prompt", "max_length": 4})
    assert json.loads(after)["results"][0]["text"] != json.loads(before)["results"][0]["text"]
    code, _ = await post(sim, "/api/extra/tts", {"input": "hello"})
    assert code == 503


@pytest_twisted.ensureDeferred
async def test_kobold_reload_needs_admin_password_and_a_file_in_the_admin_dir(weights: Path) -> None:
    sim = kobold(weights)
    code, _ = await post(sim, "/api/admin/reload_config", {"filename": "other.kcpps"},
                         headers={"Authorization": "Bearer wrong"})
    assert code == 401
    code, _ = await post(sim, "/api/admin/reload_config", {"filename": "../admin/other.kcpps"},
                         headers={"Authorization": "Bearer pw"})
    assert code == 400


@pytest_twisted.ensureDeferred
async def test_kobold_nomodel_lists_inactive(weights: Path) -> None:
    sim = SimHarness(["koboldcpp", "--nomodel", "--admin", "--admindir", str(weights / "admin")])
    sim.start_loaded()
    code, models = await get_json(sim, "/v1/models")
    assert code == 200 and models["data"][0]["id"] == "inactive"
    code, _ = await post(sim, "/api/v1/generate", {"prompt": "x"})
    assert code == 503


def vllm(root: Path, *extra: str) -> SimHarness:
    return SimHarness.loaded(["vllm", "serve", str(root / "t1.sim.json"), "--served-model-name", "chat",
                              *extra])


@pytest_twisted.ensureDeferred
async def test_vllm_health_is_empty_200_and_the_served_name_is_checked(weights: Path) -> None:
    sim = vllm(weights)
    response = await sim.settle(sim.stub.get(sim.url("/health")))
    assert response.code == 200 and await sim.settle(response.content()) == b""
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    code, body = await post(sim, "/v1/chat/completions", {"model": "chat", **chat})
    assert code == 200 and json.loads(body)["model"] == "chat"
    code, body = await post(sim, "/v1/chat/completions", {"model": "other", **chat})
    assert code == 404 and json.loads(body)["type"] == "NotFoundError"


@pytest_twisted.ensureDeferred
async def test_vllm_refuses_a_request_longer_than_max_model_len(weights: Path) -> None:
    sim = vllm(weights, "--max-model-len", "20")
    code, body = await post(sim, "/v1/completions", {"model": "chat", "prompt": "a b c", "max_tokens": 30})
    assert code == 400
    assert "maximum context length is 20 tokens" in json.loads(body)["message"]


@pytest_twisted.ensureDeferred
async def test_vllm_max_num_seqs_bounds_concurrency(weights: Path) -> None:
    """Three 160 ms jobs with --max-num-seqs 2: two finish together, the third one job later."""
    sim = vllm(weights, "--max-num-seqs", "2")
    body = {"model": "chat", "prompt": "x", "max_tokens": 16}
    started = sim.clock.seconds()
    pending = [sim.stub.post(sim.url("/v1/completions"), json=body) for _ in range(3)]
    done: list[float] = []
    for d in pending:
        d.addCallback(lambda r: done.append(sim.clock.seconds()) or r)
    for d in pending:
        await sim.settle(d)
    assert sorted(round(t - started, 3) for t in done) == [0.161, 0.161, 0.322]


def music_sim(root: Path, config: dict[str, Any], name: str = "song") -> SimHarness:
    (root / "admin" / f"{name}.kcpps").write_text(json.dumps(config))
    sim = SimHarness(["koboldcpp", "--config", str(root / "admin" / f"{name}.kcpps"), "--admin",
                      "--adminpassword", "pw", "--admindir", str(root / "admin")])
    sim.start_loaded()
    return sim


@pytest.fixture
def music_weights(weights: Path) -> Path:
    write_weights(weights / "plan.sim.json", "music", "PLAN", load_ms=10)
    write_weights(weights / "dit.sim.json", "music", "DIT", load_ms=10, realtime_factor=0.5)
    write_weights(weights / "dit2.sim.json", "music", "DIT2", load_ms=10, realtime_factor=0.5)
    (weights / "vae.gguf").write_bytes(b"vae")
    return weights


@pytest_twisted.ensureDeferred
async def test_kobold_reports_music_and_prepare_plans_the_caption_deterministically(
    music_weights: Path,
) -> None:
    sim = music_sim(music_weights, {"musicllm": str(music_weights / "plan.sim.json"),
                                    "musicdiffusion": str(music_weights / "dit.sim.json"),
                                    "musicvae": str(music_weights / "vae.gguf")})
    code, version = await get_json(sim, "/api/extra/version")
    assert code == 200 and version["music"] is True and version["tts"] is False
    code, body = await post(sim, "/api/extra/music/prepare", {"caption": "calm piano", "lyrics": ""})
    assert code == 200
    planned = json.loads(body)
    assert planned["caption"] == "calm piano"  # the request comes back with the plan filled in
    assert isinstance(planned["bpm"], int) and planned["keyscale"] and planned["audio_codes"]
    _, again = await post(sim, "/api/extra/music/prepare", {"caption": "calm piano", "lyrics": ""})
    assert json.loads(again) == planned
    _, other = await post(sim, "/api/extra/music/prepare", {"caption": "loud drums", "lyrics": ""})
    assert json.loads(other)["audio_codes"] != planned["audio_codes"]
    code, body = await post(sim, "/api/extra/music/prepare", {"caption": 3})
    assert code == 400 and b"caption" in body


@pytest_twisted.ensureDeferred
async def test_kobold_music_generate_is_a_wav_per_weights_and_input_timed_by_the_realtime_factor(
    music_weights: Path,
) -> None:
    sim = music_sim(music_weights, {"musicdiffusion": str(music_weights / "dit.sim.json")})
    started = sim.clock.seconds()
    code, audio = await post(sim, "/api/extra/music/generate", {"caption": "calm piano", "duration": 4})
    assert sim.clock.seconds() - started == pytest.approx(2.0)  # 4 s of music at realtime factor 0.5
    assert code == 200 and audio[:4] == b"RIFF" and 0 < wav_duration(audio) <= 2.0
    _, same = await post(sim, "/api/extra/music/generate", {"caption": "calm piano", "duration": 4})
    assert same == audio
    _, other = await post(sim, "/api/extra/music/generate", {"caption": "loud drums", "duration": 4})
    assert other != audio
    await sim.settle(sim.stub.post(sim.url("/sim/control"), json={"slowdown": 3}))
    started = sim.clock.seconds()
    code, _ = await post(sim, "/api/extra/music/generate", {"caption": "calm piano", "duration": 4})
    assert code == 200 and sim.clock.seconds() - started == pytest.approx(6.0)  # the fault knob applies
    code, body = await post(sim, "/api/extra/music/generate", {"caption": "x", "duration": "long"})
    assert code == 400 and b"duration" in body
    sim2 = music_sim(music_weights, {"musicdiffusion": str(music_weights / "dit2.sim.json")}, "two")
    _, theirs = await post(sim2, "/api/extra/music/generate", {"caption": "calm piano", "duration": 4})
    assert theirs[:4] == b"RIFF" and theirs != audio


@pytest_twisted.ensureDeferred
async def test_kobold_without_music_weights_reports_no_music_and_refuses_music_routes(weights: Path) -> None:
    sim = kobold(weights)
    code, version = await get_json(sim, "/api/extra/version")
    assert code == 200 and version["music"] is False
    for path in ("/api/extra/music/prepare", "/api/extra/music/generate"):
        code, body = await post(sim, path, {"caption": "calm piano"})
        assert code == 503 and b"no music model" in body


def test_kobold_music_config_naming_a_missing_vae_does_not_load(music_weights: Path) -> None:
    from routerd.sim.kobold import model_set_from_config
    from routerd.sim.weights import WeightsError

    path = music_weights / "admin" / "bad.kcpps"
    path.write_text(json.dumps({"musicdiffusion": str(music_weights / "dit.sim.json"),
                                "musicvae": str(music_weights / "missing.gguf")}))
    with pytest.raises(WeightsError, match="musicvae"):
        model_set_from_config(str(path))
