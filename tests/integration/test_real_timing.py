"""The timings pricing sees, on the real llama-server: routerd's request and load samples (the router
database's ``request_samples`` and ``load_samples``, the inputs of the cost fits) against what the server
itself reports, and a fit that tells the slow variant from the tiny one.

Tolerances (stated here, asserted below):

* A request sample's duration brackets the server's own compute: ``timings.prompt_ms + predicted_ms``
  <= the sample <= the wall time the client saw, and its median excess over the server's own time is
  at most ``SERVICE_EXCESS_MS`` (the HTTP exchange, the server's parsing and templating, routerd
  reading the answer; measured 3-14 ms per request on two shared cores, median 4-6 ms).  Its work
  terms are the answer's token counts: the prompt counted whole (``usage.prompt_tokens`` =
  ``timings.cache_n + prompt_n``, the tokens the prompt cache served included, as a request is
  estimated from its whole body) and the output tokens.
* A load sample spans the server's own start-to-ready report (``llama-server --log-timestamps``: the
  "model loaded" line's time since the process began logging) <= the sample <= that time plus
  ``LOAD_SLACK_MS``: the server prints as it becomes ready and routerd probes at once when a loading
  backend prints (at most one probe per ``OUTPUT_PROBE_GAP_S``; the back-off polls are for silent
  backends), and a refused probe (not listening yet) is "not yet" at once.  The slack is exec before
  the server's clock starts, stopping the previous server on a switch, the probe gap and round trip,
  and a busy machine.  Measured over 36 loads: 15-60 ms over the server's own time in 33 (median 31;
  tiny: 17-133 ms ready, sampled 39-164 ms; slow: 46-281 ms ready, sampled 90-354 ms), then 102 ms,
  157 ms and, once, 580 ms on the module's first load (a slow exec on a busy machine, beyond the
  former bound too).  Before routerd probed on output, a sample waited for the next back-off poll
  and a probe refused before the server listened cost 0.3 s: 20-138 ms over in 18 loads (median
  52 ms tiny, 89 ms slow), once 366 ms.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import pytest_twisted
import treq

from routerd.lending.pricing import predict
from routerd.store.samples import RequestSample
from routerd.store.store import Store
from tests.integration.nodes import RunningNode, post, start_node, wait_until
from tests.integration.real_backends import LLAMA_FLAGS, RealServers, TinyModels, real_node_config

pytestmark = [pytest.mark.slow, pytest.mark.real]

#: The median of (request sample - the server's prompt_ms + predicted_ms) may not exceed this.
SERVICE_EXCESS_MS = 25.0
#: A load sample may exceed the server's own start-to-ready time by this (a readiness poll's step on
#: top, or a refused probe's 0.3 s, as before routerd probed on output, does not fit in it).
LOAD_SLACK_MS = 250.0
MIN_SAMPLES = 6
#: (prompt words, max_tokens) of the requests each model's fit is made of: the two work terms vary
#: apart (a fit on terms that move together is unpriced: collinear).  The slow variant's answers are
#: kept short (it makes ~50-450 tokens/s on a busy machine).
DESIGN = {"tiny": [(4, 160), (120, 16), (60, 96), (160, 64), (20, 32), (90, 128)],
          "slow": [(4, 20), (60, 4), (30, 14), (80, 8), (10, 6), (45, 18)]}
_READY = re.compile(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) . srv +\S+ model loaded", re.M)
_LOADING = re.compile(r"loading model '([^']+)'")


@attrs.frozen
class Timed:
    """A node on the real llama-server that logs its own timestamps to ``log``."""

    running: RunningNode
    log: Path
    models: TinyModels

    @property
    def url(self) -> str:
        return self.running.url

    @property
    def store(self) -> Store:
        store = self.running.node.store
        assert store is not None
        return store


@pytest_twisted.async_yield_fixture(scope="module")
async def timed(tmp_path_factory: pytest.TempPathFactory, real_servers: RealServers,
                tiny_models: TinyModels) -> AsyncIterator[Timed]:
    root = tmp_path_factory.mktemp("real-timing")
    log = root / "llama-server.log"  # each server process truncates it: it holds the current one's lines
    models = {name: {"model": getattr(tiny_models, name), "contextsize": 1024, "parallel": 1}
              for name in ("tiny", "slow")}
    settings = {"scheduling_min_samples": MIN_SAMPLES, "scheduling_refresh_interval": "10m"}
    config = real_node_config(root, real_servers, models, {"cluster": settings},
                              llama_flags=(*LLAMA_FLAGS, "--log-timestamps", "--log-file", str(log)))
    running = await start_node(config)
    try:
        yield Timed(running, log, tiny_models)
    finally:
        await running.stop()


def prompt(words: int, tag: str) -> list[dict[str, str]]:
    # a distinct first word, so no answer is served from another request's prompt cache
    return [{"role": "user", "content": f"{tag} " + "hi " * words}]


async def chat(url: str, model: str, words: int, max_tokens: int, tag: str) -> tuple[dict[str, Any], float]:
    """A chat of ``max_tokens`` answer tokens; (the answer, the client's wall time in ms)."""
    started = time.monotonic()
    status, body, _ = await post(url + "/v1/chat/completions", {
        "model": model, "messages": prompt(words, tag), "max_tokens": max_tokens, "ignore_eos": True})
    wall = (time.monotonic() - started) * 1000
    assert status == 200, body
    return body, wall


async def samples_since(timed: Timed, since_ms: int) -> list[RequestSample]:
    return list(await timed.store.request_samples(None, "llm", since_ms))


def server_ms(timings: dict[str, Any]) -> float:
    return float(timings["prompt_ms"]) + float(timings["predicted_ms"])


def assert_brackets(sample: RequestSample, timings: dict[str, Any], wall_ms: float) -> float:
    """The sample lies between the server's own compute and the client's wall time; returns the
    sample's excess over the server's time (ms)."""
    own = server_ms(timings)
    # the server rounds its times to 1 µs; routerd's clock is the reactor's (float seconds)
    assert own - 0.01 <= sample.duration_ms <= wall_ms + 0.01, (sample, timings, wall_ms)
    return sample.duration_ms - own


async def test_request_samples_hold_the_servers_own_compute_time_and_token_counts(timed: Timed) -> None:
    since = int(time.time() * 1000)
    answers = []
    for model, design in DESIGN.items():
        for i, (words, max_tokens) in enumerate(design):
            answers.append((model, *await chat(timed.url, model, words, max_tokens, f"{model}{i}")))
    samples = await samples_since(timed, since)
    assert [s.model_id for s in samples] == [model for model, _, _ in answers]
    excess = []
    for sample, (_model, body, wall) in zip(samples, answers, strict=True):
        usage, timings = body["usage"], body["timings"]
        assert sample.status == "ok"
        assert sample.work == (usage["prompt_tokens"], usage["completion_tokens"])
        assert usage["prompt_tokens"] == timings["cache_n"] + timings["prompt_n"]
        assert usage["completion_tokens"] == timings["predicted_n"]
        excess.append(assert_brackets(sample, timings, wall))
    assert statistics.median(excess) <= SERVICE_EXCESS_MS, excess
    # a request that waited for a load: its sample is the service alone (the load is its own sample)
    loads = [load for load in await timed.store.load_samples(since) if load.runtime == "text"]
    assert loads
    for load in loads:
        i = next(i for i, s in enumerate(samples) if s.finished_at_ms >= load.finished_at_ms)
        wall = answers[i][2]
        assert samples[i].duration_ms + load.duration_ms <= wall + 1.0, (samples[i], load, wall)


async def test_answers_that_report_only_timings_are_sampled_with_their_cached_prompt_tokens(
        timed: Timed) -> None:
    """A stream without ``stream_options.include_usage`` and llama.cpp's own ``/completion`` report no
    OpenAI ``usage``, only ``timings``, whose ``prompt_n`` leaves out the prompt tokens the server's
    cache served: the sample counts them back in (``cache_n``), as ``usage.prompt_tokens`` does."""
    since = int(time.time() * 1000)
    streamed = {"model": "tiny", "messages": prompt(12, "streamed"), "max_tokens": 24, "ignore_eos": True,
                "stream": True}
    native = {"model": "tiny", "prompt": "native " + "hi " * 12, "n_predict": 24, "ignore_eos": True}
    finals, walls = [], []
    for path, body in (("/v1/chat/completions", streamed), ("/completion", native)):
        for _ in range(2):  # the second is served from the first one's prompt cache
            started = time.monotonic()
            response = await treq.post(timed.url + path, json=body)
            text = (await response.content()).decode()
            walls.append((time.monotonic() - started) * 1000)
            assert response.code == 200, text
            finals.append(_last_timings(text) if body.get("stream") else json.loads(text)["timings"])
    assert finals[1]["cache_n"] > 0 and finals[3]["cache_n"] > 0, finals
    samples = await samples_since(timed, since)
    assert len(samples) == 4
    for sample, timings, wall in zip(samples, finals, walls, strict=True):
        whole = timings["cache_n"] + timings["prompt_n"]
        assert sample.work == (whole, timings["predicted_n"]), (sample, timings)
        assert_brackets(sample, timings, wall)


def _last_timings(stream: str) -> dict[str, Any]:
    events = [json.loads(line[6:]) for line in stream.splitlines() if line.startswith("data: {")]
    found = [e["timings"] for e in events if "timings" in e]
    assert found, stream
    return dict(found[-1])


async def _server_ready_ms(timed: Timed, model_path: str) -> float:
    """The current server's own start-to-ready time (ms) from its log, checking it loaded ``model_path``."""
    await wait_until(lambda: timed.log.exists() and _READY.search(timed.log.read_text()) is not None)
    text = timed.log.read_text()
    loading = _LOADING.search(text)
    assert loading is not None and loading.group(1) == model_path, text[:2000]
    found = _READY.search(text)
    assert found is not None
    minutes, seconds, millis, micros = (int(g) for g in found.groups())
    return (minutes * 60 + seconds) * 1000 + millis + micros / 1000


async def test_load_samples_span_the_servers_own_start_to_ready_time(timed: Timed) -> None:
    since = int(time.time() * 1000)
    reports = []
    for i, model in enumerate(("slow", "tiny", "slow")):  # each one a switch of the one text runtime
        loaded = timed.running.node.runtimes.loaded_config("text")
        if loaded == f"{model}.kcpps":  # already loaded (tests run alone): unload first
            response = await treq.post(timed.url + "/router/v1/unload", json={"model": model})
            assert response.code == 200, await response.text()
        _body, wall = await chat(timed.url, model, 4, 4, f"load{i}")
        reports.append((model, await _server_ready_ms(timed, getattr(timed.models, model)), wall))
    loads = [s for s in await timed.store.load_samples(since) if s.runtime == "text"]
    assert [s.model_id for s in loads] == [model for model, _, _ in reports]
    for sample, (_model, ready_ms, wall) in zip(loads, reports, strict=True):
        assert sample.status == "ok"
        assert ready_ms <= sample.duration_ms <= min(ready_ms + LOAD_SLACK_MS, wall), (sample, ready_ms, wall)


async def test_a_fit_prices_the_slow_variant_slower_than_the_tiny_one(timed: Timed) -> None:
    node = timed.running.node
    for model, design in DESIGN.items():  # enough samples even when this test runs alone
        have = [s for s in await samples_since(timed, 0) if s.model_id == model]
        for i, (words, max_tokens) in enumerate(design[: max(0, MIN_SAMPLES - len(have))]):
            await chat(timed.url, model, words, max_tokens, f"fit-{model}{i}")
    await node._refit()
    costs = {cost.model_id: cost for cost in node.lending.costs.models if cost.section == "llm"}
    assert set(costs) == {"tiny", "slow"}, node.lending.costs
    for model in ("tiny", "slow"):
        assert costs[model].uniform_work is None  # a linear fit: the work terms had spread
    works = {s.work for s in await samples_since(timed, 0)}
    for work in sorted(works):  # every request either model served, priced by both fits
        tiny, slow = predict(costs["tiny"], work), predict(costs["slow"], work)
        assert tiny is not None and slow is not None and slow > tiny, (work, costs)
    loads = {cost.config_filename for cost in node.lending.costs.loads}
    assert {"tiny.kcpps", "slow.kcpps"} <= loads
