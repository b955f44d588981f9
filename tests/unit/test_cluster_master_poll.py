"""The master's health-poll cycle at scale: one registry rebuild per cycle."""

from __future__ import annotations

from typing import Any, cast

import pytest
from twisted.internet import defer
from twisted.internet.task import Clock

import routerd.registry.registry as registry_module
from routerd.clients.node_client import ClusterError, NodeClient
from routerd.cluster.master import MasterAgent
from routerd.registry.identity import MemoryPublicIdStore
from routerd.registry.registry import Registry
from routerd.urls import AllowList
from routerd.wire.records import ModelRecord, Snapshot
from routerd.wire.status import RuntimeStatus

SLAVES = 60


class Slaves:
    """A stand-in for the cluster client: every URL answers its own snapshot, ``down`` ones fail."""

    def __init__(self, down: set[str]) -> None:
        self.down = down

    def models(self, url: str) -> defer.Deferred[Snapshot]:
        if url in self.down:
            return defer.fail(ClusterError(f"{url} refused the connection"))
        n = url.rsplit("-", 1)[1]
        record = ModelRecord(local_id=f"own-{n}", public_id=f"own-{n}", filename=f"own-{n}.kcpps",
                             model_hash="m" * 64, config_hash="c" * 64)
        return defer.succeed(Snapshot(node_id=f"slave-{n}", node_url=url, build_version="x",
                                      protocol_version=2, models=(record,)))


def test_one_poll_cycle_over_many_slaves_rebuilds_the_registry_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before, every accepted snapshot rebuilt every record and public ID (N rebuilds a cycle)."""
    urls = tuple(f"http://slave-{n}" for n in range(SLAVES))
    registry = Registry("master", "", MemoryPublicIdStore())
    calls: list[int] = []
    real = registry_module.assign_public_ids

    def counting(*args: Any, **kwargs: Any) -> list[ModelRecord]:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(registry_module, "assign_public_ids", counting)
    allowed = AllowList()
    master = MasterAgent(node_id="master", slave_urls=urls, registry=registry,
                         client=cast(NodeClient, Slaves({"http://slave-7"})), routing_allowed=allowed,
                         clock=Clock(), health_interval=10.0, local_status=lambda: RuntimeStatus("master"))
    done = master.poll_all()
    assert done.called
    assert len(calls) == 1
    assert len(registry.nodes()) == SLAVES - 1 and all(n.healthy for n in registry.nodes())
    assert {r.public_id for r in registry.records()} == {f"own-{n}" for n in range(SLAVES) if n != 7}
    assert allowed.permits("http://slave-12/router/v1/node/models")


def test_a_poll_sent_before_a_registration_cannot_mark_the_registered_node_unhealthy() -> None:
    """The first cycle runs before a slave listens: its failure, arriving after the slave registered,
    left the node unhealthy until the next cycle (no replicas for its models meanwhile).  A later
    cycle's failure still counts."""
    url = "http://slave-1"
    registry = Registry("master", "", MemoryPublicIdStore())
    pending: list[defer.Deferred[Snapshot]] = []

    class Late(Slaves):
        def models(self, url: str) -> defer.Deferred[Snapshot]:
            d: defer.Deferred[Snapshot] = defer.Deferred()
            pending.append(d)
            return d

    master = MasterAgent(node_id="master", slave_urls=(url,), registry=registry,
                         client=cast(NodeClient, Late(set())), routing_allowed=AllowList(),
                         clock=Clock(), health_interval=10.0, local_status=lambda: RuntimeStatus("master"))
    first = master.poll_all()
    snapshot = Slaves(set()).models(url).result
    master.register({"node_id": snapshot.node_id, "node_url": url, "build_version": "x",
                     "protocol_version": 2, "models": []})
    pending.pop().errback(ClusterError(f"{url} refused the connection"))
    assert first.called
    assert [n.healthy for n in registry.nodes()] == [True]
    second = master.poll_all()
    pending.pop().errback(ClusterError(f"{url} refused the connection"))
    assert second.called
    assert [n.healthy for n in registry.nodes()] == [False]
