"""The simulated whisper-server, driven in-process: /inference on WAV uploads and /load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from routerd.sim.harness import SimHarness
from routerd.sim.multipart import FilePart, encode_multipart
from routerd.sim.wav import make_wav
from routerd.sim.weights import write_weights


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    return write_weights(tmp_path / "whisper-a.sim.json", "stt", "whisper-a", load_ms=300,
                         realtime_factor=0.25)


def make(weights: Path, *flags: str) -> SimHarness:
    return SimHarness.loaded(["whisper-server", "-m", str(weights), *flags])


async def form(sim: SimHarness, path: str, fields: dict[str, str | bytes | FilePart]) -> Any:
    body, content_type = encode_multipart(fields)
    return await sim.settle(sim.stub.post(sim.url(path), data=body,
                                          headers={"Content-Type": content_type}))


async def form_json(sim: SimHarness, path: str, fields: dict[str, str | bytes | FilePart]) -> tuple[int, Any]:
    response = await form(sim, path, fields)
    return response.code, json.loads(await sim.stub.content(response))


def wav(seconds: float) -> FilePart:
    return ("clip.wav", make_wav(seconds), "audio/wav")


@pytest_twisted.ensureDeferred
async def test_health_says_loading_model_then_ok(weights: Path) -> None:
    sim = SimHarness(["whisper-server", "-m", str(weights)])
    sim.start()
    response = await sim.settle(sim.stub.get(sim.url("/health")))
    assert response.code == 503
    assert json.loads(await sim.stub.content(response)) == {"status": "loading model"}
    code, body = await form_json(sim, "/inference", {"file": wav(1)})
    assert code == 503 and "error" in body
    sim.advance(0.3)
    response = await sim.settle(sim.stub.get(sim.url("/health")))
    assert response.code == 200 and json.loads(await sim.stub.content(response)) == {"status": "ok"}


@pytest_twisted.ensureDeferred
async def test_inference_takes_audio_seconds_times_realtime_factor(weights: Path) -> None:
    sim = make(weights)
    start = sim.clock.seconds()
    code, body = await form_json(sim, "/inference", {"file": wav(4.0)})
    assert sim.clock.seconds() - start == pytest.approx(1.0)
    assert code == 200 and set(body) == {"text"}
    assert len(body["text"].split()) == 10
    assert (await form_json(sim, "/inference", {"file": wav(4.0)}))[1] == body
    assert (await form_json(sim, "/inference", {"file": wav(2.0)}))[1] != body


@pytest_twisted.ensureDeferred
async def test_response_formats(weights: Path) -> None:
    sim = make(weights)
    code, verbose = await form_json(sim, "/inference", {"file": wav(2.0), "response_format": "verbose_json"})
    assert code == 200
    assert verbose["duration"] == pytest.approx(2.0) and verbose["language"] == "en"
    response = await form(sim, "/inference", {"file": wav(2.0), "response_format": "text"})
    assert (await sim.stub.text_content(response)).strip() == verbose["text"]
    code, plain = await form_json(sim, "/inference", {"file": wav(2.0), "response_format": "json"})
    assert plain == {"text": verbose["text"]}


@pytest.mark.parametrize(
    "fields",
    [{"model": "x"}, {"file": ("a.mp3", b"ID3\x03not a wav", "audio/mpeg")}, {"file": b""}],
    ids=["missing-file", "not-wav", "empty"],
)
@pytest_twisted.ensureDeferred
async def test_missing_or_non_wav_file_gets_400_invalid_request(weights: Path, fields: Any) -> None:
    """whisper-server's HTTP library answers every 400 with the text "Invalid request" (the reason goes to
    stderr)."""
    sim = make(weights)
    response = await form(sim, "/inference", fields)
    assert response.code == 400 and await sim.stub.text_content(response) == "Invalid request"
    assert response.headers.getRawHeaders("content-type")[0].startswith("text/plain")
    assert "error: " in sim.err.getvalue()


@pytest_twisted.ensureDeferred
async def test_non_multipart_body_gets_400(weights: Path) -> None:
    sim = make(weights)
    response = await sim.settle(sim.stub.post(sim.url("/inference"), json={"file": "x"}))
    assert response.code == 400 and await sim.stub.text_content(response) == "Invalid request"


@pytest_twisted.ensureDeferred
async def test_load_swaps_weights_after_their_load_ms(weights: Path, tmp_path: Path) -> None:
    sim = make(weights)
    before = (await form_json(sim, "/inference", {"file": wav(2.0)}))[1]["text"]
    other = write_weights(tmp_path / "whisper-b.sim.json", "stt", "whisper-b", load_ms=800,
                          realtime_factor=0.5)
    start = sim.clock.seconds()
    body, content_type = encode_multipart({"model": str(other)})
    loading = sim.stub.post(sim.url("/load"), data=body, headers={"Content-Type": content_type})
    sim.advance(0.4)
    response = await sim.settle(sim.stub.get(sim.url("/health")))
    assert response.code == 503  # busy loading
    response = await sim.settle(loading)
    assert sim.clock.seconds() - start == pytest.approx(0.8)
    assert response.code == 200 and await sim.stub.text_content(response) == "Load was successful!"
    start = sim.clock.seconds()
    after = (await form_json(sim, "/inference", {"file": wav(2.0)}))[1]["text"]
    assert sim.clock.seconds() - start == pytest.approx(1.0)
    assert after != before


@pytest_twisted.ensureDeferred
async def test_load_without_model_or_with_a_missing_file_gets_400(weights: Path, tmp_path: Path) -> None:
    sim = make(weights)
    for fields in ({"other": "x"}, {"model": str(tmp_path / "nope")}):
        response = await form(sim, "/load", fields)
        assert response.code == 400 and await sim.stub.text_content(response) == "Invalid request"
    assert "no 'model' field in the request" in sim.err.getvalue()
    assert f"{tmp_path / 'nope'} not found!" in sim.err.getvalue()
    assert sim.exit_codes == []


@pytest_twisted.ensureDeferred
async def test_loading_unusable_weights_ends_the_process_with_code_1(weights: Path, tmp_path: Path) -> None:
    sim = make(weights)
    text = write_weights(tmp_path / "t.sim.json", "text", "t")
    body, content_type = encode_multipart({"model": str(text)})
    answered = []
    sim.stub.post(sim.url("/load"), data=body, headers={"Content-Type": content_type}).addBoth(
        answered.append)
    sim.advance(1)
    assert sim.exit_codes == [1] and answered == []
    assert "needs stt weights" in sim.err.getvalue()


@pytest_twisted.ensureDeferred
async def test_failed_load_ends_the_process_with_code_1(weights: Path, tmp_path: Path) -> None:
    sim = make(weights)
    await sim.settle(sim.stub.post(sim.url("/sim/control"), json={"fail_next_load": True}))
    other = write_weights(tmp_path / "whisper-b.sim.json", "stt", "whisper-b", load_ms=100)
    body, content_type = encode_multipart({"model": str(other)})
    sim.stub.post(sim.url("/load"), data=body, headers={"Content-Type": content_type})
    sim.advance(0.1)
    assert sim.exit_codes == [1]
    assert "failed to load model" in sim.err.getvalue()
