"""A request's path through one real node: front → local inference → backend → relay, in memory.

The node is built by ``node_fixture.World`` on a ``task.Clock`` with simulator backends; the client
talks to the node's own site (guard + app) over the in-memory network.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from twisted.web.resource import Resource

from routerd.node import Node
from tests.unit.node_fixture import TEXT, World

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}


class OwnName(Resource):
    """A backend that names itself in answers, like a real llama-server reporting its weights file
    (the simulator echoes the request's ``model``, which would hide a missing rewrite)."""

    isLeaf = True

    def __init__(self, inner: Any) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.inner = inner

    def render(self, request: Any) -> Any:
        write = request.write
        request.write = lambda data: write(data.replace(b'"model":"chat"', b'"model":"w.gg"'))
        return self.inner.render(request)


def solo(tmp_path: Path) -> tuple[World, Node]:
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT, "other": TEXT})
    world.start(node)
    return world, node


def header(response: Any, name: str) -> str | None:
    values = response.headers.getRawHeaders(name.encode())
    return values[0].decode() if values else None


def weights_of(process: Any) -> str:
    """The weights path a backend process was started with (after its last ``-m``)."""
    argv = list(process.argv)
    return str(argv[len(argv) - argv[::-1].index("-m")])


def sse_events(body: bytes) -> list[Any]:
    """The ``data:`` payloads of an SSE body, JSON-decoded ([DONE] kept as a string)."""
    events: list[Any] = []
    for block in body.decode().split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_chat_naming_a_local_model_spawns_its_backend_and_answers_under_the_clients_name(
        tmp_path: Path) -> None:
    world, node = solo(tmp_path)
    assert world.launcher.spawned == []  # nothing runs before a request needs it

    response, body = world.call("POST", node, "/v1/chat/completions", json=CHAT)

    assert response.code == 200
    answer = json.loads(body)
    assert answer["model"] == "chat"
    assert answer["choices"][0]["message"]["content"]
    assert header(response, "X-Routerd-Node") == "solo"
    assert header(response, "X-Routerd-Request-Id")
    [process] = world.launcher.spawned
    assert process.name == "llama-server"
    assert weights_of(process).endswith("/chat.sim.json")
    assert process.running


def test_a_served_request_leaves_an_ok_sample_in_the_store(tmp_path: Path) -> None:
    world, node = solo(tmp_path)
    world.call("POST", node, "/v1/chat/completions", json=CHAT)

    samples = world.run(world.stores["solo"].request_samples(None, "llm", 0))

    assert [(s.model_id, s.status, s.http_status, s.node_id) for s in samples] == \
        [("chat", "ok", 200, "solo")]
    assert samples[0].work == (2.0, 4.0)  # prompt and generated tokens from the answer's usage


def test_a_second_model_on_the_same_runtime_switches_the_backend(tmp_path: Path) -> None:
    world, node = solo(tmp_path)
    world.call("POST", node, "/v1/chat/completions", json=CHAT)
    response, body = world.call("POST", node, "/v1/chat/completions", json={**CHAT, "model": "other"})

    assert response.code == 200
    assert json.loads(body)["model"] == "other"
    first, second = world.launcher.spawned
    assert not first.running and second.running
    assert weights_of(second).endswith("/other.sim.json")


def test_ollama_chat_without_streaming_answers_one_ollama_object(tmp_path: Path) -> None:
    world, node = solo(tmp_path)
    request = {"model": "chat", "messages": CHAT["messages"], "stream": False, "options": {"num_predict": 4}}
    response, body = world.call("POST", node, "/api/chat", json=request)

    assert response.code == 200
    assert header(response, "Content-Type") == "application/json"
    answer = json.loads(body)
    assert answer["model"] == "chat"
    assert answer["done"] is True
    assert answer["message"]["role"] == "assistant"
    assert answer["message"]["content"]
    assert answer["prompt_eval_count"] == 2 and answer["eval_count"] == 4


def test_ollama_chat_streams_ndjson_by_default_ending_with_a_done_line(tmp_path: Path) -> None:
    world, node = solo(tmp_path)
    request = {k: v for k, v in CHAT.items() if k != "max_tokens"}
    request["options"] = {"num_predict": 3}
    response, body = world.call("POST", node, "/api/chat", json=request)

    assert response.code == 200
    assert header(response, "Content-Type") == "application/x-ndjson"
    lines = [json.loads(line) for line in body.decode().splitlines() if line]
    assert len(lines) >= 4  # three tokens and the final line
    assert all(line["model"] == "chat" for line in lines)
    assert [line["done"] for line in lines] == [False] * (len(lines) - 1) + [True]
    words = "".join(line["message"]["content"] for line in lines[:-1])
    assert len(words.split()) == 3
    assert header(response, "X-Routerd-Node") == "solo"


def test_streamed_chat_passes_sse_chunks_through_with_the_public_model_id(tmp_path: Path) -> None:
    world, node = solo(tmp_path)
    response, body = world.call("POST", node, "/v1/chat/completions", json={**CHAT, "stream": True})

    assert response.code == 200
    assert header(response, "Content-Type") == "text/event-stream"
    events = sse_events(body)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) == 6  # role, four tokens, the finish chunk
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert all(c["model"] == "chat" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert len(text.split()) == 4


def test_a_streamed_request_is_sampled_with_the_usage_of_its_last_chunk(tmp_path: Path) -> None:
    world, node = solo(tmp_path)
    world.call("POST", node, "/v1/chat/completions", json={**CHAT, "stream": True})

    samples = world.run(world.stores["solo"].request_samples("chat", "llm", 0))

    assert [(s.status, s.work) for s in samples] == [("ok", (2.0, 4.0))]


def test_a_backend_naming_itself_is_rewritten_to_the_public_id_in_a_whole_answer(tmp_path: Path) -> None:
    world, node = solo(tmp_path)
    world.launcher.wrap = OwnName
    response, body = world.call("POST", node, "/v1/chat/completions", json=CHAT)
    [process] = world.launcher.spawned
    _, direct = world.call("POST", f"127.0.0.1:{process.port}", "/v1/chat/completions", json=CHAT)

    assert json.loads(direct)["model"] == "w.gg"  # what the backend itself says
    assert response.code == 200
    assert json.loads(body)["model"] == "chat"


def test_a_backend_naming_itself_is_rewritten_to_the_public_id_in_every_sse_chunk(tmp_path: Path) -> None:
    world, node = solo(tmp_path)
    world.launcher.wrap = OwnName
    response, body = world.call("POST", node, "/v1/chat/completions", json={**CHAT, "stream": True})
    [process] = world.launcher.spawned
    _, direct = world.call("POST", f"127.0.0.1:{process.port}", "/v1/chat/completions",
                           json={**CHAT, "stream": True})

    assert {c["model"] for c in sse_events(direct)[:-1]} == {"w.gg"}
    assert response.code == 200
    chunks = sse_events(body)
    assert chunks[-1] == "[DONE]"
    assert len(chunks) == 7
    assert {c["model"] for c in chunks[:-1]} == {"chat"}
