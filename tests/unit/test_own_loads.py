"""OwnLoads: an explicit load is the node's own work while it runs."""

from __future__ import annotations

from twisted.internet.defer import Deferred

from routerd.catalog.model import Capabilities, ModelConfig
from routerd.inference.own_loads import OwnLoads

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
