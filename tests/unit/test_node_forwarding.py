"""A master forwarding requests to a slave's replica: both real nodes on one Clock, in memory.

The master lists ``http://slave.test:8080`` in ``cluster.slave_urls`` and polls it on start; the
in-memory network maps that address to the slave node's own site.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from routerd.node import Node
from tests.unit.node_fixture import SLAVE_URL, TEXT, World, master_cluster, slave_cluster

MESSAGES = [{"role": "user", "content": "hello there"}]


def cluster(tmp_path: Path) -> tuple[World, Node, Node]:
    """master has ``chat``; the slave has ``far`` and a different ``chat`` (public ID ``chat-2``)."""
    world = World(tmp_path)
    slave = world.node("slave", {"chat": {"kind": "text", "weights": "other"}, "far": TEXT},
                       cluster=slave_cluster())
    master = world.node("master", {"chat": TEXT},
                        cluster=master_cluster())
    world.start(slave, master)
    return world, master, slave


def header(response: Any, name: str) -> str | None:
    values = response.headers.getRawHeaders(name.encode())
    return values[0].decode() if values else None


def samples(world: World, node_id: str) -> list[tuple[str, str]]:
    found = world.run(world.stores[node_id].request_samples(None, "llm", 0, status=None))
    return [(s.model_id, s.status) for s in found]


def test_the_master_polls_its_slave_on_start_and_lists_its_models_under_public_ids(tmp_path: Path) -> None:
    world, master, _slave = cluster(tmp_path)
    response, body = world.call("GET", master, "/router/v1/models")
    assert response.code == 200
    records = {(r["node_id"], r["local_id"]): r["public_id"] for r in json.loads(body)["models"]}
    assert records == {("master", "chat"): "chat", ("slave", "chat"): "chat-2", ("slave", "far"): "far"}
    assert (b"GET", SLAVE_URL.encode() + b"/router/v1/node/models") in world.network.requests


def test_a_model_only_the_slave_has_is_answered_by_the_slave(tmp_path: Path) -> None:
    world, master, _slave = cluster(tmp_path)
    response, body = world.call("POST", master, "/v1/chat/completions",
                                json={"model": "far", "messages": MESSAGES, "max_tokens": 3})

    assert response.code == 200
    assert header(response, "X-Routerd-Node") == "slave"
    assert header(response, "X-Routerd-Request-Id")
    assert json.loads(body)["model"] == "far"
    assert (b"POST", SLAVE_URL.encode() + b"/router/v1/node/inference/v1/chat/completions") \
        in world.network.requests
    assert samples(world, "slave") == [("far", "ok")]
    assert samples(world, "master") == []  # the master served nothing itself


def test_a_forwarded_answer_carries_the_public_id_not_the_slaves_local_id(tmp_path: Path) -> None:
    """``chat-2`` is the slave's ``chat``: the slave is asked for ``chat``, the client sees ``chat-2``."""
    world, master, _slave = cluster(tmp_path)
    response, body = world.call("POST", master, "/v1/chat/completions",
                                json={"model": "chat-2", "messages": MESSAGES, "max_tokens": 3})

    assert response.code == 200
    assert header(response, "X-Routerd-Node") == "slave"
    assert json.loads(body)["model"] == "chat-2"
    assert samples(world, "slave") == [("chat", "ok")]
    [process] = world.launcher.spawned
    assert any(arg.endswith("/slave/chat.sim.json") for arg in process.argv)


def test_a_forwarded_stream_is_relayed_event_by_event_with_the_public_id(tmp_path: Path) -> None:
    world, master, _slave = cluster(tmp_path)
    response, body = world.call("POST", master, "/v1/chat/completions",
                                json={"model": "chat-2", "messages": MESSAGES, "max_tokens": 3,
                                      "stream": True})

    assert response.code == 200
    assert header(response, "Content-Type") == "text/event-stream"
    assert header(response, "X-Routerd-Node") == "slave"
    blocks = [b[len("data: "):] for b in body.decode().split("\n\n") if b.startswith("data: ")]
    assert blocks[-1] == "[DONE]"
    chunks = [json.loads(b) for b in blocks[:-1]]
    assert len(chunks) == 5  # role, three tokens, finish
    assert {c["model"] for c in chunks} == {"chat-2"}


def test_a_forwarded_ollama_stream_stays_ndjson_with_the_public_id(tmp_path: Path) -> None:
    world, master, _slave = cluster(tmp_path)
    response, body = world.call("POST", master, "/api/chat",
                                json={"model": "chat-2", "messages": MESSAGES,
                                      "options": {"num_predict": 2}})

    assert response.code == 200
    assert header(response, "Content-Type") == "application/x-ndjson"
    lines = [json.loads(line) for line in body.decode().splitlines() if line]
    assert {line["model"] for line in lines} == {"chat-2"}
    assert lines[-1]["done"] is True


def test_the_masters_own_replica_is_served_locally(tmp_path: Path) -> None:
    world, master, _slave = cluster(tmp_path)
    response, body = world.call("POST", master, "/v1/chat/completions",
                                json={"model": "chat", "messages": MESSAGES, "max_tokens": 3})

    assert response.code == 200
    assert header(response, "X-Routerd-Node") == "master"
    assert json.loads(body)["model"] == "chat"
    assert samples(world, "master") == [("chat", "ok")]
    assert samples(world, "slave") == []


def test_an_unreachable_slave_answers_502_node_unreachable(tmp_path: Path) -> None:
    world, master, _slave = cluster(tmp_path)
    world.network.unplug("slave.test:8080")  # gone before the next health poll notices

    response, body = world.call("POST", master, "/v1/chat/completions",
                                json={"model": "far", "messages": MESSAGES})

    assert response.code == 502
    error = json.loads(body)["error"]
    assert (error["type"], error["code"]) == ("backend_error", "node_unreachable")
    assert "'slave'" in error["message"]
    assert world.launcher.spawned == []


def test_an_unreachable_slave_answers_an_ollama_envelope_on_ollama_paths(tmp_path: Path) -> None:
    world, master, _slave = cluster(tmp_path)
    world.network.unplug("slave.test:8080")

    response, body = world.call("POST", master, "/api/chat", json={"model": "far", "messages": MESSAGES})

    assert response.code == 502
    answer = json.loads(body)
    assert isinstance(answer["error"], str) and "unreachable" in answer["error"]
