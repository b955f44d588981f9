"""Executing a routing target: the replica it names is held exactly while it is served, and a
refused image goes to the guardian the choice resolved, after the refusing node's replica is free."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.defer import ensureDeferred
from twisted.python.failure import Failure

from routerd.catalog.model import ModelConfig
from routerd.errors import HTTPError
from routerd.inference.serving import Served, TargetRunner
from routerd.registry.registry import Registry
from routerd.routing.choice import Forward, choose
from routerd.routing.guardians import GUARDIAN_HEADER, ImageRefused
from routerd.wire.records import ModelRecord
from tests.support import FakeReply
from tests.unit.test_routing_choice import call, guardians, registry, view


class Forwarding:
    """The forwarder's seam: notes how busy the replicas were while a request was forwarded."""

    def __init__(self, reg: Registry, refuse: frozenset[str] = frozenset()) -> None:
        self.reg = reg
        self.refuse = refuse
        #: (local ID forwarded to, its busy count, every replica's busy count, refusal raises)
        self.seen: list[tuple[str, int, int, bool]] = []

    async def forward(self, call: Any, record: ModelRecord, public_id: str, *,
                      image_refusal_raises: bool = False) -> bytes:
        total = sum(self.reg.busy(r, "text") for r in self.reg.records())
        self.seen.append((record.local_id, self.reg.busy(record, "text"), total, image_refusal_raises))
        if record.local_id in self.refuse:
            raise ImageRefused(400, "image input is not supported")
        return f"answer of {record.local_id} as {public_id}".encode()


class NoLocal:
    jobs = None

    async def serve(self, call: Any, model: ModelConfig, public_id: str) -> bytes:
        raise AssertionError("nothing is served locally here")


def runner(reg: Registry, forwarding: Forwarding) -> TargetRunner:
    return TargetRunner(node_id="m", local=NoLocal(), lending=None,  # type: ignore[arg-type]
                        forwarder=forwarding, registry=reg,  # type: ignore[arg-type]
                        loaded_config=lambda _kind: None)


def served(what: Served) -> bytes:
    got: list[bytes | Failure] = []
    ensureDeferred(what).addBoth(got.append)
    assert got, "served at once"
    if isinstance(got[0], Failure):
        got[0].raiseException()
    assert isinstance(got[0], bytes)
    return got[0]


def test_a_forwarded_request_holds_its_replica_while_it_is_forwarded_and_frees_it_after() -> None:
    reg = registry()
    forwarding = Forwarding(reg)
    the_call = call("far")
    target = choose(the_call, view(reg=reg, routes=True))
    assert isinstance(target, Forward)
    assert served(runner(reg, forwarding).serve(the_call, target, None)) == b"answer of far as far"
    assert forwarding.seen == [("far", 1, 1, False)]
    assert reg.busy(target.record, "text") == 0
    assert (the_call.forwarded_to, the_call.model_id) == ("s", "far")


def test_a_refusal_without_a_usable_guardian_is_answered_and_the_replica_freed() -> None:
    reg = registry()
    forwarding = Forwarding(reg, refuse=frozenset({"far-eyes"}))
    the_call = call("far-eyes", image=True)
    the_call.reply = FakeReply()
    # the guardian named ("far") reads no images
    target = choose(the_call, view(reg=reg, routes=True, set_=guardians(("s", "far-eyes", "s/far"))))
    assert isinstance(target, Forward) and target.guard is not None and target.guard.fallback is None
    with pytest.raises(HTTPError) as refused:
        served(runner(reg, forwarding).serve(the_call, target, None))
    assert (refused.value.status, refused.value.code) == (400, "image_not_supported")
    assert forwarding.seen == [("far-eyes", 1, 1, True)]
    assert reg.busy(target.record, "text") == 0 and not the_call.guardian


def test_the_guardian_answers_a_refusal_after_the_refusing_replica_is_released() -> None:
    reg = registry()
    forwarding = Forwarding(reg, refuse=frozenset({"far"}))
    the_call = call("far", image=True)
    reply = FakeReply()
    the_call.reply = reply
    # "far" is text-only but its guardian is on its own node: the master forwards it there first
    target = choose(the_call, view(reg=reg, routes=True, set_=guardians(("s", "far", "s/far-eyes"))))
    assert isinstance(target, Forward) and target.guard is not None and target.guard.fallback is not None
    answer = served(runner(reg, forwarding).serve(the_call, target, None))
    assert answer == b"answer of far-eyes as far"  # under the name the client gave
    # the refusing replica was free while the guardian answered; only the guardian's was held
    assert forwarding.seen == [("far", 1, 1, True), ("far-eyes", 1, 1, False)]
    assert reply.headers[GUARDIAN_HEADER] == b"s/far-eyes" and the_call.guardian
    assert sum(reg.busy(r, "text") for r in reg.records()) == 0
