"""OwnLoads: an explicit load is the node's own work while it runs: borrowed work on its runtime goes back,
and a pending restore-after-borrow is cancelled (it would load over what the operator asked for)."""

from __future__ import annotations

from typing import Any, cast

import attrs
from twisted.internet.defer import Deferred

from routerd.assembly.reactions import OwnWork
from routerd.catalog.model import Capabilities, ModelConfig
from routerd.inference.own_loads import OwnLoads
from routerd.lending.restore import Restorer
from tests.unit.test_lending_restore import DELAY, Helper

MODEL = ModelConfig(local_id="m", filename="m.kcpps", path="/m.kcpps", backend_mode="llama_sdcpp",
                    capabilities=Capabilities(llm=True), config_hash="h")


def test_a_load_counts_as_own_work_from_before_it_starts_until_it_ends_either_way() -> None:
    events: list[str] = []
    loads: list[Deferred[None]] = []

    def load(_model: ModelConfig, kind: object) -> Deferred[None]:
        events.append(f"load {kind}")
        d: Deferred[None] = Deferred()
        loads.append(d)
        return d

    own = OwnLoads(load, starting=lambda _m, kind: events.append(f"starting {kind}"),
                   done=lambda: events.append("done"))
    first = own.load(MODEL, "text")
    second = own.run(MODEL, None, lambda: load(MODEL, None))
    assert own.running == 2
    assert events == ["starting text", "load text", "starting None", "load None"]  # borrowed work first
    loads[0].callback(None)
    assert own.running == 1 and events[-1] == "done"
    failures: list[object] = []
    second.addErrback(failures.append)
    loads[1].errback(RuntimeError("load failed"))
    assert own.running == 0 and len(failures) == 1 and events.count("done") == 2
    assert first.called


# -- an explicit load and a pending restore-after-borrow ---------------------------------------------------


@attrs.define
class Node:
    """What ``OwnWork`` tells when an explicit load starts: lending (which lanes hand borrowed work
    back) and the real restorer on a fake clock, over the restore tests' helper runtimes."""

    helper: Helper = attrs.Factory(Helper)
    requests: int = 0  # own requests in a backend
    handed_back: list[tuple[str, ...]] = attrs.Factory(list)

    def own_work_arrived(self, lanes: tuple[str, ...]) -> tuple[None, int]:
        self.handed_back.append(tuple(lanes))
        return None, 0

    def lanes_sharing(self, kind: str | None, _model: ModelConfig) -> tuple[str, ...]:
        return ("text",) if kind in (None, "text") else (str(kind),)

    def own_busy(self) -> bool:
        return self.requests > 0

    def build(self) -> tuple[OwnWork, OwnLoads, Restorer, list[Deferred[None]]]:
        own = OwnWork(cast(Any, self), cast(Any, self))
        restorer = self.helper.restorer()
        restorer.own_busy = own.busy  # the node's whole own work, as the assembly wires it
        loads: list[Deferred[None]] = []

        def load(_model: ModelConfig, _kind: object) -> Deferred[None]:
            loads.append(Deferred())
            return loads[-1]

        own_loads = OwnLoads(load, starting=own.load_starting, done=lambda: None)
        own.lending.set(cast(Any, self))
        own.restorer.set(restorer)
        own.own_loads.set(own_loads)
        return own, own_loads, restorer, loads


def test_an_operators_load_cancels_a_pending_restore_after_borrow() -> None:
    """Borrowed work displaced x.kcpps (restore flag); before the restore is due the operator loads
    m: the restore never comes, so it cannot load x.kcpps over m."""
    node = Node()
    _own, own_loads, restorer, loads = node.build()
    node.helper.borrowed_job(restorer)
    node.helper.clock.advance(DELAY / 2)
    own_loads.load(MODEL, "text")
    assert node.handed_back == [("text",)]  # borrowed work on that runtime went back first
    loads[0].callback(None)
    node.helper.clock.advance(10 * DELAY)
    assert node.helper.loads == []
    assert node.helper.clock.getDelayedCalls() == []


def test_a_restore_due_while_an_explicit_load_runs_waits_for_it() -> None:
    """A restore armed after an explicit load began (borrowed work on another runtime) is deferred
    while that load runs, as for an own request: an explicit load is own work."""
    node = Node()
    _own, own_loads, restorer, loads = node.build()
    node.helper.loaded["image"] = "sd-a.kcpps"
    own_loads.load(MODEL, "text")
    restorer.acquired("image", "sd-b.kcpps", borrowed=True, restore=True)
    node.helper.loaded["image"] = "sd-b.kcpps"
    node.helper.clock.advance(DELAY)
    assert node.helper.loads == []  # the load still runs: wait another delay
    loads[0].callback(None)
    node.helper.clock.advance(DELAY)
    assert node.helper.loads == [("image", "sd-a.kcpps")]
