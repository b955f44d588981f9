"""routerd's own context gate: the real slot window read once per backend process from ``/props``,
and a text request refused (400) before the backend when even its fewest estimated tokens fill it."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
from twisted.internet.defer import Deferred, fail, succeed

from routerd.catalog.model import Capabilities, ModelConfig
from routerd.errors import HTTPError
from routerd.inference.context_gate import ContextGate, overflow, slot_window
from routerd.routing.call import Call
from routerd.routing.classify import classify
from tests.support import FakeReply, fired


def model(filename: str = "tiny.kcpps") -> ModelConfig:
    return ModelConfig(local_id="tiny", filename=filename, path=f"/m/{filename}", backend_mode="llama_sdcpp",
                       capabilities=Capabilities(llm=True, embeddings=True, context=512), config_hash="h")


def call(path: str = "/v1/chat/completions") -> Call:
    route = classify("POST", path)
    assert route is not None
    parsed = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "input": "hi"}
    return Call(reply=FakeReply(), route=route, path=path, body=json.dumps(parsed).encode(),
                content_type="application/json", parsed=parsed, stream=False, request_id="r", started=0.0,
                selector="tiny")


@attrs.define
class Answer:
    code: int
    body: bytes

    def body_if_complete(self) -> bytes:
        return self.body


@attrs.define
class PropsAgent:
    """Answers ``GET <base>/props`` with ``props`` (or fails) and counts the asks."""

    props: Any = attrs.Factory(lambda: {"default_generation_settings": {"n_ctx": 256}})
    code: int = 200
    asked: list[bytes] = attrs.Factory(list)

    def request(self, method: bytes, uri: bytes, *_args: Any) -> Deferred[Any]:
        self.asked.append(method + b" " + uri)
        if self.props is None:
            return fail(ConnectionRefusedError())
        return succeed(Answer(self.code, json.dumps(self.props).encode()))


def check(gate: ContextGate, the_call: Call, base: str = "http://127.0.0.1:9") -> Exception | None:
    d = Deferred.fromCoroutine(gate.check(the_call, model(), base, "tiny"))
    failures: list[Exception] = []
    d.addErrback(lambda f: failures.append(f.value))
    return failures[0] if failures else None


def test_slot_window_is_props_per_slot_n_ctx() -> None:
    assert slot_window({"default_generation_settings": {"n_ctx": 256}, "total_slots": 2}) == 256
    assert slot_window({"default_generation_settings": {}}) is None
    assert slot_window({"default_generation_settings": {"n_ctx": 0}}) is None
    assert slot_window([]) is None


def test_a_prompt_is_refused_once_it_fills_the_window_as_the_backend_does() -> None:
    assert overflow("tiny", 255, 256) is None
    refused = overflow("tiny", 256, 256)
    assert isinstance(refused, HTTPError) and refused.status == 400
    assert (refused.type, refused.code) == ("exceed_context_size_error", "context_exceeded")
    assert "256-token" in refused.reason and "'tiny'" in refused.reason


def test_the_gate_refuses_an_overflowing_chat_and_reads_the_window_once_per_process() -> None:
    agent = PropsAgent()
    gate = ContextGate(agent, lambda _call, _model: 300)  # type: ignore[arg-type]
    refused = check(gate, call())
    assert isinstance(refused, HTTPError) and refused.code == "context_exceeded"
    assert check(gate, call()) is not None
    assert agent.asked == [b"GET http://127.0.0.1:9/props"]
    check(gate, call(), "http://127.0.0.1:10")  # another process (a reload or a switch)
    assert len(agent.asked) == 2


def test_a_known_window_refuses_before_the_runtime_is_acquired() -> None:
    """The window the config's last process reported refuses a doomed request with no load or
    switch; a config never measured passes to the backend."""
    gate = ContextGate(PropsAgent(), lambda _call, _model: 300)  # type: ignore[arg-type]
    gate.refuse_known(call(), model(), "tiny")  # nothing known yet
    check(gate, call())
    with pytest.raises(HTTPError) as refused:
        gate.refuse_known(call(), model(), "tiny")
    assert refused.value.code == "context_exceeded"
    gate.refuse_known(call(), model("other.kcpps"), "other")
    gate.refuse_known(call("/v1/embeddings"), model(), "tiny")


def test_the_gate_passes_what_may_fit_an_unsized_request_and_other_lanes() -> None:
    agent = PropsAgent()
    assert check(ContextGate(agent, lambda _c, _m: 255), call()) is None  # type: ignore[arg-type]
    assert check(ContextGate(agent, lambda _c, _m: None), call()) is None  # type: ignore[arg-type]
    assert check(ContextGate(agent, lambda _c, _m: 10_000), call("/v1/embeddings")) is None  # type: ignore[arg-type]
    assert len(agent.asked) == 1  # only the sized text request read the window


@pytest.mark.parametrize("agent", [PropsAgent(props=None), PropsAgent(code=404), PropsAgent(props={"x": 1})])
def test_a_backend_that_reports_no_window_is_not_gated(agent: PropsAgent) -> None:
    gate = ContextGate(agent, lambda _c, _m: 10_000)  # type: ignore[arg-type]
    assert check(gate, call()) is None
    assert fired(Deferred.fromCoroutine(gate.window(model(), "http://127.0.0.1:9"))) is None
    assert len(agent.asked) == 1  # remembered: not asked again per request
