"""The slots on real servers: two GGUFs swapping on the text slot, loads llama-server and whisper-server
refuse (answered with the server's own reason), a client that leaves mid-answer, and ``parallel`` against
llama-server's own ``/slots``.

One node serves every test of the module (each test asks for the model it needs, so the slot swaps to it).
Its llama-server runs with ``--metrics``: tests read how many tokens it generated and how many requests wait.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.defer import ensureDeferred, gatherResults
from twisted.internet.task import deferLater

from routerd.backends.slot_state import SlotStatus
from tests.integration.nodes import RunningNode, post, start_node, wait_until
from tests.integration.rawhttp import RawClient, raw_post
from tests.integration.real_backends import (
    LLAMA_ANSWER,
    LLAMA_FLAGS,
    RealServers,
    TinyModels,
    real_node_config,
)
from tests.support_models import write_tiny_llama
from tests.support_models.llama_gguf import UNKNOWN_ARCHITECTURE

pytestmark = [pytest.mark.slow, pytest.mark.real]

#: Tokens asked of a long generation: far more than the slow model makes before the test is done with it
#: (the context of its one slot holds them with the prompt).
LONG = 1500


@pytest_twisted.async_yield_fixture(scope="module")
async def node(tmp_path_factory: pytest.TempPathFactory, real_servers: RealServers,
               tiny_models: TinyModels) -> AsyncIterator[RunningNode]:
    root = tmp_path_factory.mktemp("real-slots")
    other = str(write_tiny_llama(root / "tiny-f16.gguf", f16=True))  # a second GGUF with the same answer
    models = {
        "tiny": {"model": tiny_models.tiny, "contextsize": 512, "parallel": 2},
        "tiny16": {"model": other, "contextsize": 512, "parallel": 2},
        "long": {"model": tiny_models.slow, "contextsize": 2048, "parallel": 1},
        "pair": {"model": tiny_models.slow, "contextsize": 2048, "parallel": 2},
        "truncated": {"model": tiny_models.truncated, "contextsize": 512},
        "single": {"model": tiny_models.tiny, "contextsize": 512},  # no parallel: one at a time
        "alien": {"model": tiny_models.wrong_architecture, "contextsize": 512},
        "deaf": {"whispermodel": tiny_models.truncated},  # a GGUF is no whisper model
    }
    config = real_node_config(root, real_servers, models, llama_flags=(*LLAMA_FLAGS, "--metrics"))
    running = await start_node(config)
    try:
        yield running
    finally:
        await running.stop()


def chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Say hello"}], **extra}


def text_slot(node: RunningNode) -> SlotStatus:
    [status] = [s for s in node.node.runtimes.status() if s.kind == "text"]
    return status


def backend(node: RunningNode) -> str:
    """The base URL of the llama-server the text slot runs now."""
    port = text_slot(node).port
    assert port is not None, text_slot(node)
    return f"http://127.0.0.1:{port}"


async def get_json(url: str) -> Any:
    response = await treq.get(url)
    assert response.code == 200, url
    return json.loads(await response.content())


async def until(holds: Callable[[], Awaitable[bool]], timeout: float) -> None:
    """Ask ``holds`` every 50 ms until it answers true; fail after ``timeout`` seconds."""
    deadline = reactor.seconds() + timeout
    while not await holds():
        if reactor.seconds() > deadline:
            raise AssertionError(f"{holds.__name__}: not so after {timeout:g} s")
        await deferLater(reactor, 0.05, lambda: None)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def metric(url: str, name: str) -> float:
    response = await treq.get(url + "/metrics")
    text = (await response.content()).decode()
    [value] = [line.split()[1] for line in text.splitlines() if line.startswith(name + " ")]
    return float(value)


def answering(client: RawClient) -> bool:
    return b'"content":"' in client.received


async def test_two_ggufs_take_turns_on_the_text_slot_each_in_its_own_llama_server(node: RunningNode) -> None:
    configs = {model: node.node.catalog.get(model) for model in ("tiny", "tiny16")}
    pids = []
    for model in ("tiny", "tiny16", "tiny"):
        status, body, _ = await post(node.url + "/v1/chat/completions", chat(model))
        assert status == 200, body
        assert body["choices"][0]["message"]["content"] == LLAMA_ANSWER
        slot = text_slot(node)
        assert (slot.state, slot.model_id) == ("ready", model)
        props = await get_json(backend(node) + "/props")
        config = configs[model]
        assert config is not None and props["model_path"] == config.text_model
        pids.append(slot.pid)
    assert len(set(pids)) == 3  # every swap started a server for the model asked for...
    for gone in pids[:2]:
        assert gone is not None and not alive(gone)  # ...and stopped the one before

    # asked for both at once: the slot serves one, swaps, serves the other
    answers = await gatherResults([ensureDeferred(post(node.url + "/v1/chat/completions", chat(m)))
                                   for m in ("tiny16", "tiny")])
    assert [(status, body["choices"][0]["message"]["content"]) for status, body, _ in answers] == [
        (200, LLAMA_ANSWER), (200, LLAMA_ANSWER)]
    assert text_slot(node).model_id == "tiny"


@pytest.mark.parametrize(("model", "cause"), [
    ("truncated", "error loading model: tensor 'blk.0.ffn_gate.weight' data is not within the file bounds"),
    ("alien", f"error loading model: unknown model architecture: '{UNKNOWN_ARCHITECTURE}'"),
])
async def test_a_gguf_llama_server_refuses_is_a_502_with_llama_servers_own_reason_everywhere_it_is_shown(
        node: RunningNode, model: str, cause: str) -> None:
    status, body, _ = await post(node.url + "/v1/chat/completions", chat(model))
    assert status == 502, body
    assert body["error"]["code"] == "load_failed"
    message = body["error"]["message"]
    # one line: llama-server's reason first; its output lines are the load-errors list's
    assert message.startswith(f"model '{model}' failed to load: llama-server for '{model}': llama_model_load")
    assert cause in message and message.endswith("(exited with exit code 1 during the load)"), message

    # the load-errors list, which the WebUI's Errors page shows: the reason, then the output lines
    [listed] = (await get_json(node.url + f"/router/v1/site/load-errors?model={model}&limit=1"))["errors"]
    assert cause in listed["reason"], listed
    assert any(cause in line for line in listed["log_tail"])

    # the slot is usable again
    status, body, _ = await post(node.url + "/v1/chat/completions", chat("tiny"))
    assert (status, body["choices"][0]["message"]["content"]) == (200, LLAMA_ANSWER)


async def test_a_file_whisper_server_refuses_is_a_502_with_whisper_servers_own_reason(
        node: RunningNode, tiny_models: TinyModels) -> None:
    with open(tiny_models.tone, "rb") as audio:
        response = await treq.post(node.url + "/v1/audio/transcriptions", data={"model": "deaf"},
                                   files={"file": ("tone.wav", "audio/wav", audio)})
        body = json.loads(await response.content())
    assert response.code == 502, body
    cause = "whisper_model_load: invalid model data (bad magic)"
    assert cause in body["error"]["message"] and "\n" not in body["error"]["message"], body
    [listed] = (await get_json(node.url + "/router/v1/site/load-errors?model=deaf&limit=1"))["errors"]
    assert cause in listed["reason"], listed


async def test_a_client_that_leaves_mid_stream_frees_the_real_slot_within_a_second(node: RunningNode) -> None:
    client = await raw_post(node.service.port.getHost().port, "/v1/chat/completions",
                            chat("long", stream=True, max_tokens=LONG, ignore_eos=True))
    await wait_until(lambda: answering(client), timeout=30)
    url = backend(node)
    [busy] = await get_json(url + "/slots")
    assert busy["is_processing"] and busy["next_token"][0]["n_remain"] > 0  # mid-stream
    client.drop()
    await client.closed

    async def slot_idle() -> bool:
        return not (await get_json(url + "/slots"))[0]["is_processing"]

    await until(slot_idle, timeout=1.0)
    assert await metric(url, "llamacpp:tokens_predicted_total") < LONG  # it stopped, not finished
    assert text_slot(node).users == 0


async def test_a_swap_waits_for_a_running_stream_and_a_client_that_leaves_lets_it_go_at_once(
        node: RunningNode) -> None:
    client = await raw_post(node.service.port.getHost().port, "/v1/chat/completions",
                            chat("long", stream=True, max_tokens=LONG, ignore_eos=True))
    await wait_until(lambda: answering(client), timeout=30)
    streaming = text_slot(node).pid
    other = ensureDeferred(post(node.url + "/v1/chat/completions", chat("tiny")))
    await wait_until(lambda: text_slot(node).waiters == 1)
    assert (text_slot(node).state, text_slot(node).pid) == ("ready", streaming)  # not cut off for the swap

    client.drop()
    status, body, _ = await other
    assert (status, body["choices"][0]["message"]["content"]) == (200, LLAMA_ANSWER)
    assert streaming is not None and not alive(streaming)
    assert text_slot(node).model_id == "tiny"


@pytest.mark.xfail(strict=True, reason=(
    "llama-server b11434 runs a non-streamed generation to its end after its client left (measured directly: "
    "a closed connection, FIN or RST, does not stop it; a stream's next write does; upstream: "
    "ggml-org/llama.cpp#9273, #24496). routerd aborts its backend connection and frees the lease at once, so "
    "its count and the backend's disagree until the orphan ends. A fix: ask llama-server for a stream and "
    "assemble the non-streamed answer in routerd."))
async def test_a_client_that_leaves_before_a_non_streamed_answer_frees_the_real_slot_within_a_second(
        node: RunningNode) -> None:
    client = await raw_post(node.service.port.getHost().port, "/v1/chat/completions",
                            chat("long", max_tokens=LONG, ignore_eos=True))
    await wait_until(lambda: text_slot(node).users == 1 and text_slot(node).model_id == "long", timeout=30)
    url = backend(node)

    async def slot_busy() -> bool:
        return bool((await get_json(url + "/slots"))[0]["is_processing"])

    await until(slot_busy, timeout=10.0)
    client.drop()
    await client.closed
    await wait_until(lambda: text_slot(node).users == 0)  # routerd let go of it at once

    async def slot_idle() -> bool:
        return not await slot_busy()

    await until(slot_idle, timeout=1.0)


async def test_a_config_without_parallel_is_one_llama_server_slot_with_the_whole_context(
        node: RunningNode) -> None:
    """routerd counts a config without ``parallel`` as serving one request at a time; llama-server's own
    default would run 4 slots at once, so routerd starts it with ``--parallel 1``."""
    status, body, _ = await post(node.url + "/v1/chat/completions", chat("single"))
    assert status == 200, body
    slots = await get_json(backend(node) + "/slots")
    assert [s["n_ctx"] for s in slots] == [512]


async def test_parallel_2_runs_two_requests_at_once_in_two_llama_server_slots_a_third_waits_in_llama_server(
        node: RunningNode) -> None:
    """``parallel: 2`` is two llama-server slots, and routerd sends a model that serves N at once
    ``scheduling_backend_depth`` (2) + N - 1 requests: the two that run and one that waits in the backend
    (so a slot never idles between two); a fourth waits in routerd."""
    status, _, _ = await post(node.url + "/v1/chat/completions", chat("pair", max_tokens=1))
    assert status == 200
    url = backend(node)
    slots = await get_json(url + "/slots")
    assert [s["n_ctx"] for s in slots] == [1024, 1024]  # contextsize 2048 over 2 slots

    port = node.service.port.getHost().port
    long_chat = chat("pair", stream=True, max_tokens=LONG // 2, ignore_eos=True)
    clients = [await raw_post(port, "/v1/chat/completions", long_chat) for _ in range(4)]

    async def both_processing() -> bool:
        return [s["is_processing"] for s in await get_json(url + "/slots")] == [True, True]

    async def one_deferred() -> bool:
        return await metric(url, "llamacpp:requests_deferred") == 1

    await until(both_processing, timeout=30.0)
    await until(one_deferred, timeout=5.0)
    await wait_until(lambda: sum(map(answering, clients)) == 2, timeout=10)
    assert text_slot(node).users == 3  # the fourth is held in routerd
    waiting = [client for client in clients if not answering(client)]
    first = next(client for client in clients if answering(client))
    first.drop()  # a slot frees (see above): the one waiting in llama-server takes it, the fourth goes there
    await wait_until(lambda: sum(map(answering, waiting)) == 1, timeout=10)
    await wait_until(lambda: text_slot(node).users == 3, timeout=5)
    await until(both_processing, timeout=5.0)
    await until(one_deferred, timeout=5.0)

    for client in clients:
        client.drop()

    async def both_idle() -> bool:
        return not any(s["is_processing"] for s in await get_json(url + "/slots"))

    await until(both_idle, timeout=5.0)
