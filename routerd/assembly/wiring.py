"""The second phase of a node's assembly: every reference that points forward, filled in one
visible block once all parts exist (``assembly.parts`` built them, each from what existed before
it).  Reading this block is reading who tells whom: local inference tells lending and the restorer
of its own work, lending's settings reach the refit loop and the coordinator, the role's agents read
the documents, and the documents feed the metrics.
"""

from __future__ import annotations

from routerd.assembly.current import Late
from routerd.assembly.parts import NodeParts
from routerd.assembly.reactions import Acquiring, PromptTokens
from routerd.inference.context_gate import ContextGate
from routerd.lending.coordinator import Coordinator


def wire(p: NodeParts, coordinator: Late[Coordinator]) -> None:
    """Fill the late references of ``p``; ``coordinator`` is what the master's in-process
    transport reads."""
    own = p.own_work
    own.lending.set(p.lending)
    own.restorer.set(p.restorer)
    own.own_loads.set(p.own_loads)
    p.local.on_acquire = Acquiring(p.lending.helper, p.restorer)  # own work first, then restore after borrow
    p.local.on_claimed = p.lending.helper.own_claimed
    p.local.blocked = p.assets.blocked  # unresolved portable assets block a load
    p.local.jobs = p.jobs
    p.local.context_gate = ContextGate(p.backend_agent, PromptTokens(p.lending), p.reactor)
    p.settings_applied.refit.set(p._refit_loop)
    p.settings_applied.coordinator = p.coordinator
    p.records_changed.local_records.set(p.documents.local_records)
    if p.coordinator is not None:
        coordinator.set(p.coordinator)
    if p.master is not None:
        p.master.local_status = p.documents.runtime_status
        p.master.when_polled(p.telemetry.refresh)  # the master's own reading, at each health poll
    if p.slave is not None:
        p.slave.snapshot = p.documents.snapshot_wire
    p.decisions.observe(p.metrics.count_decision)
    p.documents.watch(p.metrics, p.coordinator)
