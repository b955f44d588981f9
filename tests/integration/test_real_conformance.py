"""The simulator answers as the real servers do: one battery of requests sent to llama.cpp's
``llama-server`` and to ``routerd-sim llama-server`` (and to whisper.cpp's ``whisper-server`` and
``routerd-sim whisper-server``), compared by status, content type, JSON key sets and value types, and stream
framing (:mod:`tests.integration.conformance`).

Each check lists the departures it allows, each with why it cannot matter to routerd.  The values routerd
does read are compared too where both servers must agree on them: the per-slot context (``-c`` split over
``-np``) in ``/props``, ``/slots`` and ``/v1/models``, the context-overflow answer and where generation stops.

Departures left on purpose (values, not shapes, are what the servers differ in otherwise):

* the answers' text and token counts: the simulator's weights say words drawn from their label, the tiny GGUF
  its one sentence; the simulator counts a word as a token (the real tokenizer splits punctuation too), never
  stops early (``finish_reason`` "length", never "stop") and has no prompt cache (``cached_tokens`` 0);
* the ``model`` an answer names: llama-server names itself (its ``-a`` alias, else the ``-m`` path as given),
  the simulator echoes the request's ``model``; routerd rewrites ``model`` in every answer it relays;
* sampler settings (``generation_settings``, ``params``): the simulator has no sampler;
* an unknown path asked while llama-server loads: 503 "Loading model" there, 404 from the simulator (which
  routes before it checks the load); routerd asks only the routes it knows;
* headers other than Content-Type (llama-server's ``X-Accel-Buffering``, Content-Length vs chunked);
* tool calls (:data:`TOOLS_BATTERY`, against the tool-calling tiny GGUF, whose template knows tools): the
  arguments' values (the GGUF always calls ``get_weather`` with ``{"city": "Paris"}``, the simulator fills
  the schema with its words) and when a call is made unforced (the GGUF always calls; the simulator only
  when the user's text names the tool, :mod:`routerd.sim.tools`), so every row forces the call; both stream
  the arguments in two pieces here;
* whisper-server's ``verbose_json`` language detection (``detected_language``, ``language_probabilities``):
  meaningless for the English-only tiny model, filled in by the simulator with the requested language.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from routerd.sim.wav import make_wav
from routerd.sim.weights import write_weights
from routerd.telemetry.counters import parse_llama_metrics
from tests.integration.conformance import Answer, Check, Probe, Running, differences, free_port, start_server
from tests.integration.real_backends import RealServers, TinyModels

pytestmark = [pytest.mark.slow, pytest.mark.real]

SIM = [sys.executable, "-m", "routerd.sim"]
#: ``-c 512 -np 2``: two slots of 256 tokens each (llama-server splits the context over the slots).
CONTEXT = ("-c", "512", "-np", "2")
SLOT_CONTEXT = 256
#: The tiny GGUF's training context; the simulator's weights say the same.
TRAIN_CONTEXT = 2048

CHAT = {"messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 4}
IMAGE_CHAT = {"messages": [{"role": "user", "content": [
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}
MESSAGES = {"messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 4}
RESPONSES = {"input": "Say hello", "max_output_tokens": 4}
RERANK = {"query": "tiny", "documents": ["a tiny model", "a large one"]}
#: More tokens than a 256-token slot holds, by either server's count (the simulator counts words).
LONG_PROMPT = " ".join(["tiny"] * 300)

#: The sampler settings llama-server echoes back; the simulator has no sampler (routerd reads none of them).
SAMPLER = {
    "$.generation_settings.*": "sampler settings echoed back; routerd reads none of them",
}

LLAMA_BATTERY: list[Check] = [
    Check("health", Probe("GET", "/health")),
    Check("models", Probe("GET", "/v1/models"), {
        "$.data[].meta.weights": "the simulator's weights label: tests tell which weights answered by it",
    }),
    Check("props", Probe("GET", "/props"), {
        "$.default_generation_settings.params.*": "sampler defaults; routerd reads n_ctx and total_slots",
        "$.chat_template_caps.*": "template capabilities; routerd sends plain messages",
    }),
    Check("metrics without --metrics", Probe("GET", "/metrics")),
    Check("chat", Probe("POST", "/v1/chat/completions", CHAT)),
    Check("chat stream", Probe("POST", "/v1/chat/completions", {**CHAT, "stream": True})),
    Check("chat stream with usage", Probe("POST", "/v1/chat/completions", {
        **CHAT, "stream": True, "stream_options": {"include_usage": True}})),
    Check("completions", Probe("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 4})),
    Check("completions stream", Probe("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 4,
                                                                  "stream": True})),
    Check("completions stream with usage", Probe("POST", "/v1/completions", {
        "prompt": "Hi", "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}})),
    Check("native completion", Probe("POST", "/completion", {"prompt": "Hi", "n_predict": 4}), SAMPLER),
    Check("native completion stream", Probe("POST", "/completion", {"prompt": "Hi", "n_predict": 4,
                                                                    "stream": True}), SAMPLER),
    Check("tokenize", Probe("POST", "/tokenize", {"content": "Hello, I am a tiny test model."})),
    Check("tokenize with pieces", Probe("POST", "/tokenize", {"content": "Hello, I", "with_pieces": True})),
    Check("detokenize", Probe("POST", "/detokenize", {"tokens": [1, 2]})),
    Check("apply template", Probe("POST", "/apply-template", CHAT)),
    Check("embeddings off", Probe("POST", "/v1/embeddings", {"input": ["Hello", "tiny test"]})),
    Check("bad JSON", Probe("POST", "/v1/chat/completions", raw=b"{bad json")),
    Check("no messages", Probe("POST", "/v1/chat/completions", {})),
    Check("context overflow", Probe("POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": LONG_PROMPT}], "max_tokens": 4})),
    Check("context overflow, native", Probe("POST", "/completion", {"prompt": LONG_PROMPT, "n_predict": 4})),
    Check("unknown route", Probe("GET", "/no/such/route")),
    Check("wrong method", Probe("GET", "/v1/chat/completions")),
    Check("chat without v1", Probe("POST", "/chat/completions", CHAT)),
    Check("completions without v1", Probe("POST", "/completions", {"prompt": "Hi", "n_predict": 4}), SAMPLER),
    Check("models without v1", Probe("GET", "/models"), {
        "$.data[].meta.weights": "the simulator's weights label: tests tell which weights answered by it",
    }),
    Check("health with v1", Probe("GET", "/v1/health")),
    Check("image without a projector", Probe("POST", "/v1/chat/completions", IMAGE_CHAT)),
    # the APIs llama-server speaks itself (routed by routerd as they are: routerd.routing.plan)
    Check("messages", Probe("POST", "/v1/messages", MESSAGES)),
    Check("messages with a system prompt and blocks", Probe("POST", "/v1/messages", {
        **MESSAGES, "system": "Be brief.", "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Say hello"}]}]})),
    Check("messages stream", Probe("POST", "/v1/messages", {**MESSAGES, "stream": True})),
    Check("messages without messages", Probe("POST", "/v1/messages", {"max_tokens": 4})),
    Check("count tokens", Probe("POST", "/v1/messages/count_tokens", {"messages": MESSAGES["messages"]})),
    Check("count tokens without messages", Probe("POST", "/v1/messages/count_tokens", {})),
    Check("responses", Probe("POST", "/v1/responses", RESPONSES)),
    Check("responses with items and instructions", Probe("POST", "/v1/responses", {
        **RESPONSES, "instructions": "Be brief.",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Say hello"}]}]})),
    Check("responses stream", Probe("POST", "/v1/responses", {**RESPONSES, "stream": True})),
    Check("responses without input", Probe("POST", "/v1/responses", {"max_output_tokens": 4})),
    Check("responses continuing a stored one", Probe("POST", "/v1/responses", {
        **RESPONSES, "previous_response_id": "resp_1"})),
    Check("rerank without --reranking", Probe("POST", "/v1/rerank", RERANK)),
]

#: A tool with a required and an optional property (llama-server's grammar and the simulator both fill the
#: required one only).
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
           "required": ["city"]}
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                                "parameters": WEATHER}}]
MESSAGES_TOOLS = [{"name": "get_weather", "description": "Weather of a city", "input_schema": WEATHER}]
RESPONSES_TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather of a city",
                    "parameters": WEATHER}]
ASK_WEATHER = [{"role": "user", "content": "Weather in Paris?"}]
TOOL_CHAT = {"messages": ASK_WEATHER, "tools": CHAT_TOOLS, "tool_choice": "required", "max_tokens": 64}
TOOL_MESSAGES = {"messages": ASK_WEATHER, "tools": MESSAGES_TOOLS, "tool_choice": {"type": "any"},
                 "max_tokens": 64}
TOOL_RESPONSES = {"input": "Weather in Paris?", "tools": RESPONSES_TOOLS, "tool_choice": "required",
                  "max_output_tokens": 64}
#: What llama-server b11434 answers with tools (a template that knows them; otherwise it ignores ``tools``),
#: observed on the tool-calling tiny GGUF and held here: chat ``tool_calls [{type, function {name,
#: arguments: str}, id}]`` with ``content: ""`` and ``finish_reason: "tool_calls"``, streamed as a chunk
#: naming the call then argument pieces; Messages ``tool_use`` blocks (``stop_reason: "tool_use"``; streamed
#: ``content_block_start {type, id, name}`` with no ``input``, then ``input_json_delta``); Responses
#: ``function_call`` items (``fc_…`` id, ``call_…`` call_id; streamed ``output_item.added``,
#: ``function_call_arguments.delta`` and no ``….done``).  b11434 reads a chat ``tool_choice`` only as a
#: string (an object is logged as the wrong type and taken as "auto"); Messages' ``{"type": "tool"}`` and
#: Responses' ``{"type": "function"}`` are honoured.  Tool results (``role: tool``, ``tool_result``,
#: ``function_call_output``) are accepted as input by both.
TOOLS_BATTERY: list[Check] = [
    Check("chat tool call", Probe("POST", "/v1/chat/completions", TOOL_CHAT)),
    Check("chat tool call stream", Probe("POST", "/v1/chat/completions", {**TOOL_CHAT, "stream": True})),
    Check("chat after a tool result", Probe("POST", "/v1/chat/completions", {**TOOL_CHAT, "messages": [
        *ASK_WEATHER, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]})),
    Check("messages tool_use", Probe("POST", "/v1/messages", TOOL_MESSAGES)),
    Check("messages named tool", Probe("POST", "/v1/messages", {
        **TOOL_MESSAGES, "tool_choice": {"type": "tool", "name": "get_weather"}})),
    Check("messages tool_use stream", Probe("POST", "/v1/messages", {**TOOL_MESSAGES, "stream": True})),
    Check("messages after a tool_result", Probe("POST", "/v1/messages", {**TOOL_MESSAGES, "messages": [
        *ASK_WEATHER,
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": "sunny"}]}]})),
    Check("responses function_call", Probe("POST", "/v1/responses", TOOL_RESPONSES)),
    Check("responses named function", Probe("POST", "/v1/responses", {
        **TOOL_RESPONSES, "tool_choice": {"type": "function", "name": "get_weather"}})),
    Check("responses function_call stream", Probe("POST", "/v1/responses", {
        **TOOL_RESPONSES, "stream": True})),
    Check("responses after a function_call_output", Probe("POST", "/v1/responses", {
        **TOOL_RESPONSES, "input": [
        *ASK_WEATHER,
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": "{\"city\": \"Paris\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}]})),
]

#: The rerank routes of a llama-server started with ``--reranking`` (scores are the model's: values differ).
RERANK_BATTERY: list[Check] = [
    Check("rerank", Probe("POST", "/v1/rerank", RERANK)),
    Check("rerank without v1", Probe("POST", "/rerank", RERANK)),
    Check("rerank top_n", Probe("POST", "/v1/rerank", {**RERANK, "top_n": 1})),
]

EMBEDDINGS_BATTERY: list[Check] = [
    Check("embeddings", Probe("POST", "/v1/embeddings", {"input": ["Hello", "tiny test"]})),
    Check("one embedding", Probe("POST", "/v1/embeddings", {"input": "Hello"})),
    Check("base64 embedding",
          Probe("POST", "/v1/embeddings", {"input": "Hello", "encoding_format": "base64"})),
    Check("native embedding", Probe("POST", "/embedding", {"content": ["Hello", "a b"]})),
    Check("input beyond the slot", Probe("POST", "/v1/embeddings", {"input": LONG_PROMPT})),
    Check("no input", Probe("POST", "/v1/embeddings", {})),
    Check("models", Probe("GET", "/v1/models"), {
        "$.data[].meta.weights": "the simulator's weights label: tests tell which weights answered by it",
    }),
    Check("chat on an embedding model", Probe("POST", "/v1/chat/completions", CHAT)),
]

TONE = make_wav(2.0, rate=16000)
WHISPER_BATTERY: list[Check] = [
    Check("health", Probe("GET", "/health")),
    Check("json", Probe("POST", "/inference", form={"file": TONE, "response_format": b"json"})),
    Check("text", Probe("POST", "/inference", form={"file": TONE, "response_format": b"text"})),
    Check("verbose json",
          Probe("POST", "/inference", form={"file": TONE, "response_format": b"verbose_json"}),
          {"$.language_probabilities.*": "a key per language the model finds likely: routerd reads text"}),
    Check("srt", Probe("POST", "/inference", form={"file": TONE, "response_format": b"srt"})),
    Check("vtt", Probe("POST", "/inference", form={"file": TONE, "response_format": b"vtt"})),
    Check("no file", Probe("POST", "/inference", form={"response_format": b"json"})),
    Check("not audio", Probe("POST", "/inference", form={"file": b"not a wav file"})),
    Check("unknown route", Probe("GET", "/no/such/route")),
    Check("load without a model", Probe("POST", "/load", form={"other": b"x"})),
    Check("load of a missing file", Probe("POST", "/load", form={"model": b"/no/such/model.bin"})),
]


#: Asked of a llama pair as soon as both are ready, before any request has used a slot.
FRESH = Probe("GET", "/slots")
#: Asked of a llama-server while it loads its model (routerd's readiness probe reads ``/v1/models``).
WHILE_LOADING = (Probe("GET", "/v1/models"), Probe("GET", "/props"), Probe("GET", "/slots"),
                 Probe("POST", "/tokenize", {"content": "Hi"}), Probe("POST", "/v1/chat/completions", CHAT))


def _pair(real: list[str], sim: list[str], folder: Path) -> Iterator[tuple[Running, Running]]:
    real_port, sim_port = free_port(), free_port()
    real_server = start_server([*real, "--host", "127.0.0.1", "--port", str(real_port)], real_port,
                               folder / "real.log")
    try:
        sim_server = start_server([*sim, "--host", "127.0.0.1", "--port", str(sim_port)], sim_port,
                                  folder / "sim.log", WHILE_LOADING if "llama-server" in sim else ())
        try:
            if "llama-server" in sim:
                real_server.fresh, sim_server.fresh = real_server.ask(FRESH), sim_server.ask(FRESH)
            yield real_server, sim_server
        finally:
            sim_server.stop()
    finally:
        real_server.stop()


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Simulator weights shaped like the tiny GGUF (its training context and embedding width); the load takes
    long enough to be seen answering "loading"."""
    folder = tmp_path_factory.mktemp("sim-weights")
    write_weights(folder / "tiny.sim.json", "text", "tiny-sim", load_ms=200, context=TRAIN_CONTEXT,
                  embedding_dim=64)
    write_weights(folder / "whisper.sim.json", "stt", "whisper-sim", load_ms=200)
    return folder


@pytest.fixture(scope="module")
def llama(real_servers: RealServers, tiny_models: TinyModels, weights: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, Running]]:
    yield from _pair([real_servers.llama, "-m", tiny_models.tiny, *CONTEXT, "-t", "1"],
                     [*SIM, "llama-server", "-m", str(weights / "tiny.sim.json"), *CONTEXT, "-t", "1"],
                     tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def embedder(real_servers: RealServers, tiny_models: TinyModels, weights: Path,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, Running]]:
    """Started as routerd starts an ``embeddingsmodel``: ``--embeddings`` (the GGUF says mean pooling)."""
    yield from _pair([real_servers.llama, "-m", tiny_models.embed, "--embeddings", *CONTEXT, "-t", "1"],
                     [*SIM, "llama-server", "-m", str(weights / "tiny.sim.json"), "--embeddings", *CONTEXT],
                     tmp_path_factory.mktemp("embed"))


@pytest.fixture(scope="module")
def reranker(real_servers: RealServers, tiny_models: TinyModels, weights: Path,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, Running]]:
    """Started as a model config with ``--reranking`` in its ``extra_args`` starts it."""
    yield from _pair([real_servers.llama, "-m", tiny_models.tiny, "--reranking", *CONTEXT, "-t", "1"],
                     [*SIM, "llama-server", "-m", str(weights / "tiny.sim.json"), "--reranking", *CONTEXT],
                     tmp_path_factory.mktemp("rerank"))


@pytest.fixture(scope="module")
def tool_caller(real_servers: RealServers, tiny_models: TinyModels, weights: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, Running]]:
    """The tool-calling GGUF (its tools prompt is ~570 tokens: one slot of 2048)."""
    yield from _pair([real_servers.llama, "-m", tiny_models.tools, "-c", "2048", "-np", "1", "-t", "1"],
                     [*SIM, "llama-server", "-m", str(weights / "tiny.sim.json"), "-c", "2048", "-np", "1"],
                     tmp_path_factory.mktemp("tools"))


@pytest.fixture(scope="module")
def whisper(real_servers: RealServers, tiny_models: TinyModels, weights: Path,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, Running]]:
    yield from _pair([real_servers.whisper, "-m", tiny_models.whisper, "-t", "1"],
                     [*SIM, "whisper-server", "-m", str(weights / "whisper.sim.json")],
                     tmp_path_factory.mktemp("whisper"))


def assert_conforms(check: Check, pair: tuple[Running, Running]) -> tuple[Answer, Answer]:
    real, sim = (server.ask(check.probe) for server in pair)
    found = differences(real, sim, check.allowed)
    assert not found, f"{check.name}: the simulator departs from the real server:\n" + "\n".join(found)
    return real, sim


@pytest.mark.parametrize("check", LLAMA_BATTERY, ids=lambda check: check.name)
def test_the_simulated_llama_server_answers_each_request_as_the_real_one(
        check: Check, llama: tuple[Running, Running]) -> None:
    assert_conforms(check, llama)


@pytest.mark.parametrize("check", TOOLS_BATTERY, ids=lambda check: check.name)
def test_the_simulated_llama_server_answers_tool_calls_as_the_real_one(
        check: Check, tool_caller: tuple[Running, Running]) -> None:
    real, sim = assert_conforms(check, tool_caller)
    assert real.status == 200, real.body


@pytest.mark.parametrize("check", RERANK_BATTERY, ids=lambda check: check.name)
def test_the_simulated_reranker_answers_as_the_real_one(check: Check,
                                                        reranker: tuple[Running, Running]) -> None:
    assert_conforms(check, reranker)


@pytest.mark.parametrize("check", EMBEDDINGS_BATTERY, ids=lambda check: check.name)
def test_the_simulated_embeddings_server_answers_as_the_real_one(
        check: Check, embedder: tuple[Running, Running]) -> None:
    assert_conforms(check, embedder)


@pytest.mark.parametrize("check", WHISPER_BATTERY, ids=lambda check: check.name)
def test_the_simulated_whisper_server_answers_each_request_as_the_real_one(
        check: Check, whisper: tuple[Running, Running]) -> None:
    assert_conforms(check, whisper)


def test_while_loading_the_simulated_llama_server_answers_health_as_the_real_one(
        llama: tuple[Running, Running]) -> None:
    """Both answer ``/health`` 503 "Loading model" (OpenAI error shape) until the model is in."""
    real, sim = ([answer for answer in server.startup if answer.status == 503] for server in llama)
    assert real and sim, "a server was never seen loading"
    assert not differences(real[0], sim[0])
    assert real[0].body == sim[0].body == {"error": {"message": "Loading model", "type": "unavailable_error",
                                                     "code": 503}}


def test_while_loading_every_route_answers_loading_as_on_the_real_llama_server(
        llama: tuple[Running, Running], real_servers: RealServers, tiny_models: TinyModels,
        tmp_path: Path) -> None:
    """Until the model is in, ``/v1/models``, ``/props``, ``/slots``, ``/tokenize`` and a chat are all
    answered 503 "Loading model", on both servers.  The real one is the slow GGUF (a longer load, so each
    route is surely asked while it lasts)."""
    port = free_port()
    real = start_server([real_servers.llama, "-m", tiny_models.slow, "-t", "1", "--host", "127.0.0.1",
                         "--port", str(port)], port, tmp_path / "slow.log", WHILE_LOADING)
    real.stop()
    sim = llama[1]
    for probe in WHILE_LOADING:
        assert probe.path in real.loading and probe.path in sim.loading, f"{probe.path} never seen loading"
        assert not differences(real.loading[probe.path], sim.loading[probe.path]), probe.path


def test_whisper_servers_listen_only_once_their_model_is_loaded(whisper: tuple[Running, Running]) -> None:
    """whisper-server loads its startup model before it binds its port: a client sees connections refused,
    then 200, never a "loading" answer (the simulator's weights take 200 ms to load)."""
    for server in whisper:
        assert [answer.status for answer in server.startup] == [200]


def test_each_slot_gets_its_share_of_the_context_on_both_servers(llama: tuple[Running, Running]) -> None:
    """``-c 512 -np 2``: ``/props``, ``/slots`` and ``/v1/models`` say 256 tokens a slot, two slots."""
    for server in llama:
        props = server.ask(Probe("GET", "/props")).body
        slots = server.ask(Probe("GET", "/slots")).body
        models = server.ask(Probe("GET", "/v1/models")).body
        assert isinstance(props, dict) and isinstance(slots, list) and isinstance(models, dict)
        assert props["default_generation_settings"]["n_ctx"] == SLOT_CONTEXT
        assert props["total_slots"] == 2
        assert [slot["n_ctx"] for slot in slots] == [SLOT_CONTEXT, SLOT_CONTEXT]
        assert models["data"][0]["meta"]["n_ctx"] == SLOT_CONTEXT
        assert models["data"][0]["meta"]["n_ctx_train"] == TRAIN_CONTEXT


def test_slots_look_alike_before_and_after_serving(llama: tuple[Running, Running]) -> None:
    """An unused slot has four fields; one that has served keeps its task's fields (``id_task``, ``params``,
    ``next_token``, ...), idle again."""
    real, sim = llama
    assert real.fresh is not None and sim.fresh is not None
    assert not differences(real.fresh, sim.fresh)
    assert_conforms(Check("serve", Probe("POST", "/completion", {"prompt": "Hi", "n_predict": 4}), SAMPLER),
                    llama)
    used: list[Answer] = []
    for server in llama:
        slots = server.ask(Probe("GET", "/slots"))
        assert isinstance(slots.body, list)
        served = [slot for slot in slots.body if "id_task" in slot]
        assert served and not any(slot["is_processing"] for slot in served)
        used.append(Answer(slots.status, slots.media_type, served[0]))
    assert not differences(*used, {"$.params.*": "the sampler settings of the task: routerd reads none"})


def test_a_prompt_that_fills_the_slot_is_refused_with_the_slot_size(llama: tuple[Running, Running]) -> None:
    """Overflow is the prompt alone reaching the slot's context: 400 ``exceed_context_size_error`` with
    ``n_prompt_tokens`` (more than the slot holds) and ``n_ctx`` (the slot's, 256)."""
    for server in llama:
        answer = server.ask(Probe("POST", "/completion", {"prompt": LONG_PROMPT, "n_predict": 1}))
        assert answer.status == 400 and isinstance(answer.body, dict)
        error = answer.body["error"]
        assert error["type"] == "exceed_context_size_error"
        assert error["n_ctx"] == SLOT_CONTEXT and error["n_prompt_tokens"] >= SLOT_CONTEXT


def test_generation_stops_at_the_end_of_the_slot_on_both_servers(llama: tuple[Running, Running]) -> None:
    """A prompt that fits leaves room for fewer tokens than asked: both generate up to the slot's end
    (prompt plus generated tokens = 256) instead of refusing the request."""
    prompt = " ".join(["tiny"] * 240)
    for server in llama:
        answer = server.ask(Probe("POST", "/completion",
                                  {"prompt": prompt, "n_predict": 40, "ignore_eos": True}))
        assert answer.status == 200 and isinstance(answer.body, dict)
        assert answer.body["tokens_evaluated"] + answer.body["tokens_predicted"] == SLOT_CONTEXT
        assert answer.body["tokens_predicted"] < 40


def test_the_simulated_whisper_server_switches_models_as_the_real_one(
        whisper: tuple[Running, Running], tiny_models: TinyModels, weights: Path) -> None:
    """``/load`` of another model file: "Load was successful!" (``application/text``), then transcriptions
    go on."""
    models = (tiny_models.whisper, str(weights / "whisper.sim.json"))
    answers = [server.ask(Probe("POST", "/load", form={"model": model.encode()}))
               for server, model in zip(whisper, models, strict=True)]
    assert not differences(*answers)
    assert answers[0].status == 200 and answers[0].body == answers[1].body == "Load was successful!"
    assert_conforms(WHISPER_BATTERY[1], whisper)


def test_both_llama_servers_serve_the_same_metrics_series_and_routerd_reads_them_alike(
        real_servers: RealServers, tiny_models: TinyModels, weights: Path, tmp_path: Path) -> None:
    """Started with ``--metrics`` (as routerd starts every llama-server), after one completion both answer
    ``/metrics`` with the same ``llamacpp:`` series, by name, type and order; and the rack telemetry reads the
    same counters from both (the tokens the completion generated, nothing processing or deferred)."""
    sim_weights = str(weights / "tiny.sim.json")
    pairs = _pair([real_servers.llama, "-m", tiny_models.tiny, *CONTEXT, "-t", "1", "--metrics"],
                  [*SIM, "llama-server", "-m", sim_weights, *CONTEXT, "--metrics"], tmp_path)
    pair = next(pairs)
    try:
        series = []
        for server in pair:
            answer = server.ask(Probe("POST", "/completion", {"prompt": "Hi", "n_predict": 4}))
            assert answer.status == 200 and isinstance(answer.body, dict)
            scraped = server.ask(Probe("GET", "/metrics"))
            assert scraped.status == 200 and scraped.media_type == "text/plain"
            assert isinstance(scraped.body, str)
            families = list(text_string_to_metric_families(scraped.body))
            series.append([(family.name, family.type) for family in families])
            counters = parse_llama_metrics(scraped.body)
            assert counters.tokens_predicted_total == answer.body["tokens_predicted"]
            assert counters.prompt_tokens_total is not None and counters.prompt_tokens_total > 0
            assert (counters.requests_processing, counters.requests_deferred) == (0, 0)
            assert counters.tokens_per_second is not None and counters.prompt_tokens_per_second is not None
        real, sim = series
        assert sim == real
    finally:
        pairs.close()
