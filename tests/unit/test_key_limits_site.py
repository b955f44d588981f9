"""``tokens_per_minute`` is one limit per key for the site: a master counts the tokens of what it
routes (from the usage the answer reports as it comes back from the node that served it), and that
node does not count the master's forwarded request again.  Real nodes in memory on one
``task.Clock`` (the llama-server simulator, no sockets)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from routerd.node import Node
from tests.unit.node_fixture import World, master_cluster, slave_cluster

CHAT = {"kind": "text", "weights": "chat", "load_ms": 40, "prompt_tokens_per_s": 1000,
        "gen_tokens_per_s": 200, "context": 4096}
KEY = "sk-tpm-0123456789"
KEYS = {"inference_keys": [{"name": "tpm", "key": KEY, "limits": {"tokens_per_minute": 60}}]}


def _pair(tmp_path: Path) -> tuple[World, Node, Node]:
    world = World(tmp_path)
    slave = world.node("slave", {"chat": CHAT}, auth=KEYS, cluster=slave_cluster())
    master = world.node("master", {}, auth=KEYS, cluster=master_cluster())
    world.start(slave, master)
    return world, master, slave


def _chat(world: World, node: Node, stream: bool) -> tuple[int, Any]:
    body = {"model": "chat", "max_tokens": 20, "stream": stream,
            "messages": [{"role": "user", "content": "one two three four five"}]}
    response, raw = world.call("POST", node, "/v1/chat/completions", json=body,
                               headers={"Authorization": f"Bearer {KEY}"})
    return response.code, raw


def test_a_master_charges_the_tokens_a_slave_reported_and_refuses_past_the_minute_limit(
        tmp_path: Path) -> None:
    for stream in (False, True):
        world, master, slave = _pair(tmp_path / str(stream))
        served = 0
        while True:
            code, raw = _chat(world, master, stream)
            if code == 429:
                break
            assert code == 200, raw
            served += 1
            assert served < 10, "the master never counted the tokens"
        assert json.loads(raw)["error"]["code"] == "key_limited" and b"tokens_per_minute" in raw
        # 20 output tokens and the prompt's an answer: the fourth request found 60 counted
        assert served == 3, served
        assert master.front.limiter.running("tpm") == 0
        # the slave did not count the forwarded requests again: a client calling it directly is served
        assert _chat(world, slave, stream)[0] == 200
        world.clock.advance(61)  # the minute passed: the key is served again
        assert _chat(world, master, stream)[0] == 200


def test_the_usage_an_answer_reports_is_read_from_json_sse_and_ndjson() -> None:
    from routerd.routing.work import usage_of_answer

    openai = b'{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":20}}'
    assert usage_of_answer("application/json", openai) == (7, 20)
    assert usage_of_answer("text/event-stream", b"data: " + openai + b"\n\ndata: [DONE]\n\n") == (7, 20)
    ollama = b'{"done":false}\n{"done":true,"prompt_eval_count":5,"eval_count":9}\n'
    assert usage_of_answer("application/x-ndjson", ollama) == (5, 9)
    assert usage_of_answer("application/json", b'{"prompt_eval_count":5,"eval_count":9}') == (5, 9)
    assert usage_of_answer("application/json", b"not json") is None
    assert usage_of_answer("application/json", b"[1]") is None
