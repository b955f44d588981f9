"""A stream cut after its answer started still ends properly for the client, through the master:
the stream's last event is an error in the client's API's shape (an SSE ``error`` event; an NDJSON
``{"error": ...}`` line on Ollama's paths) and then the chunked body ends, so the client reads an
error it can handle and its HTTP parser sees a whole answer.  Never a connection that breaks under
the client (``ResponseFailed``: the fault soak lost a stream so when slave-a's llama-server crashed
mid-generation, and the same happens when the node serving a stream dies)."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import pytest_twisted
import treq
from twisted.internet import defer, reactor, task, threads

from routerd.routing.sse import parse_events
from tests.integration import nodes
from tests.integration.nodes import FAST_TEXT, Cluster

MODELS = {"alpha": nodes.sim_model("alpha")}
WEIGHTS = {"alpha": FAST_TEXT}
#: 400 tokens at 200 tokens/s: a 2 s stream, cut well before its end
LONG = 400
ASK = [{"role": "user", "content": "tell me a long story"}]


@pytest_twisted.async_yield_fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    """A master with no model of its own and slave-a serving ``alpha``: every request is forwarded."""
    plan = nodes.plan_cluster(tmp_path, ["slave-a"])
    nodes.write_models(plan.root / "master", {}, {})
    nodes.write_models(plan.root / "slave-a", MODELS, WEIGHTS)
    running = await nodes.start_cluster(plan, ready=lambda r: nodes.knows(r, **{"slave-a": "alpha"}))
    yield running
    await running.stop()


#: (path, body) of a streamed chat per API, and how its answer's last line/event says the error
APIS = {
    "openai": ("/v1/chat/completions",
               {"model": "alpha", "messages": [{"role": "user", "content": "hi"}], "max_tokens": LONG,
                "stream": True}),
    "ollama": ("/api/chat",
               {"model": "alpha", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                "options": {"num_predict": LONG}}),
}


async def _start_stream(url: str, api: str) -> Any:
    """The client's response once the stream has started (its status and first chunk arrived)."""
    path, body = APIS[api]
    response = await treq.post(url + path, json=body)
    assert response.code == 200
    return response


async def _read_whole(response: Any) -> bytes:
    """The whole body; fails (``ResponseFailed``) when the connection broke before the chunked body
    ended, and within 10 s in any case."""
    reading = defer.Deferred.fromCoroutine(_content(response))
    timer = reactor.callLater(10, reading.cancel)
    try:
        return await reading
    finally:
        if timer.active():
            timer.cancel()


async def _content(response: Any) -> bytes:
    return bytes(await response.content())


def _ended_with_an_error(api: str, body: bytes) -> str:
    """The message of the error the stream ends with (after some of the answer); asserts its shape."""
    if api == "ollama":
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        assert lines[:-1] and all("message" in line and not line.get("done") for line in lines[:-1]), lines
        last = lines[-1]
        assert set(last) == {"error"}, last
        return str(last["error"])
    events = parse_events(body)
    assert events[:-1] and all(e.name == "" and e.data != "[DONE]" for e in events[:-1]), events[-3:]
    last = events[-1]
    assert last.name == "error", events[-3:]
    error = json.loads(last.data)["error"]
    assert error["code"] == "backend_error" and error["type"] == "backend_error", error
    assert b"[DONE]" not in body
    return str(error["message"])


async def _crash_backend(cluster: Cluster) -> None:
    """slave-a's llama-server crashes now, as the soak crashes it (``/sim/control``: it exits a
    moment later and the stream's connection drops unfinished)."""
    slave = cluster.slaves["slave-a"]
    [port] = [s.port for s in slave.node.runtimes.status() if s.kind == "text" and s.port]
    response = await treq.post(f"http://127.0.0.1:{port}/sim/control", json={"crash_after": 0})
    assert response.code == 200
    await response.content()


@pytest.mark.parametrize("api", list(APIS))
@pytest_twisted.ensureDeferred
async def test_a_stream_whose_backend_crashes_mid_generation_ends_with_an_error_event_through_the_master(
        cluster: Cluster, api: str) -> None:
    """master -> slave-a, slave-a's backend crashes mid-stream: slave-a ends its answer with the
    error (and the master passes it on): the client reads a whole answer ending in an error."""
    response = await _start_stream(cluster.master.url, api)
    await task.deferLater(reactor, 0.2, lambda: None)  # some tokens have gone out
    await _crash_backend(cluster)
    body = await _read_whole(response)
    message = _ended_with_an_error(api, body)
    assert "broke off" in message, message
    assert response.headers.getRawHeaders(b"x-routerd-node") == [b"slave-a"]


@pytest_twisted.ensureDeferred
async def test_a_stream_whose_serving_slave_dies_mid_answer_ends_with_an_error_event_naming_it(
        cluster: Cluster) -> None:
    """master -> slave-a, slave-a itself dies mid-stream (its connection to the master drops): the
    master ends the client's stream with the error, naming the node."""
    response = await _start_stream(cluster.master.url, "openai")
    await task.deferLater(reactor, 0.2, lambda: None)
    await nodes.kill(cluster.slaves["slave-a"])
    body = await _read_whole(response)
    message = _ended_with_an_error("openai", body)
    assert "broke off" in message and "'slave-a'" in message, message


def _read_sdk_stream(sdk: str, url: str, started: threading.Event) -> str:
    """Stream a chat with the official SDK (in a worker thread); ``started`` is set at the first piece.
    Returns the message of the error the SDK raised (it fails the test when none is raised)."""
    if sdk == "openai":
        chats = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        try:
            stream = chats.chat.completions.create(model="alpha", messages=ASK, max_tokens=LONG, stream=True)
            for _chunk in stream:
                started.set()
        except openai.APIError as exc:
            return str(exc.message)
    else:
        messages = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
        try:
            with messages.messages.stream(model="alpha", max_tokens=LONG, messages=ASK) as stream:
                for _event in stream:
                    started.set()
        except anthropic.APIError as exc:
            return str(exc.message)
    raise AssertionError(f"the {sdk} SDK read the cut stream as complete")


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
@pytest_twisted.ensureDeferred
async def test_the_official_sdks_raise_the_error_of_a_stream_cut_by_a_backend_crash(
        cluster: Cluster, sdk: str) -> None:
    """What a client makes of it: the OpenAI SDK (chat completions) and the Anthropic SDK (Messages)
    raise their API error with routerd's message, not a connection error."""
    started = threading.Event()
    reading = threads.deferToThread(_read_sdk_stream, sdk, cluster.master.url, started)
    assert await threads.deferToThread(started.wait, 10), "the stream started"
    await _crash_backend(cluster)
    message = await reading
    assert "broke off" in message, message
