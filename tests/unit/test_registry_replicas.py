"""Replica choice and reservations (reference §6.3; scenarios 4, 6, 21)."""

from __future__ import annotations

import pytest

from routerd.catalog.model import Capabilities, RuntimeKind
from routerd.registry.replicas import (
    BusyCounts,
    NoReplica,
    RoundRobin,
    busy_key,
    choose_replica,
    fits_context,
)
from routerd.wire.records import ModelRecord

ME = "master"


def rec(node_id: str, local_id: str = "llm", *, available: bool = True, disabled: bool = False,
        caps: Capabilities | None = None) -> ModelRecord:
    return ModelRecord(local_id=local_id, public_id=local_id, node_id=node_id, available=available,
                       disabled=disabled, capabilities=caps or Capabilities(llm=True))


def choose(replicas: list[ModelRecord], busy: BusyCounts, rotation: RoundRobin,
           ready: bool = True, lane: RuntimeKind = "text") -> ModelRecord:
    return choose_replica(replicas, name="llm", lane=lane, own_node_id=ME, busy=busy,
                          local_ready=lambda _k, _r: ready, rotation=rotation)


def test_idle_local_replica_comes_first() -> None:
    busy, rotation = BusyCounts(), RoundRobin()
    assert choose([rec("slave-a"), rec(ME)], busy, rotation).node_id == ME


def test_master_busy_then_remotes_rotate_then_busy_local() -> None:
    """Scenario 4: master, slave-a, slave-b; holding every pick gives master, slave-a, slave-b."""
    busy, rotation = BusyCounts(), RoundRobin()
    replicas = [rec("slave-b"), rec(ME), rec("slave-a")]
    held = []
    for _ in range(3):
        record = choose(replicas, busy, rotation)
        held.append(busy.reserve(record, "text", local=record.node_id == ME))
    assert [r.record.node_id for r in held] == [ME, "slave-a", "slave-b"]
    assert choose(replicas, busy, rotation).node_id == "slave-a", "remote busy state is ignored"


def test_local_lane_not_ready_sends_the_request_to_a_remote() -> None:
    busy, rotation = BusyCounts(), RoundRobin()
    assert choose([rec(ME), rec("slave-a")], busy, rotation, ready=False).node_id == "slave-a"


def test_busy_local_is_used_when_no_remote_is_available() -> None:
    busy, rotation = BusyCounts(), RoundRobin()
    local = rec(ME)
    busy.reserve(local, "text", local=True)
    assert choose([local, rec("slave-a", available=False)], busy, rotation) is local


def test_unavailable_disabled_or_unready_replicas_give_no_replica() -> None:
    busy, rotation = BusyCounts(), RoundRobin()
    with pytest.raises(NoReplica) as caught:
        choose([rec("slave-a", available=False), rec("slave-b", disabled=True), rec(ME)],
               busy, rotation, ready=False)
    err = caught.value
    assert (err.status, err.type, err.reason) == (
        502, "backend_error", 'model "llm" has no available replicas')


def test_no_replica_on_the_image_lane_names_an_image_model() -> None:
    with pytest.raises(NoReplica) as caught:
        choose([], BusyCounts(), RoundRobin(), lane="image")
    assert caught.value.reason == 'image model "llm" has no available replicas'


def test_busy_counts_are_per_lane() -> None:
    """Scenario 6: a combined config busy on its text lane is still idle on its image lane."""
    busy, rotation = BusyCounts(), RoundRobin()
    combo = rec(ME, "combo", caps=Capabilities(llm=True, image=True))
    remote = rec("slave-a", "combo", caps=Capabilities(llm=True, image=True))
    busy.reserve(combo, "text", local=True)
    assert choose([combo, remote], busy, rotation, lane="image") is combo
    assert busy_key(combo, "image") == "master:combo:image"


def test_reservation_release_is_idempotent() -> None:
    busy = BusyCounts()
    record = rec(ME)
    first = busy.reserve(record, "text", local=True)
    second = busy.reserve(record, "text", local=True)
    assert busy.count(record, "text") == 2
    first.release()
    first.release()
    assert busy.count(record, "text") == 1
    second.release()
    assert busy.count(record, "text") == 0
    assert busy.snapshot() == {}


def test_round_robin_counters_are_per_key() -> None:
    rotation = RoundRobin()
    assert [rotation.take("a"), rotation.take("a"), rotation.take("b")] == [0, 1, 0]


@pytest.mark.parametrize("context, needed, fits", [
    (4096, 0, True),
    (4096, 4096, True),
    (4096, 4097, False),
    (0, 0, True),
    (0, 1, False),
])
def test_context_fit(context: int, needed: int, fits: bool) -> None:
    """Scenario 21: 4096 fits 0 and 4096, not 4097; no stated context fits only an unsized request."""
    assert fits_context(context, needed) is fits
