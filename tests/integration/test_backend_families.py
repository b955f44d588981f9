"""Real nodes running the kobold and vllm families on simulator processes."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import pytest_twisted
import treq

from routerd.sim.wav import make_wav, wav_duration
from tests.integration.nodes import (
    FAST_TEXT,
    SIM,
    TOKEN,
    RunningNode,
    node_config,
    plan_cluster,
    start_node,
    wait_until,
    write_models,
)

FAMILY_BINARIES = {"kobold": {"binary_path": [*SIM, "koboldcpp"]}, "vllm": {"binary_path": [*SIM, "vllm"]}}
VOICE = {"kind": "tts", "load_ms": 10, "realtime_factor": 0.01}
IMAGE = {"kind": "image", "load_ms": 10, "ms_per_step_megapixel": 5}
CHAT = {"messages": [{"role": "user", "content": "tell me"}], "max_tokens": 4}


def family_extra(mode: str, **sections: Any) -> dict[str, Any]:
    return {"backend": {"mode": mode}, **FAMILY_BINARIES, **sections}


async def post(node: RunningNode | str, path: str, body: dict[str, Any]) -> tuple[int, Any, bytes]:
    url = node if isinstance(node, str) else node.url
    response = await treq.post(url + path, json=body)
    return response.code, response.headers, await response.content()


def kobold_models(root: Path) -> None:
    write_models(root, {
        "combo": {"model": "../weights/t1.sim.json", "sdmodel": "../weights/pix.sim.json",
                  "ttsmodel": "../weights/voice.sim.json", "contextsize": 4096},
        "other": {"model": "../weights/t2.sim.json", "contextsize": 4096},
    }, {"t1": FAST_TEXT, "t2": FAST_TEXT, "pix": IMAGE, "voice": VOICE})


@pytest_twisted.ensureDeferred
async def test_kobold_node_serves_chat_image_generate_and_speech_from_one_process_and_switches_by_reload(
    tmp_path: Path,
) -> None:
    kobold_models(tmp_path)
    node = await start_node(node_config(tmp_path, family_extra("kobold")))
    try:
        code, _, body = await post(node, "/v1/chat/completions", {"model": "combo", **CHAT})
        assert code == 200, body
        first = json.loads(body)
        assert first["model"] == "combo"
        pid = node.node.runtimes.status()[0].pid
        assert pid is not None
        code, _, body = await post(node, "/sdapi/v1/txt2img", {"model": "combo-pix", "prompt": "a cat",
                                                               "steps": 2})
        assert code == 200 and json.loads(body)["images"], body
        code, _, body = await post(node, "/api/v1/generate", {"model": "combo", "prompt": "hello there",
                                                              "max_length": 3})
        assert code == 200 and len(json.loads(body)["results"][0]["text"].split()) == 3, body
        code, headers, audio = await post(node, "/v1/audio/speech", {"model": "combo", "input": "hi you"})
        assert code == 200 and headers.getRawHeaders(b"content-type") == [b"audio/wav"]
        assert wav_duration(audio) > 0
        code, _, audio = await post(node, "/api/extra/tts", {"model": "combo", "input": "hi you"})
        assert code == 200 and audio[:4] == b"RIFF"
        assert node.node.runtimes.status()[0].pid == pid  # one process served every lane
        # Another config: an in-process reload, the same process answering with other weights.
        code, _, body = await post(node, "/v1/chat/completions", {"model": "other", **CHAT})
        assert code == 200, body
        second = json.loads(body)
        assert second["model"] == "other"
        assert second["choices"][0]["message"]["content"] != first["choices"][0]["message"]["content"]
        status = node.node.runtimes.status()[0]
        assert status.pid == pid and status.config_filename == "other.kcpps"
        code, _, body = await post(node, "/v1/audio/speech", {"model": "other", "input": "hi"})
        assert code == 404  # the loaded config has no voice: not a speech model
    finally:
        await node.stop()


@pytest_twisted.ensureDeferred
async def test_kobold_unload_restarts_without_a_model_and_no_model_boot(tmp_path: Path) -> None:
    kobold_models(tmp_path)
    node = await start_node(node_config(tmp_path, family_extra("kobold", kobold={
        **FAMILY_BINARIES["kobold"], "no_model": True})))
    try:
        runtimes = node.node.runtimes
        await wait_until(lambda: runtimes.status()[0].pid is not None)
        booted = runtimes.status()[0]
        assert booted.state == "empty" and booted.config_filename is None
        code, _, body = await post(node, "/v1/chat/completions", {"model": "combo", **CHAT})
        assert code == 200, body
        assert runtimes.status()[0].pid == booted.pid  # loaded by reload into the no-model process
        await runtimes.unload("all")
        after = runtimes.status()[0]
        assert after.state == "empty" and after.pid is not None and after.pid != booted.pid
    finally:
        await node.stop()


@pytest_twisted.ensureDeferred
async def test_vllm_node_serves_chat_and_streaming_under_the_public_id(tmp_path: Path) -> None:
    write_models(tmp_path, {"chat": {"model": "../weights/v.sim.json",
                                     "vllm": {"settings": {"max_model_length": 64,
                                                           "max_number_sequences": 2}}}},
                 {"v": FAST_TEXT})
    node = await start_node(node_config(tmp_path, family_extra("vllm")))
    try:
        code, _, body = await post(node, "/v1/chat/completions", {"model": "chat", **CHAT})
        assert code == 200, body
        assert json.loads(body)["model"] == "chat"
        code, headers, body = await post(node, "/v1/chat/completions", {"model": "chat", "stream": True,
                                                                        **CHAT})
        assert code == 200 and headers.getRawHeaders(b"content-type")[0].startswith(b"text/event-stream")
        events = [json.loads(line[6:]) for line in body.decode().splitlines()
                  if line.startswith("data: {")]
        assert events and all(e["model"] == "chat" for e in events)
        assert body.rstrip().endswith(b"data: [DONE]")
        code, _, body = await post(node, "/v1/chat/completions", {"model": "chat", **CHAT, "max_tokens": 100})
        assert code == 400 and b"maximum context length is 64" in body
        argv_seen = node.node.runtimes.status()
        assert any(s.state == "ready" for s in argv_seen)
    finally:
        await node.stop()


@pytest_twisted.ensureDeferred
async def test_llama_sdcpp_keeps_speech_unsupported(tmp_path: Path) -> None:
    write_models(tmp_path, {"voice": {"ttsmodel": "../weights/voice.sim.json"}}, {"voice": VOICE})
    node = await start_node(node_config(tmp_path))
    try:
        code, _, body = await post(node, "/v1/audio/speech", {"model": "voice", "input": "hi"})
        assert code == 501
        error = json.loads(body)["error"]
        assert error["type"] == "unsupported_backend"
        assert error["message"] == "audio route is not supported by the selected split backend config"
    finally:
        await node.stop()


@pytest_twisted.ensureDeferred
async def test_a_local_replica_whose_lane_is_not_ready_is_skipped(tmp_path: Path) -> None:
    """The master's own chat backend hangs (alive, never answering): its lane probe fails and
    routing sends the requests to the slave's replica instead of queueing behind the hang."""
    plan = plan_cluster(tmp_path, ["slave-a"])
    for name in ("master", "slave-a"):
        write_models(plan.root / name, {"chat": {"model": "../weights/chat.sim.json", "contextsize": 4096}},
                     {"chat": FAST_TEXT})
    master = await start_node(plan.master_config())
    slave = await start_node(plan.slave_config("slave-a"))
    try:
        runtimes = master.node.runtimes
        runtimes.lane_probe_timeout_s = 0.3
        registry = master.node.master.registry  # type: ignore[union-attr]
        await wait_until(lambda: registry.find("slave-a", local_id="chat") is not None
                         and all(n.healthy for n in registry.nodes()))
        code, headers, _ = await post(master, "/v1/chat/completions", {"model": "chat", **CHAT})
        assert code == 200 and headers.getRawHeaders(b"x-routerd-node") == [b"master"]
        chat = master.node.catalog.get("chat")
        assert chat is not None and runtimes.ready("text", chat)
        port = runtimes.status()[0].port
        await treq.post(f"http://127.0.0.1:{port}/sim/control", json={"hang": True})
        await wait_until(lambda: not runtimes.ready("text", chat), timeout=5)
        for _ in range(3):
            code, headers, _ = await post(master, "/v1/chat/completions", {"model": "chat", **CHAT})
            assert code == 200 and headers.getRawHeaders(b"x-routerd-node") == [b"slave-a"]
        await treq.post(f"http://127.0.0.1:{port}/sim/control", json={"hang": False})
        await wait_until(lambda: runtimes.ready("text", chat), timeout=5)
    finally:
        await slave.stop()
        await master.stop()


@pytest_twisted.ensureDeferred
async def test_mixed_family_cluster_merges_records_and_forwards(tmp_path: Path) -> None:
    """A llama_sdcpp master, a kobold slave and a vllm slave: one listing, each model served by
    its own node's family."""
    plan = plan_cluster(tmp_path, ["kob", "vll"])
    write_models(plan.root / "master", {"plain": {"model": "../weights/plain.sim.json"}},
                 {"plain": FAST_TEXT})
    kobold_models(plan.root / "kob")
    write_models(plan.root / "vll", {"served": {"model": "../weights/s.sim.json",
                                                "vllm": {"settings": {"max_model_length": 512}}}},
                 {"s": FAST_TEXT})
    master = await start_node(plan.master_config())
    slaves = {}
    for name, mode in (("kob", "kobold"), ("vll", "vllm")):
        config = node_config(plan.root / name, {
            **family_extra(mode),
            "server": {"bind": f"127.0.0.1:{plan.slave_ports[name]}"},
            "cluster": {"role": "slave", "node_id": name, "token": TOKEN, "master_url": plan.master_url,
                        "public_url": plan.slave_url(name), "sync_interval": "200ms"}})
        slaves[name] = await start_node(config)
    try:
        registry = master.node.master.registry  # type: ignore[union-attr]
        await wait_until(lambda: {r.local_id for r in registry.records()} >= {"plain", "combo", "other",
                                                                               "served"})
        listed = json.loads(await (await treq.get(master.url + "/v1/models")).content())
        ids = {m["id"] for m in listed["data"]}
        assert {"plain", "combo", "served"} <= ids
        modes = {r.local_id: r.backend_mode for r in registry.records()}
        assert modes["combo"] == "kobold" and modes["served"] == "vllm" and modes["plain"] == "llama_sdcpp"
        for model, node in (("plain", b"master"), ("combo", b"kob"), ("served", b"vll")):
            code, headers, body = await post(master, "/v1/chat/completions", {"model": model, **CHAT})
            assert code == 200, body
            assert headers.getRawHeaders(b"x-routerd-node") == [node]
            assert json.loads(body)["model"] == model
        code, _, audio = await post(master, "/v1/audio/speech", {"model": "combo", "input": "from afar"})
        assert code == 200 and audio[:4] == b"RIFF"
    finally:
        for node in slaves.values():
            await node.stop()
        await master.stop()



@pytest_twisted.ensureDeferred
async def test_kobold_node_transcribes_on_both_routes_from_the_same_process(tmp_path: Path) -> None:
    """Kobold transcription passes through to KoboldCpp: its own ``/api/extra/transcribe`` (JSON,
    base64 WAV) and the OpenAI multipart route, both answering ``{"text"}`` from one process."""
    write_models(tmp_path, {"ears": {"model": "../weights/t1.sim.json",
                                     "whispermodel": "../weights/w.sim.json"}},
                 {"t1": FAST_TEXT, "w": {"kind": "stt", "load_ms": 10, "realtime_factor": 0.01}})
    node = await start_node(node_config(tmp_path, family_extra("kobold")))
    try:
        wav = make_wav(1.0)
        code, _, body = await post(node, "/api/extra/transcribe", {
            "model": "ears", "audio_data": base64.b64encode(wav).decode(), "langcode": "en"})
        assert code == 200, body
        kobold_text = json.loads(body)["text"]
        assert kobold_text
        response = await treq.post(node.url + "/v1/audio/transcriptions", data={"model": "ears"},
                                   files={"file": ("a.wav", "audio/wav", io.BytesIO(wav))})
        body = await response.content()
        assert response.code == 200, body
        assert json.loads(body)["text"] == kobold_text  # the same weights heard the same audio
        statuses = [s for s in node.node.runtimes.status() if s.pid is not None]
        assert [(s.state, s.config_filename) for s in statuses] == [("ready", "ears.kcpps")]
        code, _, body = await post(node, "/api/extra/transcribe", {"model": "ears", "audio_data": "%%"})
        assert code == 400 and b"base64" in body  # KoboldCpp's own answer, passed through
    finally:
        await node.stop()


MUSIC = {"kind": "music", "load_ms": 10, "realtime_factor": 0.01}


def music_models(root: Path) -> None:
    write_models(root, {
        "chat": {"model": "../weights/t1.sim.json", "contextsize": 4096},
        "band": {"model": "../weights/t2.sim.json", "musicllm": "../weights/lm.sim.json",
                 "musicdiffusion": "../weights/dit.sim.json", "contextsize": 4096},
    }, {"t1": FAST_TEXT, "t2": FAST_TEXT, "lm": MUSIC, "dit": MUSIC})


async def music_round(node: RunningNode | str) -> tuple[dict[str, Any], bytes]:
    code, _, body = await post(node, "/api/extra/music/prepare", {"caption": "calm piano"})
    assert code == 200, body
    planned = json.loads(body)
    assert planned["caption"] == "calm piano" and planned["audio_codes"]
    code, headers, audio = await post(node, "/api/extra/music/generate", {**planned, "duration": 2})
    assert code == 200, audio
    assert headers.getRawHeaders(b"content-type") == [b"audio/wav"] and wav_duration(audio) > 0
    return planned, audio


@pytest_twisted.ensureDeferred
async def test_kobold_music_routes_pass_through_to_the_music_model_on_a_node_and_via_a_master(
    tmp_path: Path,
) -> None:
    """Selector-less Kobold music requests go to the config with music weights (not the text-only
    one) on KoboldCpp's one process, unchanged; a llama_sdcpp master forwards them to its kobold
    slave and the same weights give the same answer."""
    plan = plan_cluster(tmp_path, ["kob"])
    write_models(plan.root / "master", {"plain": {"model": "../weights/plain.sim.json"}},
                 {"plain": FAST_TEXT})
    music_models(plan.root / "kob")
    master = await start_node(plan.master_config())
    slave = await start_node(node_config(plan.root / "kob", {
        **family_extra("kobold"),
        "server": {"bind": f"127.0.0.1:{plan.slave_ports['kob']}"},
        "cluster": {"role": "slave", "node_id": "kob", "token": TOKEN, "master_url": plan.master_url,
                    "public_url": plan.slave_url("kob"), "sync_interval": "200ms"}}))
    try:
        planned, audio = await music_round(slave)
        statuses = [s for s in slave.node.runtimes.status() if s.pid is not None]
        assert [(s.state, s.config_filename) for s in statuses] == [("ready", "band.kcpps")]
        band = slave.node.catalog.get("band")
        assert band is not None and band.capabilities.music
        assert slave.node.runtimes.ready("text", band)
        registry = master.node.master.registry  # type: ignore[union-attr]
        await wait_until(lambda: any(r.local_id == "band" and r.capabilities.music
                                     for r in registry.records()))
        code, headers, body = await post(master, "/api/extra/music/generate",
                                         {**planned, "duration": 2, "model": "band"})
        assert code == 200 and headers.getRawHeaders(b"x-routerd-node") == [b"kob"], body
        assert body == audio  # the slave's KoboldCpp answered, unchanged
        forwarded, _ = await music_round(master)  # selector-less: the master finds the music model
        assert forwarded == planned
        code, _, body = await post(master, "/api/extra/music/generate", {"caption": "x", "model": "plain"})
        assert code == 404, body  # a text-only model does not serve music
    finally:
        await slave.stop()
        await master.stop()


@pytest_twisted.ensureDeferred
async def test_llama_sdcpp_answers_music_with_unsupported_backend(tmp_path: Path) -> None:
    write_models(tmp_path, {"band": {"model": "../weights/t.sim.json",
                                     "musicdiffusion": "../weights/d.sim.json"}},
                 {"t": FAST_TEXT, "d": MUSIC})
    node = await start_node(node_config(tmp_path))
    try:
        code, _, body = await post(node, "/api/extra/music/generate", {"caption": "x"})
        assert code == 501
        error = json.loads(body)["error"]
        assert error["type"] == "unsupported_backend"
        assert error["message"] == "music route is not supported by the selected split backend config"
        assert all(s.pid is None for s in node.node.runtimes.status())  # nothing was loaded for it
    finally:
        await node.stop()
