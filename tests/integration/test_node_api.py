"""A standalone node with real simulator backend processes, over real HTTP on 127.0.0.1."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq
from twisted.internet import reactor, task
from twisted.internet.defer import Deferred, DeferredList

from routerd.sim.wav import make_wav
from routerd.store.store import Store
from tests.integration.nodes import FAST_TEXT, RunningNode, node_config, post, start_node, write_models

MODELS = {
    "alpha": {"model": "../weights/alpha.sim.json", "contextsize": 4096},
    "beta": {"model": "../weights/beta.sim.json", "contextsize": 4096},
    "duo": {"model": "../weights/duo.sim.json", "contextsize": 4096, "parallel": 2},
    "embedder": {"embeddingsmodel": "../weights/embedder.sim.json"},
    "paint": {"sdmodel": "../weights/paint.sim.json"},
    "ears": {"whispermodel": "../weights/ears.sim.json"},
    "fragile": {"model": "../weights/alpha.sim.json", "extra_args": ["--sim-crash-after", "1"]},
    "broken": {"model": "../weights/alpha.sim.json", "extra_args": ["--sim-fail-load"]},
    "ghost": {"model": "../weights/does-not-exist.sim.json"},
}
WEIGHTS = {
    "alpha": FAST_TEXT,
    "beta": {**FAST_TEXT, "load_ms": 60, "gen_tokens_per_s": 100},
    "duo": {**FAST_TEXT, "gen_tokens_per_s": 50},
    "embedder": {**FAST_TEXT, "embedding_dim": 4},
    "paint": {"kind": "image", "load_ms": 30, "ms_per_step_megapixel": 2},
    "ears": {"kind": "stt", "load_ms": 30, "realtime_factor": 0.01},
}


@pytest.fixture
def node_root(tmp_path: Path) -> Path:
    write_models(tmp_path, MODELS, WEIGHTS)
    return tmp_path


@pytest_twisted.async_yield_fixture
async def node(node_root: Path) -> AsyncIterator[RunningNode]:
    running = await start_node(node_config(node_root, {"limits": {"max_body_mb": 1}}))
    yield running
    await running.stop()


def chat(model: str, text: str = "hello there", max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            **extra}


@pytest_twisted.ensureDeferred
async def test_chat_completion_is_answered_by_the_backend_with_the_public_model_id(node: RunningNode) -> None:
    code, payload, response = await post(node.url + "/v1/chat/completions", chat("alpha"))
    assert code == 200, payload
    assert payload["model"] == "alpha"
    assert payload["usage"]["completion_tokens"] == 4
    assert payload["choices"][0]["message"]["content"]
    assert response.headers.getRawHeaders(b"x-routerd-node") == [b"local"]
    assert response.headers.getRawHeaders(b"x-routerd-request-id")


@pytest_twisted.ensureDeferred
async def test_streamed_chat_arrives_in_several_chunks_over_time(node: RunningNode) -> None:
    response = await treq.post(node.url + "/v1/chat/completions",
                               json=chat("alpha", max_tokens=12, stream=True), unbuffered=True)
    assert response.code == 200
    assert response.headers.getRawHeaders(b"content-type")[0].startswith(b"text/event-stream")
    arrivals: list[tuple[float, bytes]] = []
    await treq.collect(response, lambda data: arrivals.append((reactor.seconds(), data)))
    body = b"".join(d for _, d in arrivals)
    frames = [line for line in body.split(b"\n") if line.startswith(b"data: ")]
    assert frames[-1] == b"data: [DONE]"
    for frame in frames[:-1]:
        assert json.loads(frame[6:])["model"] == "alpha"
    assert len(arrivals) >= 3, "the stream must not be buffered whole"
    assert arrivals[-1][0] - arrivals[0][0] > 0.02


@pytest_twisted.ensureDeferred
async def test_completions_and_llama_native_completion(node: RunningNode) -> None:
    code, payload, _ = await post(node.url + "/v1/completions",
                                  {"model": "alpha", "prompt": "one two", "max_tokens": 3})
    assert code == 200 and payload["model"] == "alpha"
    assert payload["choices"][0]["text"]
    code, payload, _ = await post(node.url + "/completion",
                                  {"model": "alpha", "prompt": "one two", "n_predict": 3})
    assert code == 200 and payload["content"]


@pytest_twisted.ensureDeferred
async def test_embeddings_route_to_the_embedding_model(node: RunningNode) -> None:
    code, payload, _ = await post(node.url + "/v1/embeddings", {"model": "embedder", "input": ["a", "b"]})
    assert code == 200, payload
    assert len(payload["data"]) == 2 and len(payload["data"][0]["embedding"]) == 4
    assert payload["model"] == "embedder"


@pytest_twisted.ensureDeferred
async def test_image_generation_by_image_id_on_both_routes(node: RunningNode) -> None:
    code, payload, _ = await post(node.url + "/v1/images/generations",
                                  {"model": "paint-paint", "prompt": "a boat", "size": "64x64"})
    assert code == 200, payload
    assert payload["data"][0]["b64_json"]
    code, payload, _ = await post(node.url + "/sdapi/v1/txt2img",
                                  {"prompt": "a boat", "width": 64, "height": 64, "steps": 2},
                                  params={"model": "paint-paint"})
    assert code == 200, payload
    assert payload["images"]


@pytest_twisted.ensureDeferred
async def test_transcription_goes_to_whisper_and_records_audio_seconds(node: RunningNode) -> None:
    response = await treq.post(node.url + "/v1/audio/transcriptions",
                               data={"model": "ears"}, files={"file": ("a.wav", "audio/wav", make_wav(1.5))})
    payload = json.loads(await response.content())
    assert response.code == 200, payload
    assert isinstance(payload["text"], str) and payload["text"]
    store = node.node.store
    assert store is not None
    samples = await store.request_samples("ears", "stt", 0)
    assert samples and samples[-1].work == pytest.approx((1.5,))


@pytest_twisted.ensureDeferred
async def test_ollama_chat_streams_ndjson_and_generate_answers_whole(node: RunningNode) -> None:
    response = await treq.post(node.url + "/api/chat", json={
        "model": "alpha", "messages": [{"role": "user", "content": "hi"}], "options": {"num_predict": 3}})
    assert response.code == 200
    assert response.headers.getRawHeaders(b"content-type") == [b"application/x-ndjson"]
    lines = [json.loads(x) for x in (await response.content()).splitlines() if x.strip()]
    assert lines[-1]["done"] is True and lines[-1]["eval_count"] == 3
    assert all(line["model"] == "alpha" for line in lines)
    code, payload, _ = await post(node.url + "/api/generate",
                                  {"model": "alpha", "prompt": "hi", "stream": False,
                                   "options": {"num_predict": 2}})
    assert code == 200 and payload["done"] is True and payload["response"]


@pytest_twisted.ensureDeferred
async def test_switching_text_models_measures_and_stores_each_load(node: RunningNode) -> None:
    for model in ("alpha", "beta", "alpha"):
        code, payload, _ = await post(node.url + "/v1/chat/completions", chat(model))
        assert code == 200 and payload["model"] == model
    store = node.node.store
    assert isinstance(store, Store)
    loads = await store.load_samples(0)
    assert [s.model_id for s in loads] == ["alpha", "beta", "alpha"]
    # beta's simulated load takes 60 ms: the measured time covers switch start to readiness.
    assert loads[1].duration_ms >= 60
    samples = await store.request_samples(None, "llm", 0)
    assert len(samples) == 3 and all(s.status == "ok" for s in samples)
    assert samples[0].work == (2.0, 4.0)  # two prompt words, four generated tokens


@pytest_twisted.ensureDeferred
async def test_parallel_requests_share_a_parallel_backend(node: RunningNode) -> None:
    await post(node.url + "/router/v1/load", {"model": "duo"})
    start = reactor.seconds()
    results = await DeferredList([Deferred.fromCoroutine(post(node.url + "/v1/chat/completions",
                                                              chat("duo", max_tokens=10)))
                                  for _ in range(2)])
    elapsed = reactor.seconds() - start
    assert all(ok and r[0] == 200 for ok, r in results)
    # each job takes 10/50 s = 200 ms; two in parallel finish well before 400 ms
    assert elapsed < 0.38


@pytest_twisted.ensureDeferred
async def test_a_crashed_backend_is_reported_and_restarted_by_the_next_request(node: RunningNode) -> None:
    code, _, _ = await post(node.url + "/v1/chat/completions", chat("fragile"))
    assert code == 200
    # the simulator exits after serving one request; the node notices the exit
    for _ in range(50):
        state = node.node.state_document()
        text = [r for r in state["runtimes"] if r["kind"] == "text"][0]
        if text["state"] == "dead":
            break
        await task.deferLater(reactor, 0.02, lambda: None)
    assert text["state"] == "dead"
    code, payload, _ = await post(node.url + "/v1/chat/completions", chat("fragile"))
    assert code == 200, payload


@pytest_twisted.ensureDeferred
async def test_a_failing_load_is_a_502_with_the_reason_and_the_next_request_tries_again(
        node: RunningNode) -> None:
    for _ in range(2):
        code, payload, _ = await post(node.url + "/v1/chat/completions", chat("ghost"))
        assert code == 502
        assert payload["error"]["code"] == "load_failed"
        assert "ghost" in payload["error"]["message"]
    code, payload, _ = await post(node.url + "/v1/chat/completions", chat("alpha"))
    assert code == 200, payload
    store = node.node.store
    assert store is not None
    failed = await store.load_samples(0, status="failed")
    assert [s.model_id for s in failed] == ["ghost", "ghost"]


@pytest_twisted.ensureDeferred
async def test_client_disconnect_mid_stream_releases_the_slot(node: RunningNode) -> None:
    response = await treq.post(node.url + "/v1/chat/completions",
                               json=chat("alpha", max_tokens=400, stream=True), unbuffered=True)
    assert response.code == 200
    got: list[bytes] = []
    collecting = treq.collect(response, got.append)
    collecting.addErrback(lambda _f: None)
    await task.deferLater(reactor, 0.1, lambda: None)
    assert got and node.node.local.active
    # drop the client connection mid-stream (the whole answer would take 2 s)
    response.original._transport._producer.abortConnection()
    for _ in range(25):
        await task.deferLater(reactor, 0.02, lambda: None)
        users = [s.users for s in node.node.runtimes.status()]
        if not node.node.local.active and users == [0, 0, 0]:
            break
    assert node.node.local.active == {}
    assert [s.users for s in node.node.runtimes.status()] == [0, 0, 0]
    store = node.node.store
    assert store is not None
    samples = await store.request_samples("alpha", "llm", 0, status=None)
    assert samples[-1].status == "client_disconnected"
    # the node keeps serving
    code, _, _ = await post(node.url + "/v1/chat/completions", chat("beta"))
    assert code == 200


@pytest_twisted.ensureDeferred
async def test_bad_input_gets_clear_errors_in_the_right_envelope(node: RunningNode) -> None:
    url = node.url
    response = await treq.post(url + "/v1/chat/completions", data=b"{not json",
                               headers={"content-type": "application/json"})
    assert response.code == 400
    assert "invalid JSON" in (await response.json())["error"]["message"]
    code, payload, _ = await post(url + "/v1/chat/completions", {"messages": []})
    assert code == 400 and payload["error"]["message"] == "model is required"
    code, payload, _ = await post(url + "/v1/chat/completions", {"model": 5, "messages": []})
    assert code == 400 and "string" in payload["error"]["message"]
    code, payload, _ = await post(url + "/v1/chat/completions", chat("nope"))
    assert code == 404 and payload["error"]["code"] == "model_not_found"
    code, payload, _ = await post(url + "/api/chat", {"model": "nope", "messages": []})
    assert code == 404 and isinstance(payload["error"], str)
    code, payload, _ = await post(url + "/v1/chat/completions", chat("paint"))
    assert code == 404
    code, payload, _ = await post(url + "/v1/nothing-here", {})
    assert code == 404
    big = {"model": "alpha", "messages": [{"role": "user", "content": "x" * (2 * 1024 * 1024)}]}
    code, payload, _ = await post(url + "/v1/chat/completions", big)
    assert code == 413
    response = await treq.get(url + "/v1/chat/completions")
    assert response.code == 405
    # the node keeps serving
    code, _, _ = await post(url + "/v1/chat/completions", chat("alpha"))
    assert code == 200


@pytest_twisted.ensureDeferred
async def test_listings_come_from_the_catalog(node: RunningNode) -> None:
    models = await (await treq.get(node.url + "/v1/models")).json()
    ids = {m["id"] for m in models["data"]}
    assert {"alpha", "beta", "embedder"} <= ids and "paint" not in ids
    tags = await (await treq.get(node.url + "/api/tags")).json()
    assert "alpha" in {m["name"] for m in tags["models"]}
    sd = await (await treq.get(node.url + "/sdapi/v1/sd-models")).json()
    assert [m["model_name"] for m in sd] == ["paint-paint"]
    show = await treq.post(node.url + "/api/show", json={"model": "alpha"})
    assert show.code == 200
    health = await (await treq.get(node.url + "/health")).json()
    assert health == {"status": "ok", "node_id": "local", "role": "standalone"}
    await post(node.url + "/router/v1/load", {"model": "alpha"})
    ps = await (await treq.get(node.url + "/api/ps")).json()
    assert [m["name"] for m in ps["models"]] == ["alpha"]
    metrics = (await (await treq.get(node.url + "/metrics")).content()).decode()
    assert "routerd_model_loads_total" in metrics


@pytest_twisted.ensureDeferred
async def test_selector_less_embeddings_with_nothing_loaded_pass_through_without_a_model_or_a_load(
    node: RunningNode,
) -> None:
    """Reference §6.7 "Nothing loaded": no backend runs → 503 and nothing is loaded; a chat model
    loaded → the request goes to that running backend as sent (no model, no switch); once the
    embeddings config is loaded, selector-less requests use it."""
    runtimes = node.node.runtimes
    code, payload, _ = await post(node.url + "/v1/embeddings", {"input": "a"})
    assert code == 503 and payload["error"]["code"] == "no_loaded_model", payload
    assert all(s.pid is None for s in runtimes.status())
    chat = {"model": "alpha", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    code, _, _ = await post(node.url + "/v1/chat/completions", chat)
    assert code == 200
    code, payload, response = await post(node.url + "/v1/embeddings", {"input": "a"})
    assert response.headers.getRawHeaders(b"x-routerd-node") == [b"local"]
    assert code != 200 and "embedding" in json.dumps(payload)  # alpha's llama-server has no --embeddings
    assert runtimes.loaded_config("text") == "alpha.kcpps"  # not switched to the embeddings config
    code, payload, _ = await post(node.url + "/v1/embeddings", {"model": "embedder", "input": "a"})
    assert code == 200
    code, payload, _ = await post(node.url + "/v1/embeddings", {"input": ["a", "b"]})
    assert code == 200 and payload["model"] == "embedder" and len(payload["data"]) == 2


@pytest_twisted.ensureDeferred
async def test_kobold_transcribe_under_llama_sdcpp_goes_to_whisper_and_answers_kobold_text(
    node: RunningNode,
) -> None:
    """Split mode serves Kobold's ``/api/extra/transcribe`` (base64 JSON) on whisper-server, the same
    transcript as the OpenAI route for the same audio."""
    import base64

    wav = make_wav(1.5)
    code, payload, _ = await post(node.url + "/api/extra/transcribe",
                                  {"model": "ears", "audio_data": base64.b64encode(wav).decode(),
                                   "langcode": "en"})
    assert code == 200, payload
    response = await treq.post(node.url + "/v1/audio/transcriptions",
                               data={"model": "ears"}, files={"file": ("a.wav", "audio/wav", wav)})
    assert payload == {"text": json.loads(await response.content())["text"]}
    code, payload, _ = await post(node.url + "/api/extra/transcribe", {"model": "ears", "audio_data": "%%"})
    assert code == 400 and "base64" in payload["error"]["message"]
