"""The text lane on the real llama-server: every answer shape routerd serves, Ollama's durations,
embeddings, routerd's token estimate against the real tokenizer and the context gate on the real
per-slot window.

One node serves the module (a model switch costs a tenth of a second): ``tiny`` (``contextsize``
512 over ``parallel`` 2, so each real slot holds 256 tokens), ``embed`` (an ``embeddingsmodel``
whose GGUF pools by mean, as an embedding model's does) and ``chatembed`` (the tiny chat GGUF as
a text model with ``"embeddings": true``: its GGUF states no pooling).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq

from routerd.lending.pricing import client_output_limit, estimate_text, fewest_prompt_tokens
from tests.integration.nodes import RunningNode, post, start_node
from tests.integration.real_backends import LLAMA_ANSWER, RealServers, TinyModels, real_node_config

pytestmark = [pytest.mark.slow, pytest.mark.real]

SLOT_WINDOW = 256  # contextsize 512 split over parallel 2
#: Every cost fit this module makes needs only two samples; refits happen when a test asks.
LENDING = {"scheduling_min_samples": 2, "scheduling_refresh_interval": "10m"}


@pytest_twisted.async_yield_fixture(scope="module")
async def node(tmp_path_factory: pytest.TempPathFactory, real_servers: RealServers,
               tiny_models: TinyModels) -> AsyncIterator[RunningNode]:
    models = {
        "tiny": {"model": tiny_models.tiny, "contextsize": 512, "parallel": 2},
        "embed": {"embeddingsmodel": tiny_models.embed},
        "chatembed": {"model": tiny_models.tiny, "contextsize": 512, "embeddings": True},
    }
    config = real_node_config(tmp_path_factory.mktemp("real-text"), real_servers, models,
                              {"cluster": LENDING})
    running = await start_node(config)
    yield running
    await running.stop()


def chat(model: str, content: str = "Say hello", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], **extra}


async def raw_post(url: str, body: Any) -> tuple[int, bytes, Any]:
    response = await treq.post(url, json=body)
    return response.code, await response.content(), response


def text_slot(running: RunningNode) -> Any:
    return next(s for s in running.node.runtimes.status() if s.kind == "text")


async def backend(running: RunningNode, path: str, body: Any) -> Any:
    """POST straight to the text backend routerd started (not through routerd)."""
    status, answer, _ = await post(f"http://127.0.0.1:{text_slot(running).port}{path}", body)
    assert status == 200, answer
    return answer


# -- the answer shapes ------------------------------------------------------------------------------


async def test_chat_answers_the_known_sentence_with_the_public_id_and_real_usage(node: RunningNode) -> None:
    status, body, _ = await post(node.url + "/v1/chat/completions", chat("tiny", max_tokens=32))
    assert status == 200, body
    assert body["choices"][0]["message"]["content"] == LLAMA_ANSWER
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["model"] == "tiny" and body["object"] == "chat.completion"
    assert body["usage"]["completion_tokens"] == 10
    assert body["usage"]["prompt_tokens"] > 0


async def test_streamed_chat_is_sse_events_with_a_final_usage_chunk_then_done(node: RunningNode) -> None:
    status, raw, response = await raw_post(node.url + "/v1/chat/completions", chat(
        "tiny", stream=True, stream_options={"include_usage": True}))
    assert status == 200, raw
    assert response.headers.getRawHeaders(b"content-type")[0].startswith(b"text/event-stream")
    events = [e for e in raw.decode().split("\n\n") if e.strip()]
    assert all(e.startswith("data: ") for e in events), events
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
    assert {c["model"] for c in chunks} == {"tiny"}
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == LLAMA_ANSWER
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    final = chunks[-1]
    assert final["choices"] == [] and final["usage"]["completion_tokens"] == 10


async def test_completions_and_llama_completion_answer_the_known_sentence(node: RunningNode) -> None:
    status, body, _ = await post(node.url + "/completion", {"model": "tiny", "prompt": "Hi", "n_predict": 12})
    assert status == 200, body
    assert body["content"] == LLAMA_ANSWER and body["tokens_predicted"] == 10
    status, body, _ = await post(node.url + "/v1/completions", {"model": "tiny", "prompt": "Hi",
                                                                "max_tokens": 12})
    assert status == 200, body
    assert body["choices"][0]["text"] == LLAMA_ANSWER and body["model"] == "tiny"
    status, body, _ = await post(node.url + "/v1/completions", {"model": "tiny", "prompt": "Hi",
                                                                "max_tokens": 4})
    assert status == 200, body
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["choices"][0]["text"] == " Hello, I am"


# -- Ollama's durations -----------------------------------------------------------------------------


async def switch_away(running: RunningNode) -> None:
    """Load another config, so the next ``tiny`` request loads ``tiny`` again."""
    status, body, _ = await post(running.url + "/v1/chat/completions", chat("chatembed"))
    assert status == 200, body
    assert text_slot(running).model_id == "chatembed"


def assert_durations_add_up(answer: dict[str, Any]) -> None:
    assert answer["total_duration"] > 0
    assert answer["prompt_eval_duration"] > 0 and answer["eval_duration"] > 0
    # the backend's own times and the load all happened inside the request routerd timed
    assert answer["total_duration"] >= (answer["load_duration"] + answer["prompt_eval_duration"]
                                        + answer["eval_duration"])
    assert answer["eval_count"] == 10


async def test_ollama_chat_reports_the_load_it_waited_for_and_its_total_in_nanoseconds(
        node: RunningNode) -> None:
    await switch_away(node)
    status, loading, _ = await post(node.url + "/api/chat", {**chat("tiny"), "stream": False})
    assert status == 200, loading
    assert loading["message"]["content"] == LLAMA_ANSWER and loading["done"] is True
    assert loading["load_duration"] == text_slot(node).last_load_ms * 1_000_000 > 0
    assert_durations_add_up(loading)
    status, loaded, _ = await post(node.url + "/api/chat", {**chat("tiny"), "stream": False})
    assert status == 200, loaded
    assert loaded["load_duration"] == 0  # the model was loaded already
    assert_durations_add_up(loaded)


async def test_ollama_generate_reports_real_durations_streamed_and_not(node: RunningNode) -> None:
    await switch_away(node)
    status, raw, response = await raw_post(node.url + "/api/generate", {"model": "tiny", "prompt": "Hi"})
    assert status == 200, raw
    assert response.headers.getRawHeaders(b"content-type") == [b"application/x-ndjson"]
    lines = [json.loads(line) for line in raw.decode().splitlines() if line.strip()]
    assert "".join(line.get("response", "") for line in lines) == LLAMA_ANSWER
    done = lines[-1]
    assert done["done"] is True and done["done_reason"] == "stop"
    assert done["load_duration"] == text_slot(node).last_load_ms * 1_000_000 > 0
    assert_durations_add_up(done)
    status, whole, _ = await post(node.url + "/api/generate", {"model": "tiny", "prompt": "Hi",
                                                               "stream": False})
    assert status == 200, whole
    assert whole["response"] == LLAMA_ANSWER and whole["load_duration"] == 0
    assert_durations_add_up(whole)


# -- embeddings -------------------------------------------------------------------------------------


async def test_an_embeddings_model_config_embeds_each_input(node: RunningNode) -> None:
    status, body, _ = await post(node.url + "/v1/embeddings", {"model": "embed",
                                                               "input": ["Hello", "tiny test"]})
    assert status == 200, body
    assert body["model"] == "embed"
    vectors = [item["embedding"] for item in sorted(body["data"], key=lambda d: d["index"])]
    assert [len(v) for v in vectors] == [64, 64] and vectors[0] != vectors[1]
    status, ollama, _ = await post(node.url + "/api/embed", {"model": "embed", "input": "Hello"})
    assert status == 200, ollama
    assert ollama["embeddings"] == [vectors[0]] and ollama["total_duration"] > 0


async def test_a_text_model_that_embeds_answers_embeddings_and_chat(node: RunningNode) -> None:
    """The chat GGUF states no pooling: llama-server refuses OpenAI embeddings unless routerd
    started it with a pooling."""
    status, body, _ = await post(node.url + "/v1/embeddings", {"model": "chatembed", "input": "Hello"})
    assert status == 200, body
    assert len(body["data"][0]["embedding"]) == 64
    status, body, _ = await post(node.url + "/v1/chat/completions", chat("chatembed"))
    assert status == 200, body
    assert body["choices"][0]["message"]["content"] == LLAMA_ANSWER


# -- token estimates and the context gate -----------------------------------------------------------


def words(count: int) -> str:
    return " ".join(f"w{i % 10}" for i in range(count))


async def measured_profile(running: RunningNode) -> Any:
    """Chats of several sizes to ``tiny``, then a cost refit: ``tiny``'s token profile."""
    for count in (5, 20, 40, 60):
        status, body, _ = await post(running.url + "/v1/chat/completions", chat("tiny", words(count)))
        assert status == 200, body
    await running.node._refit()
    profile = running.node.lending.costs.token_profile("tiny")
    assert profile is not None
    return profile


async def test_the_real_token_count_lies_between_routerds_two_estimates(node: RunningNode) -> None:
    """routerd sizes a prompt from its body bytes and the bytes per token it measured: leaning to
    more tokens for lending, to fewer for the context gate.  The real count (llama-server's
    tokenizer on the templated prompt, as its usage reports) lies between the two."""
    profile = await measured_profile(node)
    for count in (10, 30, 60):
        body = chat("tiny", words(count))
        templated = await backend(node, "/apply-template", {"messages": body["messages"]})
        real = len((await backend(node, "/tokenize", {"content": templated["prompt"],
                                                      "add_special": True}))["tokens"])
        status, answer, _ = await post(node.url + "/v1/chat/completions", body)
        assert status == 200, answer
        assert abs(answer["usage"]["prompt_tokens"] - real) <= 1, (answer["usage"], real)
        size = len(json.dumps(body).encode())
        estimate = estimate_text(profile, size, client_output_limit(body), 0)
        fewest = fewest_prompt_tokens(profile, size)
        assert estimate is not None and fewest is not None
        assert fewest <= real <= estimate[0][0], (count, fewest, real, estimate)


async def test_a_prompt_over_the_real_slot_window_is_refused_by_routerd_before_the_backend(
        node: RunningNode) -> None:
    """``contextsize`` 512 over two slots leaves 256 a slot: a prompt of about 380 tokens fits the
    config's number but not the real window, and routerd answers it from ``/props``' window."""
    await measured_profile(node)
    response = await treq.get(f"http://127.0.0.1:{text_slot(node).port}/props")
    assert (await response.json())["default_generation_settings"]["n_ctx"] == SLOT_WINDOW
    status, body, _ = await post(node.url + "/v1/chat/completions", chat("tiny", words(120)))
    assert status == 400, body
    assert body["error"]["type"] == "exceed_context_size_error"
    assert body["error"]["code"] == "context_exceeded"  # routerd's own code (the backend says 400)
    assert str(SLOT_WINDOW) in body["error"]["message"]
    status, body, _ = await post(node.url + "/v1/chat/completions", chat("tiny", words(120), stream=True))
    assert status == 400 and body["error"]["code"] == "context_exceeded", body  # before any event
    status, body, _ = await post(node.url + "/api/chat", {**chat("tiny", words(120)), "stream": False})
    assert status == 400 and "context window" in body["error"], body
    status, body, _ = await post(node.url + "/v1/chat/completions", chat("tiny", words(20)))
    assert status == 200, body  # a prompt that fits still goes through
    await switch_away(node)
    status, body, _ = await post(node.url + "/v1/chat/completions", chat("tiny", words(120)))
    assert status == 400 and body["error"]["code"] == "context_exceeded", body
    assert text_slot(node).model_id == "chatembed"  # refused on the known window: no switch for it


# -- key limits count the backend's own tokens ------------------------------------------------------


async def test_a_keys_tokens_per_minute_counts_exactly_the_real_tokens_of_a_stream_without_usage(
        node: RunningNode, tmp_path: Path, real_servers: RealServers, tiny_models: TinyModels) -> None:
    """A stream whose client did not ask for usage still reports llama-server's ``timings``: a key
    whose limit is exactly the real prompt + answer tokens is full after one, one a token over is not."""
    status, answer, _ = await post(node.url + "/v1/chat/completions", chat("tiny"))  # a backend to ask
    assert status == 200, answer
    body = chat("tiny", stream=True)
    templated = await backend(node, "/apply-template", {"messages": body["messages"]})
    used = len((await backend(node, "/tokenize", {"content": templated["prompt"], "add_special": True}))[
        "tokens"]) + 10
    keys = [{"name": name, "key": f"sk-real-text-{name}-0123456789", "limits": {"tokens_per_minute": limit}}
            for name, limit in (("exact", used), ("over", used + 1))]
    config = real_node_config(tmp_path, real_servers, {"tiny": {"model": tiny_models.tiny}},
                              {"auth": {"inference_keys": keys}})
    keyed = await start_node(config)
    try:
        outcomes = []
        for key in keys:
            headers = {"Authorization": f"Bearer {key['key']}"}
            for _ in range(2):
                response = await treq.post(keyed.url + "/v1/chat/completions", json=body, headers=headers)
                raw = await response.content()
                assert response.code == 429 or b"[DONE]" in raw, raw
                outcomes.append(response.code)
        assert outcomes == [200, 429, 200, 200], (used, outcomes)
    finally:
        await keyed.stop()
