"""A cluster on the real llama-server: forwarding through the master, backlog lending between two slaves
each with its own llama-server, and a guardian on the master.

The master runs no real backend (its one model, ``vision``, is a simulated multimodal model: no tiny
vision projector can be generated).  The ``owner`` slave serves ``alpha``, the slow GGUF with
``parallel 1``; the ``helper`` slave serves ``beta``, the tiny GGUF written to answer
:data:`HELPER_ANSWER` (and its own ``own``, :data:`OWN_ANSWER`), so every answer says which llama-server
wrote it.  One cluster serves the whole module: the tests run in file order, and only the last three
link ``alpha`` to ``beta`` and swap the helper.  Every request ``alpha`` answers is the same body (the
lending test needs the owner's uniform cost fit); the others go to ``beta``.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_twisted
import treq
from twisted.internet import defer

from routerd.routing.guardians import image_refused
from routerd.routing.sse import parse_events
from tests.integration.lending_support import LENDING, Trio, ask_chat, chat, link
from tests.integration.nodes import (
    FAST_TEXT,
    TOKEN,
    knows,
    plan_cluster,
    post,
    start_cluster,
    wait_until,
    write_models,
)
from tests.integration.real_backends import LLAMA_ANSWER, RealServers, TinyModels, real_node_config
from tests.support_models import write_tiny_llama

pytestmark = [pytest.mark.slow, pytest.mark.real]

HELPER_ANSWER = " Hello, I am a test model."
"""What the helper's GGUF answers (the owner's answers :data:`LLAMA_ANSWER`)."""
OWN_ANSWER = " Hello, I am a tiny model."
"""What the helper's other model, ``own`` (its own work, never linked), answers."""
#: Lending settings with a quick restore of the model borrowed work displaced.
SETTINGS = {**LENDING, "offload_restore_delay": "300ms"}

PNG = "data:image/png;base64,iVBORw0KGgo="


@pytest_twisted.async_yield_fixture(scope="module")
async def trio(tmp_path_factory: pytest.TempPathFactory, real_servers: RealServers,
               tiny_models: TinyModels) -> AsyncIterator[Trio]:
    root = tmp_path_factory.mktemp("real-cluster")
    helper_gguf = str(write_tiny_llama(root / "helper.gguf", answer=HELPER_ANSWER))
    own_gguf = str(write_tiny_llama(root / "own.gguf", answer=OWN_ANSWER))
    plan = plan_cluster(root, ["owner", "helper"])
    write_models(plan.root / "master", {"vision": {"model": "../weights/vision.sim.json", "contextsize": 4096,
                                                   "mmproj": "../weights/proj.gguf"}},
                 {"vision": FAST_TEXT})
    (plan.root / "master" / "weights" / "proj.gguf").write_bytes(b"projector")
    master = plan.master_config(SETTINGS)
    slaves = {
        "owner": real_node_config(plan.root / "owner", real_servers,
                                  {"alpha": {"model": tiny_models.slow, "contextsize": 512, "parallel": 1}},
                                  plan.slave_sections("owner", extra_cluster=SETTINGS)),
        "helper": real_node_config(plan.root / "helper", real_servers,
                                   {"beta": {"model": helper_gguf, "contextsize": 512, "parallel": 1},
                                    "own": {"model": own_gguf, "contextsize": 512, "parallel": 1}},
                                   plan.slave_sections("helper", extra_cluster=SETTINGS)),
    }
    started = await start_cluster(plan, master, slaves,
                                  ready=lambda r: knows(r, owner="alpha", helper="own", master="vision"))
    running = Trio(started.plan, started.master, started.slaves)
    yield running
    await running.stop()


def content_of(payload: dict[str, Any]) -> str:
    return str(payload["choices"][0]["message"]["content"])


@pytest_twisted.ensureDeferred
async def test_the_master_forwards_each_model_to_the_slave_whose_llama_server_answers_it(trio: Trio) -> None:
    for model, node, answer in (("alpha", b"owner", LLAMA_ANSWER), ("beta", b"helper", HELPER_ANSWER)):
        code, payload, response = await ask_chat(trio.master.url, model)
        assert code == 200, payload
        assert (content_of(payload), payload["model"]) == (answer, model)
        assert response.headers.getRawHeaders(b"x-routerd-node") == [node]


@pytest_twisted.ensureDeferred
async def test_a_streamed_chat_through_the_master_is_the_real_servers_sse_ending_in_done(trio: Trio) -> None:
    # (beta's: alpha's requests all stay one size, so its cost fit is the uniform one the lending test needs)
    response = await treq.post(trio.master.url + "/v1/chat/completions", json={
        "model": "beta", "stream": True, "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hi"}]})
    assert response.code == 200
    assert response.headers.getRawHeaders(b"content-type")[0].startswith(b"text/event-stream")
    assert response.headers.getRawHeaders(b"x-routerd-node") == [b"helper"]
    body = (await response.content()).decode()
    events = [line[len("data: "):] for line in body.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert {chunk["model"] for chunk in chunks} == {"beta"}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == HELPER_ANSWER
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 9  # 8 pieces + EOS


@pytest_twisted.ensureDeferred
async def test_ollama_chat_and_generate_through_the_master_are_the_real_answer_under_the_name_asked(
        trio: Trio) -> None:
    code, payload, response = await post(trio.master.url + "/api/chat", {
        "model": "beta", "stream": False, "messages": [{"role": "user", "content": "hi"}]})
    assert code == 200, payload
    assert response.headers.getRawHeaders(b"x-routerd-node") == [b"helper"]
    assert (payload["model"], payload["message"]["content"], payload["done"]) == ("beta", HELPER_ANSWER, True)
    # streamed (NDJSON, Ollama's default): every line names beta, the text is the helper's sentence
    response = await treq.post(trio.master.url + "/api/generate", json={"model": "beta", "prompt": "hi"})
    lines = [json.loads(line) for line in (await response.content()).decode().splitlines() if line]
    assert response.code == 200 and lines[-1]["done"] is True
    assert {line["model"] for line in lines} == {"beta"}
    assert "".join(line["response"] for line in lines) == HELPER_ANSWER


@pytest_twisted.ensureDeferred
async def test_an_image_for_the_real_text_model_is_refused_by_it_then_answered_by_a_guardian(
        trio: Trio) -> None:
    image_chat = {"model": "alpha", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is in this picture"},
        {"type": "image_url", "image_url": {"url": PNG}}]}]}
    # no guardian: llama-server's own refusal comes through, and it is what routerd's matcher knows
    response = await treq.post(trio.master.url + "/v1/chat/completions", json=image_chat)
    refusal = await response.content()
    assert response.code == 500, refusal
    assert image_refused(response.code, refusal)
    assert response.headers.getRawHeaders(b"x-routerd-guardian") is None
    # a cluster guardian on the master: the image never reaches the owner's llama-server
    setting = {"scope": "cluster", "guardian": {"node_id": "master", "model_id": "vision"}}
    answer = await treq.post(trio.master.url + "/router/v1/site/guardians", json={"guardians": [setting]})
    assert answer.code == 200, await answer.content()
    await wait_until(lambda: all(len(n.node.lending.guardians) == 1 for n in trio.slaves.values()))
    code, payload, response = await ask_chat_body(trio.master.url, image_chat)
    assert code == 200, payload
    assert response.headers.getRawHeaders(b"x-routerd-guardian") == [b"master/vision"]
    assert response.headers.getRawHeaders(b"x-routerd-node") == [b"master"]
    assert payload["model"] == "alpha"
    # and a text-only chat for the same model is still the real owner's
    code, payload, _ = await ask_chat(trio.master.url, "alpha")
    assert (code, content_of(payload)) == (200, LLAMA_ANSWER)
    cleared = await treq.delete(trio.master.url + "/router/v1/site/guardians", params={"scope": "cluster"})
    assert cleared.code == 200, await cleared.content()


@pytest_twisted.ensureDeferred
async def test_a_slaves_llama_server_killed_mid_stream_ends_it_with_an_error_and_the_next_request_restarts_it(
        trio: Trio) -> None:
    """The stream ends properly for the client: its last event is the error (an SSE ``error`` event,
    no ``data: [DONE]``), then the chunked body ends; never a connection that breaks under it."""
    response = await treq.post(trio.master.url + "/v1/chat/completions", unbuffered=True, json={
        "model": "alpha", "stream": True, "max_tokens": 400, "ignore_eos": True,
        "messages": [{"role": "user", "content": "tell me a long story"}]})
    assert response.code == 200
    got: list[bytes] = []
    collecting = treq.collect(response, got.append)
    await wait_until(lambda: b"content" in b"".join(got))  # the real server is answering
    slot = trio.owner.node.runtimes.slot("text")
    killed = slot.status().pid
    assert killed is not None
    os.kill(killed, signal.SIGKILL)
    await collecting  # a whole answer: no ResponseFailed
    body = b"".join(got)
    assert b"[DONE]" not in body
    last = parse_events(body)[-1]
    assert last.name == "error" and json.loads(last.data)["error"]["code"] == "backend_error", last
    # once the node has seen it die (a request sent before may reach the dying process and be cut:
    # a 502, as for any backend killed mid-answer; one refused is run again, see
    # tests/unit/test_inference_backend_died.py)
    await wait_until(lambda: slot.status().pid is None)
    status = slot.status()
    assert status.state == "dead" and "exited with signal 9" in (status.last_error or "")
    code, payload, _ = await ask_chat(trio.master.url, "alpha")
    assert (code, content_of(payload)) == (200, LLAMA_ANSWER)
    assert slot.status().pid not in (None, killed)  # a new llama-server


async def ask_chat_body(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], Any]:
    response = await treq.post(url + "/v1/chat/completions", json=body)
    return response.code, json.loads(await response.content()), response


async def warm_and_link(trio: Trio) -> None:
    """Three requests to each model, a cost refit on the owner, then the link owner/alpha ->
    helper/beta (loads allowed).  The helper is not refitted: it is priced with the owner's fit (a fit
    of its own, of prompts of several lengths, would be a linear one, and the first linear fit in a
    process imports statsmodels: 2.3 s on this machine)."""
    for model in ("alpha", "beta"):
        for _ in range(3):
            code, payload, _ = await ask_chat(trio.master.url, model)
            assert code == 200, (model, code, payload)
    await trio.owner.node._refit()
    # the owner's requests were all one size: a uniform fit
    [fit] = trio.owner.node.lending.costs.models
    assert fit.model_id == "alpha" and fit.uniform_work is not None
    await link(trio, "text", "alpha", "beta")


@pytest_twisted.ensureDeferred
async def test_the_slow_owners_backlog_is_lent_and_lent_answers_are_the_helpers_sentence(trio: Trio) -> None:
    await warm_and_link(trio)
    results = await defer.gatherResults(
        [defer.Deferred.fromCoroutine(ask_chat(trio.master.url, "alpha")) for _ in range(10)])
    assert [code for code, _, _ in results] == [200] * 10
    assert {payload["model"] for _, payload, _ in results} == {"alpha"}
    lent = [(payload, r) for _, payload, r in results if r.headers.getRawHeaders(b"x-routerd-lent-to")]
    kept = [(payload, r) for _, payload, r in results if not r.headers.getRawHeaders(b"x-routerd-lent-to")]
    assert lent, "some of the slow owner's backlog went to the helper"
    assert all(r.headers.getRawHeaders(b"x-routerd-lent-to") == [b"helper/beta"] for _, r in lent)
    assert {content_of(payload) for payload, _ in lent} == {HELPER_ANSWER}  # the helper's llama-server
    assert {content_of(payload) for payload, _ in kept} <= {LLAMA_ANSWER}  # the owner's own
    assert len(kept) >= 2  # the two in the owner's pipe never move
    # priced, not only probed: the owner's fit of its measured requests prices its queue
    plans = await trio.master.node.lending.decisions.query(kind="plan", limit=500)
    assert "granted" in {row["outcome"] for row in plans}, [(r["outcome"], r["reason"]) for r in plans]
    owner_rows = await trio.owner.node.lending.decisions.query(kind="dispatch", limit=500)
    assert len([row for row in owner_rows if row["outcome"] == "lent"]) == len(lent)
    assert trio.owner.node.lending.queues["text"].pending() == []
    assert trio.owner.node.lending.queues["text"].lent("alpha") == []


@pytest_twisted.ensureDeferred
async def test_a_borrowed_request_loads_the_helpers_real_server_only_when_the_lease_allows_it(
        trio: Trio) -> None:
    helper = trio.helper.node
    await helper.runtimes.unload("all")
    headers = {"authorization": f"Bearer {TOKEN}", "x-routerd-offload": "1"}
    url = trio.helper.url + "/router/v1/node/inference/v1/chat/completions"
    code, payload, _ = await post(url, chat("beta"), headers=headers)
    assert (code, payload["error"]["code"]) == (409, "offload_returned")
    assert helper.runtimes.loaded_config("text") is None  # no llama-server was started
    code, payload, _ = await post(url, chat("beta"), headers={**headers, "x-routerd-offload-load": "1"})
    assert (code, content_of(payload)) == (200, HELPER_ANSWER)
    assert helper.runtimes.loaded_config("text") == "beta.kcpps"


@pytest_twisted.ensureDeferred
async def test_a_borrowed_request_swaps_the_helpers_real_server_and_the_displaced_model_comes_back(
        trio: Trio) -> None:
    runtimes = trio.helper.node.runtimes
    code, payload, _ = await ask_chat(trio.master.url, "own")  # the helper's own work: own is loaded
    assert (code, content_of(payload), runtimes.loaded_config("text")) == (200, OWN_ANSWER, "own.kcpps")
    own_pid = runtimes.slot("text").status().pid
    headers = {"authorization": f"Bearer {TOKEN}", "x-routerd-offload": "1", "x-routerd-offload-load": "1",
               "x-routerd-offload-restore": "1"}
    code, payload, _ = await post(trio.helper.url + "/router/v1/node/inference/v1/chat/completions",
                                  chat("beta"), headers=headers)
    assert (code, content_of(payload)) == (200, HELPER_ANSWER)  # a llama-server on beta's GGUF
    # once quiet for offload_restore_delay, the helper reloads what the borrowed work displaced
    await wait_until(lambda: runtimes.loaded_config("text") == "own.kcpps")
    assert runtimes.slot("text").status().pid not in (None, own_pid)
    code, payload, _ = await ask_chat(trio.master.url, "own")
    assert (code, content_of(payload)) == (200, OWN_ANSWER)
