"""Benchmarks (contract §9): a fixed workload run against one of this node's models, and its history.

:class:`BenchRunner` runs the workload of the model's lane through the node's own inference front
(as a request from the master would be served: the same slot, load and proxy), timing the load, the
first byte and the whole answer; :func:`text_figures`, :func:`image_figures` and :func:`stt_figures`
turn the measurements into the figures (pure).  :class:`BenchBook` keeps the results in
``<store_dir>/benchmarks.json`` (written atomically off the reactor thread), newest first, and knows
each model's latest (a model record's ``benchmark``).
"""

from __future__ import annotations

import io
import json
import math
import os
import struct
import wave
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from routerd.catalog.catalog import Catalog
from routerd.catalog.model import ModelConfig
from routerd.errors import HTTPError, StatusError
from routerd.routing.call import Incoming, Reply
from routerd.routing.classify import Route, classify
from routerd.routing.work import usage_from_json, usage_from_tail

log = Logger()

BENCHMARKS_FILE = "benchmarks.json"
#: Results a node keeps (oldest dropped first).
KEPT = 1000
WORKLOADS = {"text": "text-v1", "image": "image-v1", "stt": "stt-v1"}
#: text-v1: a fixed prompt (about 130 tokens), 64 tokens out, greedy, streamed.
TEXT_PROMPT = ("Summarise the following in one sentence. "
               + "The quick brown fox jumps over the lazy dog. " * 14)
TEXT_MAX_TOKENS = 64
#: image-v1: one 512×512 image in 20 steps.
IMAGE_SIDE, IMAGE_STEPS = 512, 20
IMAGE_PROMPT = "a lighthouse on a rocky coast at dusk"
#: stt-v1: 10 s of a 440 Hz tone, 16 kHz mono 16-bit.
AUDIO_SECONDS, AUDIO_RATE = 10, 16000
_BOUNDARY = "routerd-bench-boundary"
#: The key name a benchmark's request is recorded under in analytics (no API key admitted it).
BENCH_KEY_NAME = "(benchmark)"


class BenchReply:
    """A :class:`~routerd.routing.call.Reply` that keeps the answer and when its first byte came."""

    def __init__(self, clock: IReactorTime) -> None:
        self.clock = clock
        self.status = 200
        self.headers: dict[bytes, bytes] = {}
        self.body = bytearray()
        self.first_write: float | None = None
        self._started = False

    @property
    def started(self) -> bool:
        return self._started

    def set_status(self, code: int) -> None:
        self.status = code

    def set_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def write(self, data: bytes) -> None:
        if data and self.first_write is None:
            self.first_write = self.clock.seconds()
        self._started = True
        self.body += data

    def name_model(self, name: str) -> None:
        pass

    @property
    def gone(self) -> bool:
        return False


def lane_of(model: ModelConfig) -> str | None:
    """The lane whose workload benchmarks ``model`` (text first), or None when none fits."""
    caps = model.capabilities
    if caps.llm:
        return "text"
    if caps.image:
        return "image"
    if caps.stt:
        return "stt"
    return None


def tone_wav(seconds: int = AUDIO_SECONDS, rate: int = AUDIO_RATE) -> bytes:
    """stt-v1's audio: a 440 Hz tone."""
    frames = b"".join(struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * n / rate)))
                      for n in range(seconds * rate))
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(frames)
    return out.getvalue()


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 1)


def text_figures(load_ms: int, started: float, first: float | None, ended: float,
                 usage: tuple[int, int] | None) -> dict[str, Any]:
    """text-v1's figures: TTFT, prompt tokens/s (prompt over TTFT) and generation tokens/s."""
    prompt, completion = usage if usage is not None else (0, 0)
    ttft = (first if first is not None else ended) - started
    gen = ended - (first if first is not None else started)
    return {"load_ms": load_ms, "ttft_ms": _ms(ttft), "duration_ms": _ms(ended - started),
            "prompt_tokens": prompt, "completion_tokens": completion,
            "prompt_tokens_per_s": round(prompt / ttft, 1) if ttft > 0 and prompt else None,
            "gen_tokens_per_s": round(completion / gen, 1) if gen > 0 and completion else None}


def image_figures(load_ms: int, started: float, ended: float) -> dict[str, Any]:
    return {"load_ms": load_ms, "duration_ms": _ms(ended - started), "width": IMAGE_SIDE,
            "height": IMAGE_SIDE, "steps": IMAGE_STEPS, "seconds_per_image": round(ended - started, 3)}


def stt_figures(load_ms: int, started: float, ended: float) -> dict[str, Any]:
    return {"load_ms": load_ms, "duration_ms": _ms(ended - started), "audio_seconds": AUDIO_SECONDS,
            "realtime_factor": round((ended - started) / AUDIO_SECONDS, 4)}


def workload(lane: str, model: ModelConfig) -> tuple[str, bytes, str]:
    """``(path, body, content type)`` of a lane's fixed request for ``model``."""
    if lane == "text":
        body = {"model": model.local_id, "messages": [{"role": "user", "content": TEXT_PROMPT}],
                "max_tokens": TEXT_MAX_TOKENS, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        return "/v1/chat/completions", json.dumps(body).encode(), "application/json"
    if lane == "image":
        body = {"model": model.image_id or model.local_id, "prompt": IMAGE_PROMPT, "n": 1,
                "size": f"{IMAGE_SIDE}x{IMAGE_SIDE}", "steps": IMAGE_STEPS}
        return "/v1/images/generations", json.dumps(body).encode(), "application/json"
    parts = (f'--{_BOUNDARY}\r\nContent-Disposition: form-data; name="model"\r\n\r\n{model.local_id}\r\n'
             f'--{_BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="bench.wav"\r\n'
             "Content-Type: audio/wav\r\n\r\n").encode() + tone_wav() + f"\r\n--{_BOUNDARY}--\r\n".encode()
    return "/v1/audio/transcriptions", parts, f"multipart/form-data; boundary={_BOUNDARY}"


class BenchBook:
    """The node's benchmark results (``<store_dir>/benchmarks.json``), newest first."""

    def __init__(self, store_dir: str, run_in_thread: Callable[..., Any], kept: int = KEPT) -> None:
        self.path = os.path.join(store_dir, BENCHMARKS_FILE)
        self.run_in_thread = run_in_thread
        self.kept = kept
        self._results: list[dict[str, Any]] = []

    def load(self) -> None:
        """Read the file at start (a missing or unreadable one is an empty history, logged)."""
        try:
            with open(self.path, encoding="utf-8") as fh:
                data = json.load(fh)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warn("benchmark history {path} is unreadable ({error}); starting empty", path=self.path,
                     error=str(exc))
            return
        results = data.get("benchmarks") if isinstance(data, dict) else None
        if isinstance(results, list):
            self._results = [r for r in results if isinstance(r, dict)][:self.kept]

    def history(self, model: str | None = None) -> list[dict[str, Any]]:
        return [r for r in self._results if model is None or r.get("model") == model]

    def latest(self, model_id: str) -> dict[str, Any] | None:
        return next((r for r in self._results if r.get("model") == model_id), None)

    async def add(self, result: dict[str, Any]) -> None:
        self._results.insert(0, result)
        del self._results[self.kept:]
        document = json.dumps({"benchmarks": self._results}, indent=1).encode()
        await self.run_in_thread(_write_atomically, self.path, document)


def _write_atomically(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    temporary = path + ".tmp"
    with open(temporary, "wb") as fh:
        fh.write(data)
    os.replace(temporary, path)


Handle = Callable[[Incoming, Reply, Route], Awaitable[bytes]]


@attrs.define(kw_only=True, eq=False)
class BenchRunner:
    """Runs a model's workload on this node and stores the result."""

    node_id: str
    clock: IReactorTime
    catalog: Callable[[], Catalog]
    loaded_config: Callable[[Any], str | None]
    load: Callable[[str], Awaitable[Any]]
    handle: Handle
    book: BenchBook
    #: Told after a result is stored (the site's records show it).
    on_result: Callable[[dict[str, Any]], None] = lambda _result: None

    def model(self, name: str) -> ModelConfig:
        model = self.catalog().resolve(name)
        if model is None:
            raise HTTPError(404, f"model {name!r} was not found on node {self.node_id!r}", "not_found",
                            "model_not_found")
        return model

    async def run(self, name: str) -> dict[str, Any]:
        """Benchmark ``name`` (a local ID or image ID); the stored result (``ok`` false on failure)."""
        model = self.model(name)
        lane = lane_of(model)
        if lane is None:
            raise HTTPError(400, f"model {name!r} serves no lane with a benchmark workload",
                            "invalid_request_error", "no_workload")
        at = self.clock.seconds()
        result: dict[str, Any] = {"id": f"{self.node_id}-{int(at * 1000)}-{model.local_id}",
                                  "node_id": self.node_id, "model": model.local_id, "lane": lane,
                                  "at_ms": int(at * 1000), "workload": WORKLOADS[lane], "ok": False,
                                  "error": "", "figures": {}}
        try:
            result["figures"] = await self._measure(lane, model)
            result["ok"] = True
        except StatusError as exc:
            result["error"] = exc.message
        await self.book.add(result)
        self.on_result(result)
        return result

    async def _measure(self, lane: str, model: ModelConfig) -> dict[str, Any]:
        load_ms = 0
        if self.loaded_config(lane) != model.filename:
            began = self.clock.seconds()
            await self.load(model.local_id)
            load_ms = round((self.clock.seconds() - began) * 1000)
        path, body, content_type = workload(lane, model)
        route = classify("POST", path)
        assert route is not None
        reply = BenchReply(self.clock)
        started = self.clock.seconds()
        incoming = Incoming(path=path, body=body, content_type=content_type, key_name=BENCH_KEY_NAME)
        answer = await self.handle(incoming, reply, route)
        ended = self.clock.seconds()
        reply.body += answer
        if not 200 <= reply.status < 300:
            raise HTTPError(502, f"the benchmark request answered {reply.status}: "
                                 f"{bytes(reply.body[:300]).decode('utf-8', 'replace')}",
                            "backend_error", "benchmark_failed")
        if lane == "text":
            usage = usage_from_tail(bytes(reply.body[-4096:])) or _json_usage(bytes(reply.body))
            return text_figures(load_ms, started, reply.first_write, ended, usage)
        if lane == "image":
            return image_figures(load_ms, started, ended)
        return stt_figures(load_ms, started, ended)


def _json_usage(body: bytes) -> tuple[int, int] | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return usage_from_json(data) if isinstance(data, dict) else None


__all__ = ["BENCHMARKS_FILE", "BENCH_KEY_NAME", "WORKLOADS", "BenchBook", "BenchReply", "BenchRunner",
           "image_figures", "lane_of", "stt_figures", "text_figures", "tone_wav", "workload"]
