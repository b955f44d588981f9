"""Real ``routerd-sim`` processes on 127.0.0.1: what a launcher and a router see over HTTP.

Every process is started through ``python -m routerd.sim`` and killed in teardown.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.protocol import ProcessProtocol
from twisted.internet.task import deferLater
from twisted.python.failure import Failure

from routerd.sim.multipart import encode_multipart
from routerd.sim.wav import make_wav
from routerd.sim.weights import write_weights
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]
R: Any = reactor  # the global reactor (zope interfaces are opaque to mypy)

pytestmark = pytest.mark.slow



class SimProcess(ProcessProtocol):
    """One ``routerd-sim`` child: its output, its listening line and its exit code."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.stdout_lines: list[str] = []
        self.stderr = b""
        self._partial = b""
        self.listening: Deferred[str] = Deferred()
        self.ended: Deferred[int | None] = Deferred()
        self.exit_code: int | None = None
        self.running = True

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def outReceived(self, data: bytes) -> None:
        self._partial += data
        *lines, self._partial = self._partial.split(b"\n")
        for raw in lines:
            line = raw.decode()
            self.stdout_lines.append(line)
            if "server is listening on" in line and not self.listening.called:
                self.listening.callback(line)

    def errReceived(self, data: bytes) -> None:
        self.stderr += data

    def processEnded(self, reason: Failure) -> None:
        self.running = False
        self.exit_code = getattr(reason.value, "exitCode", None)
        if not self.listening.called:
            self.listening.errback(RuntimeError(f"exited early: {self.stderr.decode()}"))
        self.ended.callback(self.exit_code)

    def kill(self) -> None:
        if self.running and self.transport is not None:
            self.transport.signalProcess("KILL")


Launch = Callable[..., Awaitable[SimProcess]]


@pytest_twisted.async_yield_fixture
async def launch() -> AsyncIterator[Launch]:
    """Start sims with ``await launch(family, *flags)``; all are killed at teardown."""
    started: list[SimProcess] = []

    async def start(family: str, *flags: str, wait: bool = True) -> SimProcess:
        port = free_port()
        proc = SimProcess(port)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
        env.pop("ROUTERD_SIM_TIME_SCALE", None)
        argv = [sys.executable, "-m", "routerd.sim", family, "--port", str(port), *flags]
        R.spawnProcess(proc, sys.executable, argv, env=env, path=str(REPO))
        started.append(proc)
        if wait:
            await timeout(proc.listening, 20)
        else:
            proc.listening.addErrback(lambda _: None)  # the test waits for the exit instead
        return proc

    yield start
    for proc in started:
        proc.kill()
    for proc in started:
        await timeout(proc.ended, 10)


def timeout(d: Deferred[Any], seconds: float) -> Deferred[Any]:
    return d.addTimeout(seconds, R)


async def sleep(seconds: float) -> None:
    await deferLater(R, seconds, lambda: None)


async def get(url: str) -> tuple[int, Any]:
    response = await treq.get(url, persistent=False)
    return response.code, json.loads(await response.content())


async def post(url: str, body: object) -> tuple[int, Any]:
    response = await treq.post(url, json=body, persistent=False)
    return response.code, json.loads(await response.content())


async def wait_ready(proc: SimProcess, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            if (await get(proc.url("/health")))[0] == 200:
                return
        except Exception:  # noqa: BLE001 - not listening yet
            pass
        await sleep(0.02)
    raise AssertionError("never became ready")


async def timed_chat(proc: SimProcess, body: dict[str, object]) -> tuple[float, Any]:
    started = time.monotonic()
    code, answer = await post(proc.url("/v1/chat/completions"), body)
    assert code == 200, answer
    return time.monotonic() - started, answer


def text_weights(tmp_path: Path, **timing: float) -> Path:
    values = {"load_ms": 0, "prompt_tokens_per_s": 1000, "gen_tokens_per_s": 100, "context": 4096,
              **timing}
    return write_weights(tmp_path / "llama-a.sim.json", "text", "llama-a", **values)


def chat(max_tokens: int, stream: bool = False) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": max_tokens, "stream": stream}


@pytest_twisted.ensureDeferred
async def test_listens_at_once_answers_503_while_loading_then_model_loaded(
    launch: Launch, tmp_path: Path
) -> None:
    weights = text_weights(tmp_path, load_ms=5000)
    proc = await launch("llama-server", "-m", str(weights), "--sim-time-scale", "0.1")  # 500 ms
    assert proc.stdout_lines[0] == f"main: server is listening on http://127.0.0.1:{proc.port}"
    code, body = await get(proc.url("/health"))
    assert (code, body["error"]["message"], body["error"]["type"]) == (503, "Loading model",
                                                                        "unavailable_error")
    assert (await get(proc.url("/v1/models")))[0] == 503
    await wait_ready(proc)
    assert "model loaded" in proc.stdout_lines
    code, models = await get(proc.url("/v1/models"))
    assert code == 200 and models["data"][0]["id"] == "llama-a.sim.json"


@pytest_twisted.ensureDeferred
async def test_chat_plain_and_sse_stream_arriving_in_chunks_over_time(
    launch: Launch, tmp_path: Path
) -> None:
    # 10 tokens/s scaled by 0.2: one token every 20 ms
    weights = text_weights(tmp_path, gen_tokens_per_s=10)
    proc = await launch("llama-server", "-m", str(weights), "--sim-time-scale", "0.2")
    await wait_ready(proc)
    elapsed, answer = await timed_chat(proc, chat(8))
    assert 0.14 <= elapsed < 0.6
    content = answer["choices"][0]["message"]["content"]
    assert len(content.split()) == 8 and answer["usage"]["completion_tokens"] == 8

    response = await treq.post(proc.url("/v1/chat/completions"), json=chat(8, stream=True),
                               persistent=False, unbuffered=True)
    assert response.code == 200
    arrivals: list[tuple[float, bytes]] = []
    await treq.collect(response, lambda data: arrivals.append((time.monotonic(), data)))
    stream = b"".join(data for _, data in arrivals).decode()
    frames = [f[len("data: "):] for f in stream.split("\n\n") if f]
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(f) for f in frames[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == content
    assert chunks[-1]["timings"]["predicted_n"] == 8  # usage only comes when stream_options asks for it
    assert len(arrivals) >= 5, "tokens should arrive in separate reads"
    assert arrivals[-1][0] - arrivals[0][0] >= 0.1, "tokens should be spread over the job time"


@pytest_twisted.ensureDeferred
async def test_embeddings(launch: Launch, tmp_path: Path) -> None:
    weights = write_weights(tmp_path / "emb.sim.json", "text", "emb", embedding_dim=16)
    proc = await launch("llama-server", "-m", str(weights), "--embeddings", "-ngl", "99")
    await wait_ready(proc)
    code, body = await post(proc.url("/v1/embeddings"), {"input": ["first text", "second"]})
    assert code == 200
    assert [len(d["embedding"]) for d in body["data"]] == [16, 16]
    assert sum(v * v for v in body["data"][0]["embedding"]) == pytest.approx(1.0)
    assert b"ignoring unsupported argument: -ngl 99" in proc.stderr


@pytest_twisted.ensureDeferred
async def test_image_generation_on_both_routes(launch: Launch, tmp_path: Path) -> None:
    weights = write_weights(tmp_path / "sdxl.sim.json", "image", "sdxl", ms_per_step_megapixel=10)
    proc = await launch("sd-server", "-m", str(weights), "--sim-time-scale", "0.5")
    await wait_ready(proc)
    code, models = await get(proc.url("/sdapi/v1/sd-models"))
    assert code == 200 and models[0]["model_name"] == "sdxl"
    code, body = await post(proc.url("/sdapi/v1/txt2img"), {"prompt": "fox", "steps": 4, "batch_size": 2})
    assert code == 200 and len(body["images"]) == 2
    code, body = await post(proc.url("/v1/images/generations"),
                            {"prompt": "fox", "n": 1, "size": "256x256", "response_format": "b64_json"})
    assert code == 200 and len(body["data"]) == 1 and body["data"][0]["b64_json"].startswith("iVBOR")


@pytest_twisted.ensureDeferred
async def test_whisper_transcribes_an_uploaded_wav(launch: Launch, tmp_path: Path) -> None:
    weights = write_weights(tmp_path / "whisper.sim.json", "stt", "whisper", realtime_factor=0.05)
    proc = await launch("whisper-server", "-m", str(weights))
    await wait_ready(proc)
    body, content_type = encode_multipart({"file": ("a.wav", make_wav(2.0), "audio/wav"),
                                           "response_format": "verbose_json"})
    started = time.monotonic()
    response = await treq.post(proc.url("/inference"), data=body,
                               headers={"Content-Type": content_type}, persistent=False)
    answer = json.loads(await response.content())
    assert time.monotonic() - started >= 0.09  # 2 s of audio x 0.05
    assert response.code == 200 and answer["duration"] == pytest.approx(2.0)
    assert len(answer["text"].split()) == 5
    bad, bad_type = encode_multipart({"file": ("a.txt", b"hello", "text/plain")})
    response = await treq.post(proc.url("/inference"), data=bad, headers={"Content-Type": bad_type},
                               persistent=False)
    assert response.code == 400 and await response.text() == "Invalid request"  # whisper-server's text 400


async def two_at_once(proc: SimProcess) -> float:
    started = time.monotonic()
    results = await Deferred.fromCoroutine(_gather(proc))
    assert all(code == 200 for code in results)
    return time.monotonic() - started


async def _gather(proc: SimProcess) -> list[int]:
    first = treq.post(proc.url("/v1/chat/completions"), json=chat(20), persistent=False)
    second = treq.post(proc.url("/v1/chat/completions"), json=chat(20), persistent=False)
    codes = []
    for d in (first, second):
        response = await d
        await response.content()
        codes.append(response.code)
    return codes


@pytest_twisted.ensureDeferred
async def test_parallel_flag_runs_two_jobs_in_one_job_time_and_one_slot_in_two(
    launch: Launch, tmp_path: Path
) -> None:
    weights = text_weights(tmp_path)  # 20 tokens at 100/s: a 200 ms job
    two = await launch("llama-server", "-m", str(weights), "-np", "2")
    one = await launch("llama-server", "-m", str(weights), "--parallel", "1")
    await wait_ready(two)
    await wait_ready(one)
    job = 0.2
    assert await two_at_once(two) < 1.5 * job
    assert await two_at_once(one) >= 1.9 * job


@pytest_twisted.ensureDeferred
async def test_crash_after_n_requests_exits_with_code_3(launch: Launch, tmp_path: Path) -> None:
    proc = await launch("llama-server", "-m", str(text_weights(tmp_path)), "--sim-crash-after", "2")
    await wait_ready(proc)
    await timed_chat(proc, chat(1))
    assert proc.running
    await timed_chat(proc, chat(1))
    assert await timeout(proc.ended, 10) == 3
    assert b"simulated crash" in proc.stderr


@pytest_twisted.ensureDeferred
async def test_fail_load_exits_1_after_load_ms(launch: Launch, tmp_path: Path) -> None:
    weights = text_weights(tmp_path, load_ms=300)
    proc = await launch("llama-server", "-m", str(weights), "--sim-fail-load")
    assert (await get(proc.url("/health")))[0] == 503
    assert await timeout(proc.ended, 10) == 1
    assert b"failed to load model" in proc.stderr
    assert "model loaded" not in proc.stdout_lines


@pytest_twisted.ensureDeferred
async def test_missing_weights_exit_1_and_kobold_without_a_model_exits_1(
    launch: Launch, tmp_path: Path
) -> None:
    missing = await launch("llama-server", "-m", str(tmp_path / "nope.sim.json"), wait=False)
    assert await timeout(missing.ended, 20) == 1
    assert b"nope.sim.json" in missing.stderr
    kobold = await launch("koboldcpp", wait=False)
    assert await timeout(kobold.ended, 20) == 1
    assert b"no model given" in kobold.stderr


@pytest_twisted.ensureDeferred
async def test_control_slowdown_changes_job_time_live(launch: Launch, tmp_path: Path) -> None:
    proc = await launch("llama-server", "-m", str(text_weights(tmp_path)))  # 10 tokens: 100 ms
    await wait_ready(proc)
    normal, _ = await timed_chat(proc, chat(10))
    code, state = await post(proc.url("/sim/control"), {"slowdown": 3})
    assert code == 200 and state["slowdown"] == 3.0
    slow, _ = await timed_chat(proc, chat(10))
    assert slow >= 0.29 and slow > 2 * normal
    code, state = await get(proc.url("/sim/control"))
    assert state["requests_served"] == 2 and state["in_flight"] == 0


@pytest_twisted.ensureDeferred
async def test_sigterm_exits_cleanly_with_0(launch: Launch, tmp_path: Path) -> None:
    proc = await launch("whisper-server", "-m", str(write_weights(tmp_path / "w.sim.json", "stt", "w")))
    await wait_ready(proc)
    assert proc.transport is not None
    proc.transport.signalProcess("TERM")
    assert await timeout(proc.ended, 10) == 0
