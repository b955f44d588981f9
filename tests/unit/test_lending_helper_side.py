"""The helper side of lending on real in-memory nodes (one Clock, simulator backends).

A borrowed request naming a model the helper no longer has is handed back with 409
``offload_returned`` (reference §7 "Arrival", scenario 53): the owner re-runs it.  Never a 404, and
never forwarded, on a slave's node inference path and on the master-as-helper path alike.
"""

from __future__ import annotations

import json
from pathlib import Path

from routerd.lending.links import LinkSet
from routerd.lending.offload import Borrowed, offload_returned
from routerd.lending.queue import BorrowedReturn, Effects, LaneQueue
from routerd.routing.call import Incoming
from routerd.wire.lending import Endpoint, Link
from tests.support import FakeReply
from tests.unit.node_fixture import TEXT, TOKEN, World, master_cluster, slave_cluster
from tests.unit.test_lending_service import BORROWED, HELPER, MODEL_H, returned_409
from tests.unit.test_lending_service import Node as ServiceNode

CHAT = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 3}
NODE_CHAT = "/router/v1/node/inference/v1/chat/completions"


def borrowed_headers(load: bool = True) -> dict[str, list[str]]:
    headers = {"authorization": [f"Bearer {TOKEN}"], "x-routerd-offload": ["1"],
               "x-routerd-offload-owner": ["owner"], "x-routerd-offload-owner-model": ["alpha"]}
    if load:
        headers["x-routerd-offload-load"] = ["1"]
    return headers


def _ask_slave_for_a_missing_model(tmp_path: Path,
                                   headers: dict[str, list[str]]) -> tuple[World, object, bytes]:
    """A slave with only ``beta`` asked, through the node API, for a model it does not have."""
    world = World(tmp_path)
    slave = world.node("slave", {"beta": TEXT}, cluster=slave_cluster())
    world.start(slave)
    response, body = world.call("POST", slave, NODE_CHAT, json={"model": "gone", **CHAT}, headers=headers)
    return world, response, body


def test_a_helper_without_the_named_model_hands_a_borrowed_request_back_with_409(tmp_path: Path) -> None:
    world, response, body = _ask_slave_for_a_missing_model(tmp_path, borrowed_headers())
    assert response.code == 409
    assert json.loads(body)["error"]["code"] == "offload_returned"
    assert world.launcher.spawned == []  # nothing was loaded for it


def test_an_ordinary_forwarded_request_for_a_missing_model_is_still_a_404(tmp_path: Path) -> None:
    _world, response, body = _ask_slave_for_a_missing_model(tmp_path, {"authorization": [f"Bearer {TOKEN}"]})
    assert response.code == 404
    assert json.loads(body)["error"]["code"] == "model_not_found"


def test_the_master_as_helper_hands_back_a_borrowed_request_for_a_model_only_a_slave_has(
        tmp_path: Path) -> None:
    world = World(tmp_path)
    slave = world.node("slave", {"far": TEXT},
                       cluster=slave_cluster())
    master = world.node("master", {"chat": TEXT},
                        cluster=master_cluster())
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


# -- taking back borrowed work that has not claimed the runtime (spec "Borrowed work yields") ---------


def test_the_queue_hands_back_admitted_borrowed_work_still_waiting_for_the_runtime() -> None:
    q = LaneQueue("text", 2, enrolled={"H"})
    assert q.arrive_borrowed("b0", "H", 0).admit == ("b0",)  # holds the runtime, generating
    assert q.arrive_borrowed("b1", "H", 1).admit == ("b1",)  # admitted, waiting for a load
    assert q.arrive_borrowed("b2", "H", 2).admit == ()  # waiting in the router
    effects = q.arrive("own", "H", 3, reclaim=["b1"])
    assert effects.returned == (BorrowedReturn("b1", "own_work_arrived"),
                                BorrowedReturn("b2", "own_work_arrived"))
    assert effects.admit == ("own",)  # b1's place goes to the node's own request
    assert [e.request_id for e in q.admitted()] == ["b0", "own"]
    assert q.entry("b1") is None and q.entry("b2") is None
    assert q.entry("own").borrowed_ahead == 1  # type: ignore[union-attr]


def test_the_queue_never_hands_back_borrowed_work_that_holds_the_runtime() -> None:
    q = LaneQueue("text", 1, enrolled={"H"})
    q.arrive_borrowed("b0", "H", 0)
    effects = q.arrive("own", "H", 1, reclaim=())
    assert effects == Effects()
    assert [e.request_id for e in q.admitted()] == ["b0"]


def waiting_helper() -> tuple[ServiceNode, set[str], list[str]]:
    """A helper whose local runs claim the runtime only when the test says so."""
    node = ServiceNode(HELPER, depth=2)
    waiting: set[str] = set()
    taken: list[str] = []

    def take_back(rid: str) -> bool:
        if rid not in waiting:
            return False
        waiting.discard(rid)
        taken.append(rid)
        node.running.pop(rid).errback(offload_returned())  # what LocalInference does
        return True

    node.service.waiting_for_runtime = lambda rid: rid in waiting
    node.service.take_back = take_back
    return node, waiting, taken


def test_own_work_takes_back_an_admitted_borrowed_request_waiting_for_a_load() -> None:
    node, waiting, taken = waiting_helper()
    node.serve("b0", MODEL_H, BORROWED)  # holds the runtime
    node.serve("b1", MODEL_H, BORROWED)
    waiting.add("b1")  # admitted, but its model is still loading
    assert node.local_calls == ["b0", "b1"]

    node.serve("n0", MODEL_H)
    assert taken == ["b1"]
    returned_409(node.answered("b1"))
    rows = node.rows("borrowed_returned")
    assert [(r["request_id"], r["reason"]) for r in rows] == [("b1", "own_work_arrived")]
    assert node.local_calls == ["b0", "b1", "n0"]  # n0 took b1's backend place at once
    node.finish_local("b0")
    assert node.answered("b0") == b"local b0"  # the one generating finished
    node.finish_local("n0")
    assert node.answered("n0") == b"local n0"
    assert len(node.queue) == 0 and node.service.borrowed_requests() == []


def test_a_borrowed_request_that_claimed_the_runtime_is_never_taken_back() -> None:
    node, _waiting, taken = waiting_helper()
    node.serve("b0", MODEL_H, BORROWED)
    node.serve("b1", MODEL_H, BORROWED)
    node.serve("n0", MODEL_H)
    assert taken == [] and node.rows("borrowed_returned") == []
    assert node.local_calls == ["b0", "b1"]  # n0 waits behind both
    node.finish_local("b1")
    assert node.answered("b1") == b"local b1"
    assert node.local_calls == ["b0", "b1", "n0"]


def test_a_borrowed_request_waiting_for_its_model_to_load_is_handed_back_when_own_work_arrives(
        tmp_path: Path) -> None:
    """Real slot and simulator: the borrowed request's load takes 5 s; a native request 1 s in takes
    its place, the borrowed one answers 409 at once, and only the one load ever runs."""
    world = World(tmp_path)
    slow = {"kind": "text", "weights": "slow", "load_ms": 5000, "gen_tokens_per_s": 1000}
    helper = world.node("helper", {"beta": slow},
                        llama={"extra_args": ["--sim-time-scale", "1"]},
                        cluster=slave_cluster())
    world.start(helper)
    link = Link(Endpoint("owner", "alpha"), Endpoint("helper", "beta"), True, False)
    helper.lending.install_links(LinkSet.build("image", ()), LinkSet.build("text", [link]))
    http = world.network.client(world.clock)
    base = f"http://{world.netlocs[helper]}"
    t0 = world.clock.seconds()
    lent = http.request("POST", base + NODE_CHAT, json={"model": "beta", **CHAT},
                        headers=borrowed_headers(load=True))
    world.network.flush()
    world.clock.advance(1.0)
    world.network.flush()
    assert [b["state"] for b in helper.lending.borrowed_requests()] == ["running"]  # admitted
    assert helper.runtimes.status()[0].state == "loading"

    own = http.request("POST", base + "/v1/chat/completions", json={"model": "beta", **CHAT})
    response = world.run(lent)
    assert response.code == 409
    assert json.loads(world.run(response.content()))["error"]["code"] == "offload_returned"
    assert world.clock.seconds() < t0 + 5.0  # back before the load finished
    rows = world.run(helper.lending.decisions.query(outcome="borrowed_returned"))  # type: ignore[union-attr]
    assert [r["reason"] for r in rows] == ["own_work_arrived"]

    response = world.run(own)
    assert response.code == 200
    assert json.loads(world.run(response.content()))["model"] == "beta"
    assert len(world.launcher.spawned) == 1  # the load carried on for the node's own request
    # a return is not a failed request: no sample was written for it
    samples = world.run(world.stores["helper"].request_samples(None, "llm", 0, status=None))
    assert [s.status for s in samples] == ["ok"]
