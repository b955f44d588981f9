"""What a node does when something happens to it, each a bound method the parts are given instead
of a closure over the node: own work arrives or takes a runtime (lending hears it first, then the
restorer), lending settings change (the decision log's retention, the refit interval, the
coordinator's tick), this node's records change (the site's registry reads them again).  Each holds
the parts it tells; the wiring (``assembly.wiring``) fills those built after it."""

from __future__ import annotations

from collections.abc import Callable

from routerd.assembly.current import Late
from routerd.assembly.refit import CostRefit
from routerd.backends.runtimes import Runtimes
from routerd.catalog.model import ModelConfig, RuntimeKind
from routerd.cluster.master import MasterAgent
from routerd.config.lending import LendingSettings
from routerd.inference.local import LocalInference
from routerd.inference.own_loads import OwnLoads
from routerd.lending.coordinator import Coordinator
from routerd.lending.decisions import DecisionLog
from routerd.lending.helper_side import HelperSide
from routerd.lending.pricing import fewest_prompt_tokens
from routerd.lending.restore import Restorer
from routerd.lending.service import LendingService
from routerd.routing.call import Call
from routerd.wire.lending import lane_key
from routerd.wire.records import ModelRecord


class OwnWork:
    """This node's own work: an own request in a backend, a restore load or an explicit load
    (admin, Ollama preload, startup, reload, recipe) — borrowed work never counts."""

    def __init__(self, runtimes: Runtimes, local: LocalInference) -> None:
        self.runtimes, self.local = runtimes, local
        self.lending: Late[LendingService] = Late("the lending service")
        self.restorer: Late[Restorer] = Late("the restorer")
        self.own_loads: Late[OwnLoads] = Late("the own loads")

    def busy(self) -> bool:
        return self.local.own_busy() or self.restorer.get().loading > 0 or self.own_loads.get().running > 0

    def load_starting(self, model: ModelConfig, kind: RuntimeKind | None) -> None:
        """An explicit load is starting: borrowed work on the runtimes it takes goes back, and a
        pending restore-after-borrow is cancelled (it would load over the operator's model)."""
        self.lending.get().own_work_arrived(self.runtimes.lanes_sharing(kind, model))
        self.restorer.get().own_load()



class Acquiring:
    """An own request is about to acquire its runtime: lending hears it first (own work first, spec
    "A helper's own work"), then the restorer.  Built by the wiring, once both exist."""

    def __init__(self, helper: HelperSide, restorer: Restorer) -> None:
        self.helper, self.restorer = helper, restorer

    def __call__(self, call: Call, model: ModelConfig) -> None:
        self.helper.own_acquiring(call, model)
        self.restorer.acquired(call.route.runtime, model.filename, borrowed=call.borrowed,
                               restore=call.restore_after_borrow or call.guardian_restore)


class PromptTokens:
    """The context gate's prompt estimate (``inference.context_gate``): the fewest tokens the body
    plausibly holds by its model's measured token profile (lending's latest fit), None while the
    model has none."""

    def __init__(self, lending: LendingService) -> None:
        self.lending = lending

    def __call__(self, call: Call, model: ModelConfig) -> int | None:
        return fewest_prompt_tokens(self.lending.work.profile(lane_key("text", model)), len(call.body))


class SettingsApplied:
    """Lending settings took effect: the parts that follow them are told."""

    def __init__(self, decisions: DecisionLog) -> None:
        self.decisions = decisions
        self.refit: Late[CostRefit] = Late("the cost refit")
        self.coordinator: Coordinator | None = None

    def __call__(self, settings: LendingSettings) -> None:
        self.decisions.set_retention(settings.offload_decisions_retention)
        self.refit.get().set_interval(settings.scheduling_refresh_interval)
        if self.coordinator is not None:
            self.coordinator.restart_tick()


class RecordsChanged:
    """This node's records changed (a benchmark result, a bound catalog, a reload): the site's
    registry reads them again; a slave's master sees them at its next poll."""

    def __init__(self, site: MasterAgent | None) -> None:
        self.site = site
        self.local_records: Late[Callable[[], list[ModelRecord]]] = Late("the node's documents")

    def __call__(self, *_why: object) -> None:
        if self.site is not None:
            self.site.registry.update_local(self.local_records.get()())
