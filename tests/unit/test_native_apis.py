"""The APIs a backend speaks itself (Anthropic Messages and token counting, OpenAI Responses, rerank): routed
as chat is, passed through by the family that speaks them and refused by the others, errors in the caller's
API's envelope, tokens counted from each API's own usage, the model rewritten in the answer, and the
Responses API's server-side state refused."""

from __future__ import annotations

import json

import attrs
import pytest

from routerd.backends.families.llama_sdcpp import text_argv
from routerd.catalog.kcpps import config_from_mapping
from routerd.errors import HTTPError, Saturated, error_answer, style_for_path
from routerd.families import every_family
from routerd.routing.classify import classify
from routerd.routing.native_bodies import refuse_malformed
from routerd.routing.plan import NATIVE_APIS, SECTIONS, plan_backend_call
from routerd.routing.relay import TAIL_KEEP
from routerd.routing.rewrite import make_rewriter, rewrite_json_model
from routerd.routing.server_state import refuse_server_state
from routerd.routing.work import HEAD_KEEP, StreamCounts, cached_tokens, usage_from_json, usage_from_tail

PATHS = {"/v1/messages": "messages", "/v1/messages/count_tokens": "count_tokens",
         "/v1/responses": "responses", "/v1/rerank": "rerank", "/rerank": "rerank"}


def _event(name: str, data: dict[str, object]) -> bytes:
    return f"event: {name}\ndata: ".encode() + json.dumps({"type": name, **data}).encode() + b"\n\n"


def message_stream(deltas: int, text: str = "word ") -> list[bytes]:
    """A llama-server Messages stream's events: input in message_start, output in message_delta."""
    return [
        _event("message_start", {"message": {"id": "m", "type": "message", "role": "assistant", "content": [],
                                              "model": "/models/tiny.gguf", "usage": {
                                                  "cache_read_input_tokens": 3, "input_tokens": 21,
                                                  "output_tokens": 0}}}),
        _event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
        *[_event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": text}})
          for _ in range(deltas)],
        _event("content_block_stop", {"index": 0}),
        _event("message_delta", {"delta": {"stop_reason": "max_tokens", "stop_sequence": None},
                                 "usage": {"output_tokens": deltas}}),
        _event("message_stop", {}),
    ]


# -- routed as chat -------------------------------------------------------------------------------


@pytest.mark.parametrize("path,kind", sorted(PATHS.items()))
def test_each_native_api_route_queues_lends_and_counts_as_chat_does(path: str, kind: str) -> None:
    """The same runtime and lane as chat (the router queue, lending, load), a model required, text work."""
    route, chat = classify("POST", path), classify("POST", "/v1/chat/completions")
    assert route is not None and chat is not None
    assert route.kind == kind
    assert (route.runtime, route.lane, route.model_required) == (chat.runtime, chat.lane, chat.model_required)
    assert SECTIONS[kind] == SECTIONS["chat"] == "llm"
    assert route.streamable == (kind in ("messages", "responses"))
    assert route.error_style == ("anthropic" if path.startswith("/v1/messages") else "openai")


def test_every_family_passes_through_translates_or_refuses_each_native_api_and_only_one() -> None:
    for family in every_family():
        for kind in NATIVE_APIS:
            ways = [kind in family.passes_through, kind in family.translates, kind in family.refuses]
            assert ways.count(True) == 1, (family.name, kind)
    # llama-server and vLLM speak every one of them (their sources, README "APIs"); KoboldCpp none
    assert {f.name for f in every_family() if NATIVE_APIS <= f.passes_through} == {"llama_sdcpp", "vllm"}
    kobold = next(f for f in every_family() if f.name == "kobold")
    assert kobold.translates == {"messages", "count_tokens", "responses"} and kobold.refuses >= {"rerank"}
    assert kobold.token_count_path == "/api/extra/tokencount"


@pytest.mark.parametrize("family", ["llama_sdcpp", "vllm"])
@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_family_that_speaks_the_api_gets_it_on_its_own_path_with_the_local_model(path: str,
                                                                                   family: str) -> None:
    route = classify("POST", path)
    assert route is not None
    body = {"model": "public", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    plan = plan_backend_call(route, path, body, json.dumps(body).encode(), "application/json", "local-7",
                             True, family)
    assert plan.path == path and plan.answer_format == "openai" and plan.stream
    assert json.loads(plan.body) == {**body, "model": "local-7"}


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank"])
def test_kobold_refuses_rerank_with_501_as_it_has_no_chat_counterpart(path: str) -> None:
    route = classify("POST", path)
    assert route is not None
    with pytest.raises(HTTPError) as refused:
        plan_backend_call(route, path, {"model": "m", "query": "q", "documents": ["d"]},
                          b'{"model":"m"}', "application/json", "m", False, "kobold")
    assert (refused.value.status, refused.value.code) == (501, "unsupported_backend")


# -- errors in the caller's API's envelope -------------------------------------------------------


def test_the_messages_api_answers_errors_in_anthropics_envelope() -> None:
    assert style_for_path("/v1/messages") == style_for_path("/v1/messages/count_tokens") == "anthropic"
    assert style_for_path("/v1/messages?beta=true") == "anthropic"
    assert style_for_path("/v1/messagesx") == style_for_path("/v1/responses") == "openai"
    status, headers, body = error_answer(Saturated(429, "queued", "queue_full", 7), "anthropic")
    assert status == 429 and (b"Retry-After", b"7") in headers
    assert json.loads(body) == {"type": "error", "error": {"type": "rate_limit_error", "message": "queued",
                                                           "code": "queue_full"}}
    for code, kind in ((400, "invalid_request_error"), (401, "authentication_error"),
                       (404, "not_found_error"), (413, "request_too_large"), (502, "api_error"),
                       (503, "overloaded_error"), (409, "invalid_request_error")):
        _status, _headers, body = error_answer(HTTPError(code, "x"), "anthropic")
        assert json.loads(body)["error"]["type"] == kind, code


# -- the Responses API's server-side state ---------------------------------------------------------


def test_responses_state_is_refused_before_it_queues_and_store_false_passes() -> None:
    route = classify("POST", "/v1/responses")
    assert route is not None
    for asked in ({"previous_response_id": "resp_1"}, {"store": True}):
        with pytest.raises(HTTPError) as refused:
            refuse_server_state(route, {"model": "m", "input": "hi", **asked})
        assert (refused.value.status, refused.value.code) == (400, "unsupported_server_state")
    refuse_server_state(route, {"model": "m", "input": "hi", "store": False})
    chat = classify("POST", "/v1/chat/completions")
    assert chat is not None
    refuse_server_state(chat, {"model": "m", "store": True})  # chat's store is not state routerd keeps


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/messages", {}), ("/v1/messages", {"messages": []}), ("/v1/messages", {"messages": [1]}),
    ("/v1/messages/count_tokens", {"messages": "hi"}), ("/v1/responses", {}), ("/v1/responses", {"input": 3}),
    ("/v1/rerank", {"query": "q"}), ("/rerank", {"documents": ["d"]}),
])
def test_a_native_api_body_without_its_main_field_is_refused_400_before_it_queues(
        path: str, body: dict[str, object]) -> None:
    """Found by the OpenAPI fuzz: ``POST /v1/messages {}`` reached llama-server (and the simulator),
    which answers 500 "'messages' is required" — a client's mistake reported as a server fault."""
    route = classify("POST", path)
    assert route is not None
    with pytest.raises(HTTPError) as refused:
        refuse_malformed(route, {"model": "m", **body})
    assert (refused.value.status, refused.value.code) == (400, "invalid_request_error")


def test_a_native_api_body_with_its_main_field_passes_and_other_routes_are_not_judged() -> None:
    for path, body in (("/v1/messages", {"messages": [{"role": "user", "content": "hi"}]}),
                       ("/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "hi"}]}),
                       ("/v1/responses", {"input": "hi"}), ("/v1/responses", {"input": []}),
                       ("/v1/rerank", {"query": "q", "documents": ["d"]}), ("/v1/chat/completions", {})):
        route = classify("POST", path)
        assert route is not None
        refuse_malformed(route, {"model": "m", **body})


# -- tokens from each API's own usage ------------------------------------------------------------


def test_usage_is_read_from_each_apis_own_fields() -> None:
    # Anthropic: input_tokens leaves the cache out; the prompt is counted whole
    assert usage_from_json({"type": "message", "usage": {"cache_read_input_tokens": 5, "input_tokens": 44,
                                                         "cache_creation_input_tokens": 2,
                                                         "output_tokens": 8}}) == (51, 8)
    # Responses: input_tokens holds the cached ones already
    assert usage_from_json({"object": "response", "usage": {
        "input_tokens": 24, "output_tokens": 3, "total_tokens": 27,
        "input_tokens_details": {"cached_tokens": 23}}}) == (24, 3)
    # a Responses stream's response.completed carries it in its response
    assert usage_from_json({"type": "response.completed", "response": {"usage": {
        "input_tokens": 9, "output_tokens": 4}}}) == (9, 4)
    # rerank: OpenAI's prompt_tokens
    assert usage_from_json({"object": "list", "usage": {"prompt_tokens": 7, "total_tokens": 7}}) == (7, 0)
    # a message_delta alone says nothing of the input
    assert usage_from_json({"type": "message_delta", "usage": {"output_tokens": 4}}) is None
    assert cached_tokens(b'{"usage":{"cache_read_input_tokens":17,"input_tokens":2}}') == 17


def test_a_messages_streams_tokens_are_its_start_input_and_its_delta_output() -> None:
    assert usage_from_tail(b"".join(message_stream(6))) == (24, 6)


def test_a_long_messages_streams_input_is_read_from_its_first_bytes_kept() -> None:
    """The relay keeps the last TAIL_KEEP bytes only: a long answer's message_start is gone from them, and
    the head StreamCounts keeps gives the input back."""
    events = message_stream(400, "a longer word ")
    stream = b"".join(events)
    assert len(stream) > TAIL_KEEP + HEAD_KEEP
    tail = stream[-TAIL_KEEP:]
    assert usage_from_tail(tail) is None  # the tail alone has only the output
    passed: list[bytes] = []
    counts = StreamCounts(lambda chunk: passed.append(chunk) or chunk, head=True)
    for event in events:
        counts.feed(event)
    assert b"".join(passed) == stream  # every chunk still goes to the converter
    assert counts.usage(tail) == (24, 400)
    assert cached_tokens(counts.seen) == 3


def test_a_stream_of_another_api_keeps_no_head_and_costs_no_call() -> None:
    def feed(chunk: bytes) -> bytes:
        return chunk

    counts = StreamCounts(feed, head=False)
    assert counts.feed is feed
    assert counts.usage(b'data: {"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n') == (3, 2)


# -- the model rewritten in the answer -------------------------------------------------------------


def test_the_model_inside_a_message_start_and_a_response_event_is_rewritten() -> None:
    def public(_old: str) -> str:
        return "public"

    start = message_stream(1)[0]
    data = start.split(b"data: ", 1)[1].strip()
    assert json.loads(rewrite_json_model(data, public))["message"]["model"] == "public"
    completed = b'{"type":"response.completed","response":{"id":"r","model":"local"},"timings":{}}'
    assert json.loads(rewrite_json_model(completed, public))["response"]["model"] == "public"
    # a top-level model is the answer's own: the nested one is left as it is
    both = b'{"model":"local","message":{"model":"other"}}'
    assert json.loads(rewrite_json_model(both, public)) == {"model": "public", "message": {"model": "other"}}
    # any other nested object's model is not the answer's
    other = b'{"type":"x","item":{"model":"local"}}'
    assert rewrite_json_model(other, public) is other
    rewriter = make_rewriter("text/event-stream", public)
    out = b"".join(rewriter.feed(e) for e in message_stream(2)) + rewriter.flush()
    assert b'"model": "public"' in out or b'"model":"public"' in out
    assert b"/models/tiny.gguf" not in out


def test_routes_are_frozen_values() -> None:
    route = classify("POST", "/v1/messages")
    assert route is not None
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        route.kind = "chat"  # type: ignore[misc]


# -- a rerank model's config -----------------------------------------------------------------------


def test_a_config_with_reranking_true_starts_llama_server_with_reranking_once() -> None:
    ranker = config_from_mapping({"model": "/m/rank.gguf", "reranking": True}, "/c/ranker.kcpps",
                                 "llama_sdcpp")
    plain = config_from_mapping({"model": "/m/rank.gguf"}, "/c/plain.kcpps", "llama_sdcpp")
    flagged = config_from_mapping({"model": "/m/rank.gguf", "reranking": True, "extra_args": ["--rerank"]},
                                  "/c/flagged.kcpps", "llama_sdcpp")
    assert ranker.reranking and not plain.reranking
    assert text_argv(["llama-server"], [], ranker, 9000).count("--reranking") == 1
    assert "--reranking" not in text_argv(["llama-server"], [], plain, 9000)
    # its own flag kept, not doubled
    assert "--reranking" not in text_argv(["llama-server"], [], flagged, 9000)
    with pytest.raises(ValueError, match="reranking must be true or false"):
        config_from_mapping({"model": "/m/rank.gguf", "reranking": "yes"}, "/c/bad.kcpps", "llama_sdcpp")
