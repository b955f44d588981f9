"""The helper side of lending on real in-memory nodes (one Clock, simulator backends).

A borrowed request naming a model the helper no longer has is handed back with 409
``offload_returned`` (reference §7 "Arrival", scenario 53): the owner re-runs it.  Never a 404, and
never forwarded, on a slave's node inference path and on the master-as-helper path alike.
"""

from __future__ import annotations

import json
from pathlib import Path

from routerd.lending.offload import Borrowed
from routerd.routing.call import Incoming
from tests.support import FakeReply
from tests.unit.node_fixture import TEXT, TOKEN, World

SLAVE_URL = "http://slave.test:8080"
MASTER_URL = "http://master.test:8080"
CHAT = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 3}
NODE_CHAT = "/router/v1/node/inference/v1/chat/completions"


def borrowed_headers(load: bool = True) -> dict[str, list[str]]:
    headers = {"authorization": [f"Bearer {TOKEN}"], "x-routerd-offload": ["1"],
               "x-routerd-offload-owner": ["owner"], "x-routerd-offload-owner-model": ["alpha"]}
    if load:
        headers["x-routerd-offload-load"] = ["1"]
    return headers


def test_a_helper_without_the_named_model_hands_a_borrowed_request_back_with_409(tmp_path: Path) -> None:
    world = World(tmp_path)
    slave = world.node("slave", {"beta": TEXT},
                       cluster={"role": "slave", "token": TOKEN, "master_url": MASTER_URL,
                                "public_url": SLAVE_URL})
    world.start(slave)
    response, body = world.call("POST", slave, NODE_CHAT, json={"model": "gone", **CHAT},
                                headers=borrowed_headers())
    assert response.code == 409
    assert json.loads(body)["error"]["code"] == "offload_returned"
    assert world.launcher.spawned == []  # nothing was loaded for it


def test_an_ordinary_forwarded_request_for_a_missing_model_is_still_a_404(tmp_path: Path) -> None:
    world = World(tmp_path)
    slave = world.node("slave", {"beta": TEXT},
                       cluster={"role": "slave", "token": TOKEN, "master_url": MASTER_URL,
                                "public_url": SLAVE_URL})
    world.start(slave)
    response, body = world.call("POST", slave, NODE_CHAT, json={"model": "gone", **CHAT},
                                headers={"authorization": [f"Bearer {TOKEN}"]})
    assert response.code == 404
    assert json.loads(body)["error"]["code"] == "model_not_found"


def test_the_master_as_helper_hands_back_a_borrowed_request_for_a_model_only_a_slave_has(
        tmp_path: Path) -> None:
    world = World(tmp_path)
    slave = world.node("slave", {"far": TEXT},
                       cluster={"role": "slave", "token": TOKEN, "master_url": MASTER_URL,
                                "public_url": SLAVE_URL})
    master = world.node("master", {"chat": TEXT},
                        cluster={"role": "master", "token": TOKEN, "slave_urls": [SLAVE_URL],
                                 "public_url": MASTER_URL})
    world.start(slave, master)
    before = list(world.network.requests)
    reply = FakeReply()
    incoming = Incoming(path="/v1/chat/completions", body=json.dumps({"model": "far", **CHAT}).encode(),
                        content_type="application/json")
    body = world.run(master._serve_borrowed(reply, incoming, Borrowed(load_allowed=True, restore=False)))
    assert reply.status == 409
    assert json.loads(body)["error"]["code"] == "offload_returned"
    # never forwarded to the slave that has it
    assert [r for r in world.network.requests[len(before):] if b"/inference/" in r[1]] == []
