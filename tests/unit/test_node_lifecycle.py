"""``Node.start()`` and ``Node.stop()`` on a ``task.Clock``: store, startup model, runtimes, timers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest

from routerd.store.runner import StoreClosedError
from tests.unit.node_fixture import TEXT, TOKEN, World

MESSAGES = [{"role": "user", "content": "hello"}]


def runtime(world: World, node: Any, kind: str) -> dict[str, Any]:
    response, body = world.call("GET", node, "/router/v1/state")
    assert response.code == 200
    states: dict[str, dict[str, Any]] = {r["kind"]: r for r in json.loads(body)["runtimes"]}
    return states[kind]


def test_start_opens_the_store(tmp_path: Path) -> None:
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT})
    assert world.stores == {}  # building a node opens nothing

    world.start(node)

    assert world.run(world.stores["solo"].load_samples(0)) == []  # open and migrated


def test_start_preloads_the_startup_model(tmp_path: Path) -> None:
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT, "other": TEXT}, models={"startup_model": "other"})

    world.start(node)

    [process] = world.launcher.spawned
    assert process.running and any(a.endswith("/other.sim.json") for a in process.argv)
    text = runtime(world, node, "text")
    assert (text["state"], text["model_id"]) == ("ready", "other")
    loads = world.run(world.stores["solo"].load_samples(0))
    assert [(s.model_id, s.status) for s in loads] == [("other", "ok")]


def test_without_a_startup_model_start_loads_nothing(tmp_path: Path) -> None:
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT})
    world.start(node)

    assert world.launcher.spawned == []
    assert runtime(world, node, "text")["state"] == "empty"


def test_stop_stops_the_backends_and_closes_the_store(tmp_path: Path) -> None:
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT})
    world.start(node)
    response, _ = world.call("POST", node, "/v1/chat/completions",
                             json={"model": "chat", "messages": MESSAGES, "max_tokens": 2})
    assert response.code == 200
    [process] = world.launcher.spawned
    store = world.stores["solo"]

    world.run(node.stop())

    assert not process.running and process.stop_calls
    with pytest.raises(StoreClosedError):
        world.run(store.runner.run(lambda conn: conn.execute("DELETE FROM request_samples")))


def test_a_request_after_stop_does_not_start_a_backend(tmp_path: Path) -> None:
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT})
    world.start(node)
    world.run(node.stop())

    response, body = world.call("POST", node, "/v1/chat/completions",
                                json={"model": "chat", "messages": MESSAGES, "max_tokens": 2})

    assert response.code == 503  # a stopped node is draining: retry elsewhere
    assert response.headers.getRawHeaders(b"retry-after") == [b"1"]
    error = json.loads(body)["error"]
    assert error["code"] == "draining"
    assert world.launcher.spawned == []


def test_stop_leaves_no_timer_of_a_standalone_node_on_the_clock(tmp_path: Path) -> None:
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT}, models={"startup_model": "chat"})
    world.start(node)
    world.call("POST", node, "/v1/chat/completions", json={"model": "chat", "messages": MESSAGES})
    assert world.clock.getDelayedCalls()  # the refit and decision-log loops run while started

    world.run(node.stop())

    assert world.clock.getDelayedCalls() == []


def test_stop_leaves_no_timer_of_a_master_and_its_slave_on_the_clock(tmp_path: Path) -> None:
    world = World(tmp_path)
    slave = world.node("slave", {"far": TEXT},
                       cluster={"role": "slave", "token": TOKEN, "master_url": "http://master.test:8080",
                                "public_url": "http://slave.test:8080"})
    master = world.node("master", {"chat": TEXT},
                        cluster={"role": "master", "token": TOKEN, "slave_urls": ["http://slave.test:8080"],
                                 "health_interval": "5s"})
    world.start(slave, master)
    world.call("POST", master, "/v1/chat/completions", json={"model": "far", "messages": MESSAGES})
    world.clock.advance(5)  # one health poll cycle is under way or done
    world.network.flush()

    world.run(master.stop())
    world.run(slave.stop())

    assert world.clock.getDelayedCalls() == []
    assert all(not p.running for p in world.launcher.spawned)
    for store in world.stores.values():
        with pytest.raises(StoreClosedError):
            world.run(store.runner.run(lambda conn: conn.execute("SELECT 1")))



def test_start_fails_when_the_startup_model_cannot_load_and_the_node_still_stops_cleanly(
        tmp_path: Path) -> None:
    """The service stops a node whose start failed (routerd.tap); nothing may be left running."""
    world = World(tmp_path)
    broken = {**TEXT, "kcpps": {"extra_args": ["--sim-fail-load"]}}
    node = world.node("solo", {"broken": broken}, models={"startup_model": "broken"})

    with pytest.raises(Exception) as failed:  # noqa: B017 - the error class may move; its code may not
        world.start(node)
    assert getattr(failed.value, "code", None) == "load_failed"

    world.run(node.stop())
    assert world.clock.getDelayedCalls() == []
    assert all(not p.running for p in world.launcher.spawned)


def test_the_decision_retention_setting_reaches_the_decision_log_and_follows_changes(tmp_path: Path) -> None:
    """``offload_decisions_retention``: from the config at start, and from an applied settings change."""
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT}, cluster={"offload_decisions_retention": "2h"})
    world.start(node)
    assert node.decisions.retention_s == 2 * 3600
    node.lending.apply_settings(attrs.evolve(node.lending.settings, offload_decisions_retention=600.0))
    assert node.decisions.retention_s == 600.0


def test_the_node_listens_with_its_configured_backlog_on_ipv4_and_ipv6() -> None:
    """The listening endpoint passes ``server.listen_backlog`` to ``listen(2)`` (not Twisted's 50)
    on the bind's address, IPv6 when the host is one."""
    from twisted.internet.testing import MemoryReactor

    from routerd.config.schema import ServerConfig
    from routerd.tap import listen_endpoint

    cases = (("127.0.0.1:8123", "127.0.0.1", 8123, 1024), ("[::1]:8124", "::1", 8124, 300))
    for bind, host, number, backlog in cases:
        reactor = MemoryReactor()
        listen_endpoint(reactor, ServerConfig(bind=bind, listen_backlog=backlog)).listen(object())
        port, _factory, got_backlog, interface = reactor.tcpServers[0]
        assert (port, got_backlog, interface) == (number, backlog, host)
