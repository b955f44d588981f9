"""The simulated llama-server, driven in-process (StubTreq + task.Clock): protocol shapes,
timing model, slots, streaming and fault knobs."""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred

from routerd.sim.harness import SimHarness
from routerd.sim.weights import write_weights

# 100 prompt tokens/s and 10 generated tokens/s: 5 prompt words + 4 tokens = 0.05 s + 0.4 s.
PROMPT = "one two three four five"
JOB_S = 0.45
CHAT = {"model": "client-model", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4}


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    return write_weights(tmp_path / "llama-a.sim.json", "text", "llama-a", load_ms=500,
                         prompt_tokens_per_s=100, gen_tokens_per_s=10, context=64, embedding_dim=6)


def make(weights: Path, *flags: str, loaded: bool = True) -> SimHarness:
    sim = SimHarness(["llama-server", "-m", str(weights), *flags])
    if loaded:
        sim.start_loaded()
    return sim


async def post(sim: SimHarness, path: str, body: object) -> tuple[int, Any]:
    response = await sim.settle(sim.stub.post(sim.url(path), json=body))
    return response.code, json.loads(await sim.stub.content(response))


def fired(d: Deferred[Any]) -> list[object]:
    """Becomes non-empty once ``d`` has a result (``Deferred.called`` is also true while a
    chained Deferred is still waiting)."""
    results: list[object] = []
    d.addBoth(lambda result: results.append(result))
    return results


async def get(sim: SimHarness, path: str) -> tuple[int, Any]:
    response = await sim.settle(sim.stub.get(sim.url(path)))
    return response.code, json.loads(await sim.stub.content(response))


async def stream(sim: SimHarness, path: str, body: object) -> list[tuple[float, str]]:
    """(arrival time, payload) of every SSE ``data:`` frame."""
    response = await sim.settle(sim.stub.post(sim.url(path), json=body, unbuffered=True))
    assert response.code == 200
    assert response.headers.getRawHeaders("content-type") == ["text/event-stream"]
    frames: list[tuple[float, str]] = []

    def collect(data: bytes) -> None:
        for frame in data.decode().split("\n\n"):
            if frame:
                assert frame.startswith("data: ")
                frames.append((sim.clock.seconds(), frame[len("data: "):]))

    await sim.settle(sim.stub.collect(response, collect))
    return frames


@pytest_twisted.ensureDeferred
async def test_answers_503_loading_model_until_load_ms_then_ready(weights: Path) -> None:
    sim = make(weights, loaded=False)
    sim.start()
    for path in ("/health", "/v1/models", "/props"):
        code, body = await get(sim, path)
        assert (code, body) == (503, {"error": {"code": 503, "message": "Loading model",
                                                "type": "unavailable_error"}})
    code, _ = await post(sim, "/v1/chat/completions", CHAT)
    assert code == 503
    assert "model loaded" not in sim.out.getvalue()
    sim.advance(0.499)
    assert (await get(sim, "/health"))[0] == 503
    sim.advance(0.001)
    assert await get(sim, "/health") == (200, {"status": "ok"})
    assert sim.out.getvalue().splitlines() == ["model loaded"]


@pytest_twisted.ensureDeferred
async def test_models_and_props_describe_the_loaded_model(weights: Path, tmp_path: Path) -> None:
    sim = make(weights, "-np", "3", "-c", "48")
    code, models = await get(sim, "/v1/models")
    assert code == 200 and models["object"] == "list"
    (entry,) = models["data"]
    assert (entry["id"], entry["object"], entry["owned_by"]) == ("llama-a.sim.json", "model", "llamacpp")
    assert entry["meta"]["n_ctx_train"] == 64
    assert entry["meta"]["n_ctx"] == 64  # one slot's context, padded to 256 then capped at the training one
    _, props = await get(sim, "/props")
    assert props["default_generation_settings"]["n_ctx"] == 64
    assert props["total_slots"] == 3
    big = write_weights(tmp_path / "big.sim.json", "text", "big", context=2048)
    _, split = await get(make(big, "-np", "2", "-c", "1024"), "/props")
    assert (split["default_generation_settings"]["n_ctx"], split["total_slots"]) == (512, 2)
    assert props["model_path"] == str(weights)
    aliased = make(weights, "-a", "my-llama")
    assert (await get(aliased, "/v1/models"))[1]["data"][0]["id"] == "my-llama"


@pytest_twisted.ensureDeferred
async def test_chat_completion_takes_prompt_plus_generation_time_and_reports_usage(weights: Path) -> None:
    sim = make(weights)
    started = sim.clock.seconds()
    code, body = await post(sim, "/v1/chat/completions", CHAT)
    assert sim.clock.seconds() - started == pytest.approx(JOB_S)
    assert code == 200
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["model"] == "client-model"
    (choice,) = body["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] == "length"
    assert choice["message"]["role"] == "assistant"
    assert len(choice["message"]["content"].split()) == 4
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    assert isinstance(body["created"], int)


@pytest_twisted.ensureDeferred
async def test_chat_counts_words_of_all_messages_and_text_parts(weights: Path) -> None:
    sim = make(weights)
    body = {"messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "three more words"}]},
        {"role": "assistant", "content": None},
    ], "max_tokens": 1}
    code, answer = await post(sim, "/v1/chat/completions", body)
    assert code == 200 and answer["usage"]["prompt_tokens"] == 5
    assert answer["model"] == "llama-a.sim.json"  # no model in the request: the served name


@pytest_twisted.ensureDeferred
async def test_answers_are_deterministic_per_weights_and_input(weights: Path, tmp_path: Path) -> None:
    sim = make(weights)
    first = (await post(sim, "/v1/chat/completions", CHAT))[1]["choices"][0]["message"]["content"]
    again = (await post(sim, "/v1/chat/completions", CHAT))[1]["choices"][0]["message"]["content"]
    assert first == again
    other_weights = write_weights(tmp_path / "llama-b.sim.json", "text", "llama-b",
                                  prompt_tokens_per_s=100, gen_tokens_per_s=10)
    other = make(other_weights)
    changed = (await post(other, "/v1/chat/completions", CHAT))[1]["choices"][0]["message"]["content"]
    assert changed != first


@pytest_twisted.ensureDeferred
async def test_ollama_num_predict_and_llama_n_predict_set_the_answer_length(weights: Path) -> None:
    sim = make(weights)
    body = {"messages": [{"role": "user", "content": "hi"}], "options": {"num_predict": 3}}
    assert (await post(sim, "/v1/chat/completions", body))[1]["usage"]["completion_tokens"] == 3
    body = {"messages": [{"role": "user", "content": "hi"}], "n_predict": 2}
    assert (await post(sim, "/v1/chat/completions", body))[1]["usage"]["completion_tokens"] == 2
    body = {"messages": [{"role": "user", "content": "hi"}]}
    assert (await post(sim, "/v1/chat/completions", body))[1]["usage"]["completion_tokens"] == 16


@pytest_twisted.ensureDeferred
async def test_chat_stream_sends_role_then_one_chunk_per_token_over_time_then_timings_and_done(
    weights: Path,
) -> None:
    sim = make(weights)
    start = sim.clock.seconds()
    frames = await stream(sim, "/v1/chat/completions", {**CHAT, "stream": True})
    assert frames[-1][1] == "[DONE]"
    chunks = [(t - start, json.loads(data)) for t, data in frames[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for _, c in chunks)
    assert chunks[0][1]["choices"][0]["delta"]["role"] == "assistant"
    token_chunks = chunks[1:-1]
    assert len(token_chunks) == 4
    times = [t for t, _ in token_chunks]
    assert times == pytest.approx([0.15, 0.25, 0.35, 0.45])  # prompt 0.05 s, then 0.1 s a token
    text = "".join(c["choices"][0]["delta"]["content"] for _, c in token_chunks)
    final = chunks[-1][1]
    assert final["choices"][0]["finish_reason"] == "length" and final["choices"][0]["delta"] == {}
    assert "usage" not in final  # llama-server sends usage only when asked (stream_options.include_usage)
    assert (final["timings"]["prompt_n"], final["timings"]["predicted_n"]) == (5, 4)
    plain = await post(sim, "/v1/chat/completions", CHAT)
    assert plain[1]["choices"][0]["message"]["content"] == text


@pytest_twisted.ensureDeferred
async def test_chat_stream_with_include_usage_ends_with_a_usage_chunk_without_choices(weights: Path) -> None:
    frames = await stream(make(weights), "/v1/chat/completions",
                          {**CHAT, "stream": True, "stream_options": {"include_usage": True}})
    *chunks, usage, done = [data for _t, data in frames]
    assert done == "[DONE]"
    finishing = json.loads(chunks[-1])
    assert finishing["choices"][0]["finish_reason"] == "length" and "usage" not in finishing
    last = json.loads(usage)
    assert last["choices"] == [] and last["object"] == "chat.completion.chunk"
    assert last["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    assert last["timings"]["predicted_n"] == 4


@pytest_twisted.ensureDeferred
async def test_text_completions_plain_and_streamed(weights: Path) -> None:
    sim = make(weights)
    code, body = await post(sim, "/v1/completions", {"prompt": PROMPT, "max_tokens": 4})
    assert code == 200 and body["object"] == "text_completion"
    assert len(body["choices"][0]["text"].split()) == 4
    assert body["usage"]["prompt_tokens"] == 5
    frames = await stream(sim, "/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "stream": True})
    assert frames[-1][1] == "[DONE]"
    chunks = [json.loads(data) for _, data in frames[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == body["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and "usage" in chunks[-1]


@pytest_twisted.ensureDeferred
async def test_native_completion_plain_and_streamed(weights: Path) -> None:
    sim = make(weights)
    code, body = await post(sim, "/completion", {"prompt": PROMPT, "n_predict": 4})
    assert code == 200
    assert (body["stop"], body["tokens_predicted"], body["tokens_evaluated"]) == (True, 4, 5)
    assert len(body["content"].split()) == 4 and body["model"] == "llama-a.sim.json"
    frames = await stream(sim, "/completion", {"prompt": PROMPT, "n_predict": 4, "stream": True})
    chunks = [json.loads(data) for _, data in frames]  # no [DONE] on the native route
    assert [c["stop"] for c in chunks] == [False] * 4 + [True]
    assert "".join(c["content"] for c in chunks) == body["content"]


async def finish_times(sim: SimHarness, count: int) -> list[float]:
    """Send ``count`` chats at once; each one's answer time, in sending order."""
    start = sim.clock.seconds()
    finished: dict[int, float] = {}

    def note(response: Any, index: int) -> Any:
        finished[index] = sim.clock.seconds() - start
        return response

    pending = [
        sim.stub.post(sim.url("/v1/chat/completions"), json=CHAT).addCallback(note, i)
        for i in range(count)
    ]
    sim.flush()
    assert sim.runtime.counters.running == min(sim.runtime.total_slots, count)
    assert sim.runtime.counters.waiting == count - min(sim.runtime.total_slots, count)
    for d in pending:
        await sim.settle(d)
    return [finished[i] for i in range(count)]


@pytest.mark.parametrize(
    ("parallel", "job_multiples"), [(1, [1, 2, 3]), (2, [1, 1, 2]), (3, [1, 1, 1])]
)
@pytest_twisted.ensureDeferred
async def test_parallel_slots_run_n_jobs_at_once_and_queue_the_rest_fifo(
    weights: Path, parallel: int, job_multiples: list[int]
) -> None:
    sim = make(weights, "-np", str(parallel))
    times = await finish_times(sim, 3)
    assert times == pytest.approx([n * JOB_S for n in job_multiples])


@pytest_twisted.ensureDeferred
async def test_a_prompt_that_fills_the_slot_is_refused_and_generation_stops_at_its_end(weights: Path) -> None:
    """As llama-server: 400 only when the prompt alone reaches the slot's context (64 tokens here); a
    request that fits generates up to the slot's end, fewer tokens than asked."""
    sim = make(weights)
    code, body = await post(sim, "/completion", {"prompt": " ".join(["w"] * 64), "n_predict": 1})
    assert code == 400
    assert body["error"]["type"] == "exceed_context_size_error"
    assert body["error"]["message"] == ("request (64 tokens) exceeds the available context size (64 tokens), "
                                        "try increasing it")
    assert (body["error"]["n_prompt_tokens"], body["error"]["n_ctx"]) == (64, 64)
    code, body = await post(sim, "/v1/chat/completions", {**CHAT, "max_tokens": 60})  # 5 + 60 > 64
    assert code == 200 and body["usage"]["completion_tokens"] == 59
    assert body["choices"][0]["finish_reason"] == "length"


@pytest_twisted.ensureDeferred
async def test_image_parts_need_mmproj(weights: Path) -> None:
    body = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    ]}], "max_tokens": 2}
    code, answer = await post(make(weights), "/v1/chat/completions", body)
    assert code == 500
    assert answer["error"] == {
        "code": 500, "type": "server_error",
        "message": "image input is not supported - hint: if this is unexpected, you may need to "
                   "provide the mmproj"}
    code, answer = await post(make(weights, "--mmproj", "proj.gguf"), "/v1/chat/completions", body)
    assert code == 200 and answer["usage"]["prompt_tokens"] == 3


@pytest_twisted.ensureDeferred
async def test_no_mmproj_refuses_images_even_with_a_projector_given(weights: Path) -> None:
    """``--no-mmproj`` (a real llama-server flag) wins over ``--mmproj``: images are refused with
    llama-server's message, the case guardian models fall back on."""
    body = {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}], "max_tokens": 2}
    sim = make(weights, "--mmproj", "proj.gguf", "--no-mmproj")
    code, answer = await post(sim, "/v1/chat/completions", body)
    assert code == 500 and answer["error"]["message"].startswith("image input is not supported")


@pytest_twisted.ensureDeferred
async def test_embeddings_need_the_flag_and_give_unit_vectors(weights: Path) -> None:
    code, body = await post(make(weights), "/v1/embeddings", {"input": "x"})
    assert code == 501 and body["error"]["type"] == "not_supported_error"
    sim = make(weights, "--embedding")
    start = sim.clock.seconds()
    code, body = await post(sim, "/v1/embeddings", {"input": ["a b", "c d e"], "model": "m"})
    assert sim.clock.seconds() - start == pytest.approx(0.05)  # 5 prompt tokens at 100/s
    assert code == 200 and body["object"] == "list"
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert all(d["object"] == "embedding" and len(d["embedding"]) == 6 for d in body["data"])
    assert sum(v * v for v in body["data"][0]["embedding"]) == pytest.approx(1.0)
    assert body["usage"] == {"prompt_tokens": 5, "total_tokens": 5}
    single = (await post(sim, "/v1/embeddings", {"input": "a b"}))[1]["data"]
    assert single[0]["embedding"] == body["data"][0]["embedding"]
    encoded = (await post(sim, "/v1/embeddings", {"input": "a b", "encoding_format": "base64"}))[1]
    floats = struct.unpack("<6f", base64.b64decode(encoded["data"][0]["embedding"]))
    assert floats == pytest.approx(body["data"][0]["embedding"], abs=1e-6)
    assert (await post(sim, "/v1/embeddings", {"input": 5}))[0] == 400


@pytest_twisted.ensureDeferred
async def test_bad_requests_get_400_in_the_llama_error_shape(weights: Path) -> None:
    sim = make(weights)
    response = await sim.settle(sim.stub.post(sim.url("/v1/chat/completions"), data=b"{not json"))
    body = json.loads(await sim.stub.content(response))
    assert response.code == 400
    assert set(body["error"]) >= {"code", "message", "type"} and body["error"]["code"] == 400
    assert (await post(sim, "/v1/chat/completions", {"messages": []}))[0] == 400
    assert (await post(sim, "/v1/chat/completions", ["not", "an", "object"]))[0] == 400
    assert (await post(sim, "/v1/completions", {"max_tokens": 1}))[0] == 400
    code, body = await get(sim, "/no/such/route")
    assert code == 404 and body["error"]["code"] == 404


@pytest_twisted.ensureDeferred
async def test_client_disconnect_mid_stream_stops_generation_and_frees_the_slot(weights: Path) -> None:
    sim = make(weights, "-np", "1")
    start = sim.clock.seconds()
    long_chat = {**CHAT, "max_tokens": 40, "stream": True}  # would hold the slot for 4.05 s
    response = await sim.settle(sim.stub.post(sim.url("/v1/chat/completions"), json=long_chat,
                                              unbuffered=True))
    seen: list[bytes] = []

    def hang_up_after_two_tokens(data: bytes) -> None:
        seen.append(data)
        if len(seen) >= 3:
            raise RuntimeError("client goes away")

    collecting = sim.stub.collect(response, hang_up_after_two_tokens)
    waiting = sim.stub.post(sim.url("/v1/chat/completions"), json=CHAT)
    sim.flush()
    assert sim.runtime.counters.waiting == 1
    with pytest.raises(RuntimeError):
        await sim.settle(collecting)
    gone_at = sim.clock.seconds() - start
    assert gone_at == pytest.approx(0.25)  # role frame at 0.05, tokens at 0.15 and 0.25
    sim.flush()
    assert sim.runtime.counters.running == 1 and sim.runtime.counters.waiting == 0
    await sim.settle(waiting)
    assert sim.clock.seconds() - start == pytest.approx(gone_at + JOB_S)
    assert sim.runtime.counters.in_flight == 0
    assert sim.runtime.counters.requests_served == 1  # the dropped stream was not served


@pytest_twisted.ensureDeferred
async def test_crash_after_n_requests_exits_with_code_3(weights: Path) -> None:
    sim = make(weights, "--sim-crash-after", "2")
    assert (await post(sim, "/v1/chat/completions", CHAT))[0] == 200
    assert (await get(sim, "/health"))[0] == 200  # health checks are not counted
    assert sim.exit_codes == []
    assert (await post(sim, "/v1/chat/completions", CHAT))[0] == 200
    assert sim.exit_codes == [3]
    assert "simulated crash" in sim.err.getvalue()
    late = fired(sim.stub.get(sim.url("/health")))
    sim.advance(60)
    assert not late  # a dying process answers nothing more


def test_crash_after_zero_exits_right_after_the_load(weights: Path) -> None:
    sim = make(weights, "--sim-crash-after", "0", loaded=False)
    sim.start()
    sim.advance(0.5)
    assert sim.exit_codes == [3]
    assert sim.out.getvalue().splitlines() == ["model loaded"]


@pytest_twisted.ensureDeferred
async def test_fail_load_exits_1_after_load_ms_and_answers_503_meanwhile(weights: Path) -> None:
    sim = make(weights, "--sim-fail-load", loaded=False)
    sim.start()
    assert (await get(sim, "/health"))[0] == 503
    sim.advance(0.49)
    assert sim.exit_codes == []
    sim.advance(0.01)
    assert sim.exit_codes == [1]
    assert "failed to load model" in sim.err.getvalue()
    assert "model loaded" not in sim.out.getvalue()


@pytest_twisted.ensureDeferred
async def test_time_scale_multiplies_load_and_job_durations(weights: Path) -> None:
    sim = make(weights, "--sim-time-scale", "0.5", loaded=False)
    sim.start()
    sim.advance(0.25)
    assert not sim.runtime.loading
    start = sim.clock.seconds()
    await post(sim, "/v1/chat/completions", CHAT)
    assert sim.clock.seconds() - start == pytest.approx(JOB_S * 0.5)


@pytest_twisted.ensureDeferred
async def test_control_reports_knobs_and_counters_and_changes_slowdown_live(weights: Path) -> None:
    sim = make(weights, "--sim-slowdown", "2")
    code, state = await get(sim, "/sim/control")
    assert code == 200
    assert (state["slowdown"], state["hang"], state["crash_after"], state["fail_next_load"]) == (
        2.0, False, None, False)
    assert (state["requests_served"], state["in_flight"], state["family"]) == (0, 0, "llama-server")
    start = sim.clock.seconds()
    await post(sim, "/v1/chat/completions", CHAT)
    assert sim.clock.seconds() - start == pytest.approx(2 * JOB_S)
    code, state = await post(sim, "/sim/control", {"slowdown": 0.5})
    assert code == 200 and state["slowdown"] == 0.5 and state["requests_served"] == 1
    start = sim.clock.seconds()
    await post(sim, "/v1/chat/completions", CHAT)
    assert sim.clock.seconds() - start == pytest.approx(0.5 * JOB_S)
    code, body = await post(sim, "/sim/control", {"slowdown": "fast"})
    assert code == 400 and "slowdown" in body["error"]["message"]


@pytest_twisted.ensureDeferred
async def test_hang_accepts_requests_but_never_answers_until_switched_off(weights: Path) -> None:
    sim = make(weights)
    await post(sim, "/sim/control", {"hang": True})
    hung = fired(sim.stub.post(sim.url("/v1/chat/completions"), json=CHAT))
    health = fired(sim.stub.get(sim.url("/health")))
    sim.advance(600)
    assert not hung and not health
    assert sim.runtime.counters.in_flight == 1 and sim.runtime.counters.running == 0
    code, state = await get(sim, "/sim/control")  # control still answers
    assert code == 200 and state["hang"] is True
    await post(sim, "/sim/control", {"hang": False})
    assert (await post(sim, "/v1/chat/completions", CHAT))[0] == 200
    assert not hung


@pytest_twisted.ensureDeferred
async def test_control_crash_after_zero_exits_at_once(weights: Path) -> None:
    sim = make(weights)
    code, _ = await post(sim, "/sim/control", {"crash_after": 0})
    assert code == 200
    sim.advance(0)
    assert sim.exit_codes == [3]


@pytest_twisted.ensureDeferred
async def test_sim_hang_flag_hangs_from_the_start(weights: Path) -> None:
    sim = make(weights, "--sim-hang", loaded=False)
    sim.start()
    sim.advance(1)
    health = fired(sim.stub.get(sim.url("/health")))
    sim.advance(60)
    assert not health
