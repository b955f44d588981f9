"""Issue 23 at the HTTP edge of a real in-memory node: a named key's name and class travel from the
admission verdict into the router queue (class order, held list, queue position header), the
``X-Routerd-Priority`` header lowers a class and refuses unknown values, and the master forwards
name and class (never the key) to the node it forwards to."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred

from routerd.api.admission import EdgeRules, decide
from routerd.api.head import build_head
from routerd.cluster.auth import AuthPolicy
from routerd.config.keys import InferenceKey
from routerd.lending.links import LinkSet
from routerd.node import Node
from routerd.routing.call import Call
from routerd.routing.forward import key_headers
from routerd.wire.lending import Endpoint, Link
from tests.unit.node_fixture import TEXT, World
from tests.unit.test_admission import _gather

KEYS = [{"name": "flood", "key": "sk-flood-0123456789", "class": "batch"},
        {"name": "chat", "key": "sk-chat-0123456789", "class": "interactive"}]


def _chat() -> bytes:
    return json.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 2}).encode()


def _linked_node(tmp_path: Path) -> tuple[World, Node]:
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT}, auth={"inference_keys": KEYS},
                      cluster={"scheduling_backend_depth": 1})
    world.start(node)
    link = Link(Endpoint("solo", "chat"), Endpoint("other", "x"), True, False)
    node.lending.install_links(LinkSet.build("image", ()), LinkSet.build("text", [link]))
    return world, node


def _post(world: World, node: Node, key: str, **extra: bytes) -> Deferred[Any]:
    http = world.network.client(world.clock)
    headers = {b"content-type": [b"application/json"], b"authorization": [b"Bearer " + key.encode()]}
    headers.update({name.replace("_", "-").encode(): [value] for name, value in extra.items()})
    return http.post(f"http://{world.netlocs[node]}/v1/chat/completions", data=_chat(), headers=headers)


def test_an_interactive_keys_request_waits_ahead_of_a_batch_keys_flood(tmp_path: Path) -> None:
    world, node = _linked_node(tmp_path)
    sent = [_post(world, node, "sk-flood-0123456789") for _ in range(5)]
    while world.network.flush():
        pass
    sent.append(_post(world, node, "sk-chat-0123456789"))
    while world.network.flush():
        pass
    order = node.lending.queues["text"].serving_order(node.lending._now_ms())
    assert [(e.key_name, e.priority) for e in order][0] == ("chat", 0)
    held = node.lending.held_requests()
    assert {(h["key_name"], h["priority"]) for h in held} == {("flood", "batch"), ("chat", "interactive")}
    assert "sk-" not in json.dumps(held)  # the name, never the key
    results: Any = world.run(Deferred.fromCoroutine(_gather(sent)))
    assert [r.code for r, _ in results] == [200] * 6
    chat_response = results[-1][0]
    assert chat_response.headers.getRawHeaders(b"x-routerd-queue-position") == [b"2"]  # 1 running + first
    metrics = node.metrics.render().decode()
    assert 'routerd_key_queue_wait_seconds_count{class="interactive",key="chat"} 1.0' in metrics
    assert 'routerd_key_requests_total{class="batch",key="flood",status="ok"} 5.0' in metrics


def test_priority_header_lowers_the_class_and_an_unknown_value_is_400(tmp_path: Path) -> None:
    world, node = _linked_node(tmp_path)
    sent = [_post(world, node, "sk-flood-0123456789"),
            _post(world, node, "sk-chat-0123456789", x_routerd_priority=b"batch")]
    while world.network.flush():
        pass
    assert [h["priority"] for h in node.lending.held_requests()] == ["batch"]
    bad = world.run(_post(world, node, "sk-chat-0123456789", x_routerd_priority=b"urgent"))
    body = json.loads(world.run(bad.content()))
    assert bad.code == 400 and body["error"]["code"] == "invalid_priority"
    world.run(Deferred.fromCoroutine(_gather(sent)))


def _verdict(authorization: str, path: str = "/v1/chat/completions", **fields: str) -> Any:
    policy = AuthPolicy.build(["sk-a-0123456789"], ["admin-0123456789"], "cluster-token-0123456789",
                              ["127.0.0.0/8"],
                              named_keys=[InferenceKey("alice", "sk-a-0123456789", "interactive")])
    lines = [(b"host", b"x"), (b"authorization", authorization.encode()),
             *((name.replace("_", "-").encode(), value.encode()) for name, value in fields.items())]
    head = build_head(b"POST", path.encode(), b"HTTP/1.1", iter(lines))
    return decide(EdgeRules(policy, 1 << 20), head, "127.0.0.1", "ready", None)


def test_the_verdict_names_the_key_and_its_class_only_where_they_can_be_trusted() -> None:
    verdict = _verdict("Bearer sk-a-0123456789", x_routerd_key_name="mallory", x_routerd_key_class="batch")
    assert (verdict.key_name, verdict.key_class) == ("alice", "interactive")  # a client's claim is ignored
    admin = _verdict("Bearer admin-0123456789")
    assert (admin.key_name, admin.key_class) == ("", "")
    forwarded = _verdict("Bearer cluster-token-0123456789", "/router/v1/node/inference/v1/chat/completions",
                         x_routerd_key_name="alice", x_routerd_key_class="batch")
    assert (forwarded.key_name, forwarded.key_class) == ("alice", "batch")  # the master vouches


def test_a_forwarded_request_carries_the_key_name_and_class_never_the_key() -> None:
    call = Call(reply=None, route=None,  # type: ignore[arg-type]
                path="/v1/chat/completions", body=b"", content_type="", parsed=None, stream=False,
                request_id="r", started=0.0, selector=None, priority="batch", key_name="alice")
    assert key_headers(call) == ((b"x-routerd-key-class", b"batch"), (b"x-routerd-key-name", b"alice"))
