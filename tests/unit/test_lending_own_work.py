"""A helper's own work goes first whatever model or lane it names (spec "A helper's own work",
"Borrowed work yields to the helper's own requests").

Real in-memory nodes with simulator backends on one Clock: a helper holding borrowed work for its
linked model ``beta`` receives a request of its own for ``gamma``, a model linked nowhere (so never
queued in the router), or an explicit load.  The borrowed request that has not claimed the runtime
goes back with 409 ``offload_returned``; the one generating finishes; the own request waits only for
that one, and the node takes no borrowed work until its own work is done.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from twisted.python.failure import Failure

from routerd.lending.links import LinkSet
from routerd.node import Node
from routerd.routing.call import Call
from routerd.routing.classify import Route, classify
from routerd.wire.lending import Endpoint, Link
from tests.support import FakeReply
from tests.unit.node_fixture import TOKEN, World, slave_cluster
from tests.unit.test_lending_service import (
    BORROWED,
    HELPER,
    LINK,
    MODEL_H,
    MODEL_Z,
    OWNER,
    make_call,
    returned_409,
)
from tests.unit.test_lending_service import Node as ServiceNode

MASTER_URL = "http://master.test:8080"
SLAVE_URL = "http://helper.test:8080"
NODE_CHAT = "/router/v1/node/inference/v1/chat/completions"
#: 4 tokens at 2 tokens/s: a job generates for 2 s (time scale 1)
SLOW = {"kind": "text", "weights": "slow", "load_ms": 100, "gen_tokens_per_s": 2}


def image_route() -> Route:
    route = classify("POST", "/v1/images/generations")
    assert route is not None
    return route


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}


def borrowed_headers() -> dict[str, list[str]]:
    return {"authorization": [f"Bearer {TOKEN}"], "x-routerd-offload": ["1"],
            "x-routerd-offload-owner": ["owner"], "x-routerd-offload-owner-model": ["alpha"],
            "x-routerd-offload-load": ["1"]}


def helper_world(tmp_path: Path) -> tuple[World, Node, Any, str]:
    world = World(tmp_path)
    helper = world.node("helper", {"beta": SLOW, "gamma": {**SLOW, "weights": "other"}},
                        llama={"extra_args": ["--sim-time-scale", "1"]},
                        cluster=slave_cluster(SLAVE_URL, scheduling_backend_depth=1))
    world.start(helper)
    link = Link(Endpoint("owner", "alpha"), Endpoint("helper", "beta"), True, False)
    helper.lending.install_links(LinkSet.build("image", ()), LinkSet.build("text", [link]))
    return world, helper, world.network.client(world.clock), f"http://{world.netlocs[helper]}"


def rows(world: World, helper: Node, outcome: str) -> list[dict[str, Any]]:
    assert helper.lending.decisions is not None
    return list(world.run(helper.lending.decisions.query(outcome=outcome)))


def settle(world: World, seconds: float) -> None:
    end = world.clock.seconds() + seconds
    while True:
        world.network.flush()
        due = [c.getTime() for c in world.clock.getDelayedCalls() if c.getTime() <= end]
        if not due:
            break
        world.clock.advance(max(0.0, min(due) - world.clock.seconds()))
    world.clock.advance(max(0.0, end - world.clock.seconds()))
    world.network.flush()


def test_an_own_request_for_another_model_takes_back_borrowed_work_that_has_not_started(
        tmp_path: Path) -> None:
    """As measured from outside: depth 1, one borrowed job generating and one waiting in
    the router; an own request for ``gamma`` hands the waiting one back at once (409, row
    ``borrowed_returned``/``own_work_arrived``), waits only for the generating one (row
    ``native_waited_behind_borrowed`` with one borrowed job ahead), and while it runs a new borrowed
    arrival is refused."""
    world, helper, http, base = helper_world(tmp_path)
    running = http.request("POST", base + NODE_CHAT, json=chat("beta"), headers=borrowed_headers())
    settle(world, 0.5)  # loaded, generating
    waiting = http.request("POST", base + NODE_CHAT, json=chat("beta"), headers=borrowed_headers())
    settle(world, 0.1)
    assert sorted(b["state"] for b in helper.lending.borrowed_requests()) == ["queued", "running"]

    t0 = world.clock.seconds()
    own = http.request("POST", base + "/v1/chat/completions", json=chat("gamma"))
    response = world.run(waiting)
    assert response.code == 409
    assert json.loads(world.run(response.content()))["error"]["code"] == "offload_returned"
    assert world.clock.seconds() < 1.0  # at once, not after the generating job (it ends at 2.1 s)
    assert [r["reason"] for r in rows(world, helper, "borrowed_returned")] == ["own_work_arrived"]

    # while the node's own request waits or runs, borrowed work is refused at the door
    refused = world.run(http.request("POST", base + NODE_CHAT, json=chat("beta"), headers=borrowed_headers()))
    assert refused.code == 409
    assert not helper.lending.lane_statuses()["text"].accepting_borrowed

    assert world.run(running).code == 200  # the one generating finished
    response = world.run(own)
    assert response.code == 200
    assert json.loads(world.run(response.content()))["model"] == "gamma"
    waited = rows(world, helper, "native_waited_behind_borrowed")
    assert [(r["borrowed_ahead"], r["lane"]) for r in waited] == [(1, "text")]
    # it waited for the generating job (about 1.5 s of its 2 s left), not for two of them
    assert 1000 <= waited[0]["wait_ms"] <= 2000
    assert world.clock.seconds() - t0 < 4.0
    assert helper.lending.lane_statuses()["text"].accepting_borrowed  # own work done: accepting again


def test_an_own_request_on_the_other_lane_of_a_shared_process_takes_back_borrowed_work() -> None:
    """KoboldCpp serves both lanes in one process: an own image request (not queued in the router)
    on a helper with a borrowed text job generating and one waiting hands the waiting one back, and
    its wait behind the generating one is logged under the text lane."""
    node = ServiceNode(HELPER, depth=1)
    node.service.shared_lanes = lambda _kind, _model: ("image", "text")
    node.serve("b0", MODEL_H, BORROWED)
    node.serve("b1", MODEL_H, BORROWED)
    assert node.local_calls == ["b0"]

    image_call = Call(reply=FakeReply(), route=image_route(), path="/v1/images/generations", body=b"{}",
                      content_type="application/json", parsed={}, stream=False, request_id="own",
                      started=0.0, selector="paint")
    node.service.helper.own_acquiring(image_call, MODEL_H)
    returned_409(node.answered("b1"))
    assert [(r["request_id"], r["reason"]) for r in node.rows("borrowed_returned")] == \
        [("b1", "own_work_arrived")]
    node.clock.advance(1.5)
    node.service.helper.own_claimed(image_call, True)
    waited = node.rows("native_waited_behind_borrowed")
    assert [(r["request_id"], r["lane"], r["borrowed_ahead"], r["wait_ms"]) for r in waited] == \
        [("own", "text", 1, 1500)]
    node.finish_local("b0")
    assert node.answered("b0") == b"local b0"


def test_an_own_request_that_gives_up_before_the_runtime_writes_no_wait_row() -> None:
    node = ServiceNode(HELPER, depth=1)
    node.serve("b0", MODEL_H, BORROWED)
    call = make_call("own", "Z")
    node.service.helper.own_acquiring(call, MODEL_Z)
    node.service.helper.own_claimed(call, False)
    node.service.helper.own_claimed(call, True)  # a second word about it changes nothing
    assert node.rows("native_waited_behind_borrowed") == []


def test_own_work_waiting_in_one_lane_queue_refuses_borrowed_work_in_every_lane() -> None:
    """"Stops accepting borrowed work until its own queue is empty": an own request waiting in the
    text lane's router queue refuses a borrowed image request too (and the status says so)."""
    node = ServiceNode(HELPER, depth=1)
    image_link = Link(Endpoint(OWNER, "P"), Endpoint(HELPER, "H"), True, False)
    node.service.install_links(LinkSet.build("image", [image_link]), LinkSet.build("text", [LINK]))
    node.serve("b0", MODEL_H, BORROWED)
    node.serve("n0", MODEL_H)  # waits behind b0 in the text queue
    assert node.local_calls == ["b0"]
    statuses = node.service.lane_statuses()
    assert not statuses["image"].accepting_borrowed and not statuses["text"].accepting_borrowed
    call = Call(reply=FakeReply(), route=image_route(), path="/v1/images/generations", body=b"{}",
                content_type="application/json", parsed={}, stream=False, request_id="bi",
                started=0.0, selector="H")
    result = node.service.serve(call, MODEL_H, "image", BORROWED, public_id="H")
    failures: list[Failure] = []
    result.addErrback(failures.append)
    returned_409(failures[0])
    assert [r["reason"] for r in node.rows("borrowed_returned")] == ["helper_busy_on_arrival"]


def test_an_explicit_load_is_own_work_busy_not_accepting_and_takes_back_waiting_borrowed_work(
        tmp_path: Path) -> None:
    """``POST /router/v1/load`` on a helper holding borrowed work hands back the
    borrowed request that has not started, refuses new borrowed work and reports no idle time while
    the load runs (so no probe is planned on it), and restarts the idle clock when it ends."""
    world, helper, http, base = helper_world(tmp_path)
    running = http.request("POST", base + NODE_CHAT, json=chat("beta"), headers=borrowed_headers())
    settle(world, 0.5)
    waiting = http.request("POST", base + NODE_CHAT, json=chat("beta"), headers=borrowed_headers())
    settle(world, 0.1)
    assert helper.runtime_status().idle_for_ms > 0  # borrowed work does not make it busy

    load = http.request("POST", base + "/router/v1/load", json={"model": "gamma"})
    response = world.run(waiting)
    assert response.code == 409
    assert world.clock.seconds() < 1.0
    assert [r["reason"] for r in rows(world, helper, "borrowed_returned")] == ["own_work_arrived"]
    assert helper.runtime_status().idle_for_ms == 0
    assert not helper.lending.lane_statuses()["text"].accepting_borrowed
    refused = world.run(http.request("POST", base + NODE_CHAT, json=chat("beta"), headers=borrowed_headers()))
    assert refused.code == 409

    assert world.run(running).code == 200
    assert world.run(load).code == 200
    ended = world.clock.seconds()
    assert helper.runtimes.loaded_config("text") == "gamma.kcpps"
    assert helper.lending.lane_statuses()["text"].accepting_borrowed
    settle(world, 1.0)
    assert helper.runtime_status().idle_for_ms == int(round((world.clock.seconds() - ended) * 1000))


def test_an_operators_load_after_borrowed_work_is_never_undone_by_the_restore(tmp_path: Path) -> None:
    """The helper holds ``gamma``; a borrowed request whose lease asks for a restore loads ``beta``
    over it and finishes; before the restore is due (``offload_restore_delay``, 1.5 s) the operator
    loads ``delta``.  An explicit load is own work: the pending restore is cancelled, so ``delta``
    stays loaded however long the node stays quiet."""
    world = World(tmp_path)
    helper = world.node("helper", {"beta": SLOW, "gamma": {**SLOW, "weights": "other"},
                                   "delta": {**SLOW, "weights": "third"}},
                        llama={"extra_args": ["--sim-time-scale", "1"]},
                        cluster=slave_cluster(SLAVE_URL, scheduling_backend_depth=1))
    world.start(helper)
    link = Link(Endpoint("owner", "alpha"), Endpoint("helper", "beta"), True, True)
    helper.lending.install_links(LinkSet.build("image", ()), LinkSet.build("text", [link]))
    http, base = world.network.client(world.clock), f"http://{world.netlocs[helper]}"
    assert world.run(http.request("POST", base + "/router/v1/load", json={"model": "gamma"})).code == 200
    restore = {**borrowed_headers(), "x-routerd-offload-restore": ["1"]}
    borrowed = world.run(http.request("POST", base + NODE_CHAT, json=chat("beta"), headers=restore))
    assert borrowed.code == 200 and helper.runtimes.loaded_config("text") == "beta.kcpps"
    assert helper.restorer.plan.targets == {"text": "gamma.kcpps"}  # a restore is pending
    assert world.run(http.request("POST", base + "/router/v1/load", json={"model": "delta"})).code == 200
    assert helper.runtimes.loaded_config("text") == "delta.kcpps"
    settle(world, 10.0)
    assert helper.runtimes.loaded_config("text") == "delta.kcpps"
    assert helper.restorer.plan.targets == {}


def test_a_load_begun_for_borrowed_work_stops_when_the_helpers_own_request_takes_it_back(
        tmp_path: Path) -> None:
    """The helper holds ``gamma``; a borrowed request starts a 5 s load of ``beta``; a second in,
    the helper's own request for ``gamma`` hands the borrowed one back (409 at once) and the load
    of ``beta``, wanted by nobody now, stops: the own request is answered after gamma's own load
    (1 s), not after beta's 5 s and a switch back."""
    world = World(tmp_path)
    quick = {"kind": "text", "gen_tokens_per_s": 100}
    helper = world.node("helper", {"beta": {**quick, "weights": "b", "load_ms": 5000},
                                   "gamma": {**quick, "weights": "g", "load_ms": 1000}},
                        llama={"extra_args": ["--sim-time-scale", "1"]},
                        cluster=slave_cluster(SLAVE_URL, scheduling_backend_depth=1))
    world.start(helper)
    link = Link(Endpoint("owner", "alpha"), Endpoint("helper", "beta"), True, False)
    helper.lending.install_links(LinkSet.build("image", ()), LinkSet.build("text", [link]))
    http, base = world.network.client(world.clock), f"http://{world.netlocs[helper]}"
    assert world.run(http.request("POST", base + "/router/v1/load", json={"model": "gamma"})).code == 200
    t0 = world.clock.seconds()
    borrowed = http.request("POST", base + NODE_CHAT, json=chat("beta"), headers=borrowed_headers())
    settle(world, 1.0)
    assert helper.runtimes.slot("text").status().state == "loading"
    own = http.request("POST", base + "/v1/chat/completions", json=chat("gamma"))
    response = world.run(borrowed)
    assert response.code == 409 and world.clock.seconds() - t0 < 1.2
    response = world.run(own)
    assert response.code == 200
    assert json.loads(world.run(response.content()))["model"] == "gamma"
    assert world.clock.seconds() - t0 < 3.0, world.clock.seconds() - t0  # not 6 s and more
    assert helper.runtimes.loaded_config("text") == "gamma.kcpps"
