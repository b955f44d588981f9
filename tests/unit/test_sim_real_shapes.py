"""The simulator's llama-server and whisper-server follow what the real ones (llama.cpp b11434, whisper.cpp
1.8.5) were seen to do: the per-slot context, ``/slots``, the tokenizer routes, ``/metrics``, whisper-server's
text errors and its requests waiting out a ``/load``.  In-process (StubTreq + task.Clock); the live comparison
is ``tests/integration/test_real_conformance.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from routerd.sim.harness import SimHarness
from routerd.sim.llama_info import slot_context
from routerd.sim.multipart import encode_multipart
from routerd.sim.wav import make_wav
from routerd.sim.weights import write_weights


@pytest.mark.parametrize(("ctx", "parallel", "unified", "slot"), [
    (512, 2, False, 256), (300, 2, False, 256), (100, 1, False, 256), (257, 1, False, 512),
    (600, 1, False, 768),
    (1000, 3, False, 512), (8192, 1, False, 2048), (4096, 2, False, 2048), (0, 2, False, 2048),
    (512, 4, True, 512), (512, 2, True, 512),
])
def test_each_slot_gets_the_context_the_real_llama_server_gave_it(ctx: int, parallel: int, unified: bool,
                                                                   slot: int) -> None:
    """Each row is what llama-server b11434 reported in ``/slots`` for ``-c ctx -np parallel`` (unified: no
    ``-np`` or ``--kv-unified``) on a model trained on 2,048 tokens."""
    assert slot_context(ctx, parallel, unified, 2048) == slot


@pytest.fixture
def text_weights(tmp_path: Path) -> Path:
    return write_weights(tmp_path / "t.sim.json", "text", "t", context=2048, prompt_tokens_per_s=100,
                         gen_tokens_per_s=10)


async def call(sim: SimHarness, method: str, path: str, body: object = None) -> tuple[int, Any, str]:
    request = sim.stub.get(sim.url(path)) if method == "GET" else sim.stub.post(sim.url(path), json=body)
    response = await sim.settle(request)
    text = await sim.stub.text_content(response)
    return response.code, json.loads(text) if text[:1] in "{[" else text, response.headers.getRawHeaders(
        "content-type")[0]


@pytest_twisted.ensureDeferred
async def test_slots_show_which_slot_serves_and_what_it_served(text_weights: Path) -> None:
    sim = SimHarness.loaded(["llama-server", "-m", str(text_weights), "-c", "1024", "-np", "2"])
    _, fresh, _ = await call(sim, "GET", "/slots")
    assert fresh == [{"id": i, "n_ctx": 512, "speculative": False, "is_processing": False} for i in (0, 1)]
    running = sim.stub.post(sim.url("/completion"), json={"prompt": "a b c", "n_predict": 4})
    sim.advance(0.1)  # the prompt (0.03 s) is in, generating
    _, busy, _ = await call(sim, "GET", "/slots")
    assert [slot["is_processing"] for slot in busy] == [True, False]
    assert (busy[0]["n_prompt_tokens"], busy[0]["next_token"][0]["n_remain"]) == (3, 4)
    await sim.settle(running)
    _, after, _ = await call(sim, "GET", "/slots")
    assert not after[0]["is_processing"] and after[0]["id_task"] == 0 and "id_task" not in after[1]


@pytest_twisted.ensureDeferred
async def test_without_parallel_four_slots_share_the_whole_context(text_weights: Path) -> None:
    sim = SimHarness.loaded(["llama-server", "-m", str(text_weights), "-c", "1024"])
    _, props, _ = await call(sim, "GET", "/props")
    assert (props["total_slots"], props["default_generation_settings"]["n_ctx"]) == (4, 1024)


@pytest_twisted.ensureDeferred
async def test_tokenize_and_detokenize_round_trip_a_word_per_token(text_weights: Path) -> None:
    sim = SimHarness.loaded(["llama-server", "-m", str(text_weights)])
    _, ids, _ = await call(sim, "POST", "/tokenize", {"content": "Hello, I am here"})
    assert len(ids["tokens"]) == 4 and all(isinstance(i, int) for i in ids["tokens"])
    _, pieces, _ = await call(sim, "POST", "/tokenize", {"content": "Hello, I am here", "with_pieces": True})
    assert [p["piece"] for p in pieces["tokens"]] == ["Hello,", " I", " am", " here"]
    assert [p["id"] for p in pieces["tokens"]] == ids["tokens"]
    detokenized = await call(sim, "POST", "/detokenize", {"tokens": ids["tokens"][1:]})
    assert detokenized[1] == {"content": " I am here"}
    chat = {"messages": [{"role": "user", "content": "Hi"}]}
    _, template, _ = await call(sim, "POST", "/apply-template", chat)
    assert template == {"prompt": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"}
    assert (await call(sim, "POST", "/tokenize", {"content": 5}))[0] == 400


@pytest_twisted.ensureDeferred
async def test_metrics_need_the_flag(text_weights: Path) -> None:
    plain = SimHarness.loaded(["llama-server", "-m", str(text_weights)])
    code, body, _ = await call(plain, "GET", "/metrics")
    assert code == 501 and body["error"]["type"] == "not_supported_error"
    sim = SimHarness.loaded(["llama-server", "-m", str(text_weights), "--metrics"])
    await call(sim, "POST", "/completion", {"prompt": "a b", "n_predict": 3})
    code, text, content_type = await call(sim, "GET", "/metrics")
    assert code == 200 and content_type.startswith("text/plain")
    assert "llamacpp:prompt_tokens_total 2\n" in text and "llamacpp:tokens_predicted_total 3\n" in text


@pytest.fixture
def stt_weights(tmp_path: Path) -> Path:
    return write_weights(tmp_path / "w.sim.json", "stt", "w", load_ms=500, realtime_factor=0.1)


async def inference(sim: SimHarness, response_format: str) -> Any:
    body, content_type = encode_multipart({"file": ("a.wav", make_wav(2.0), "audio/wav"),
                                           "response_format": response_format})
    return sim.stub.post(sim.url("/inference"), data=body, headers={"Content-Type": content_type})


@pytest_twisted.ensureDeferred
async def test_whisper_formats_carry_the_real_content_types_and_verbose_fields(stt_weights: Path) -> None:
    sim = SimHarness.loaded(["whisper-server", "-m", str(stt_weights)])
    for response_format, content_type in (("text", "text/html"), ("srt", "application/x-subrip"),
                                          ("vtt", "text/vtt"), ("json", "application/json")):
        response = await sim.settle(await inference(sim, response_format))
        assert response.headers.getRawHeaders("content-type")[0].startswith(content_type)
    verbose = json.loads(await sim.stub.content(await sim.settle(await inference(sim, "verbose_json"))))
    (segment,) = verbose["segments"]
    assert [word["word"] for word in segment["words"]] == [f" {w}" if i else w
                                                          for i, w in enumerate(verbose["text"].split())]
    assert len(segment["tokens"]) == len(segment["words"])
    assert {"detected_language", "detected_language_probability", "language_probabilities"} <= set(verbose)
    response = await sim.settle(sim.stub.get(sim.url("/no/such")))
    assert response.code == 404 and await sim.stub.text_content(response) == "File Not Found (/no/such)"


@pytest_twisted.ensureDeferred
async def test_a_transcription_sent_during_a_load_waits_for_the_new_model(stt_weights: Path,
                                                                          tmp_path: Path) -> None:
    """whisper-server's requests wait on its model lock while ``/load`` runs: no 503, the answer comes from
    the new model once it is in (only ``/health`` says "loading model")."""
    sim = SimHarness.loaded(["whisper-server", "-m", str(stt_weights)])
    other = write_weights(tmp_path / "w2.sim.json", "stt", "w2", load_ms=800, realtime_factor=0.1)
    body, content_type = encode_multipart({"model": str(other)})
    start = sim.clock.seconds()
    loading = sim.stub.post(sim.url("/load"), data=body, headers={"Content-Type": content_type})
    sim.advance(0.1)
    waiting = await inference(sim, "json")
    health = await sim.settle(sim.stub.get(sim.url("/health")))
    assert health.code == 503
    response = await sim.settle(waiting)
    assert response.code == 200 and sim.clock.seconds() - start == pytest.approx(0.8 + 0.2)
    assert (await sim.settle(loading)).code == 200


@pytest_twisted.ensureDeferred
async def test_embeddings_native_route_base64_and_an_input_beyond_the_slot(text_weights: Path) -> None:
    """``/embedding`` gives each input's pooled vector in a list of one; base64 items name their encoding;
    an input longer than a slot is refused with llama-server's "larger than the max context size"."""
    sim = SimHarness.loaded(["llama-server", "-m", str(text_weights), "--embeddings", "-c", "512",
                             "-np", "2"])
    _, native, _ = await call(sim, "POST", "/embedding", {"content": ["a", "b c"]})
    assert [item["index"] for item in native] == [0, 1]
    assert all(len(item["embedding"]) == 1 for item in native)
    _, encoded, _ = await call(sim, "POST", "/v1/embeddings", {"input": "a", "encoding_format": "base64"})
    assert encoded["data"][0]["encoding_format"] == "base64"
    code, refused, _ = await call(sim, "POST", "/v1/embeddings", {"input": " ".join(["w"] * 257)})
    assert code == 400 and refused["error"]["message"] == (
        "input (257 tokens) is larger than the max context size (256 tokens). skipping")
    assert (await call(sim, "POST", "/v1/embeddings", {"input": " ".join(["w"] * 256)}))[0] == 200


@pytest_twisted.ensureDeferred
async def test_completions_without_v1_is_the_native_route_and_a_wrong_method_is_not_found(
        text_weights: Path) -> None:
    """llama-server serves ``/completions`` with ``/completion``'s answer (not the OpenAI one) and answers a
    known path asked with the wrong method 404, as it does an unknown path."""
    sim = SimHarness.loaded(["llama-server", "-m", str(text_weights)])
    code, body, _ = await call(sim, "POST", "/completions", {"prompt": "a", "n_predict": 2})
    assert code == 200 and body["tokens_predicted"] == 2 and "choices" not in body
    code, body, _ = await call(sim, "GET", "/v1/chat/completions")
    assert code == 404 and body["error"]["type"] == "not_found_error"
