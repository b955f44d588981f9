"""What the lease planner reads: per-model facts from the registry and each node's status as one
lane's plan sees it (``routerd.lending.planner`` re-exports the public names)."""

from __future__ import annotations

import attrs

from routerd.families import single_process
from routerd.wire.lending import LANES, Lane, ModelCost
from routerd.wire.status import RuntimeStatus

#: An unloaded helper waits this many times ``offload_probe_idle`` before a probe.
UNLOADED_PROBE_FACTOR = 12


@attrs.frozen
class ModelFacts:
    """What the registry knows of one model on one node, as the planner needs it.

    ``config_filename`` identifies the config the helper would load (compared with the lane's
    ``active_config`` and looked up in load costs).  ``context`` is the text context window.
    ``eligible`` is false for a model that is disabled or unavailable: its pairs are skipped with
    ``owner_unavailable`` or ``helper_unavailable``.  ``ineligible`` says why a (text) model no
    longer meets lending eligibility (empty when it does): its pairs are skipped with reason
    ``model_ineligible``.
    """

    config_filename: str
    context: int = 0
    eligible: bool = True
    multimodal: bool = False
    ineligible: str = ""


#: Key of :class:`ModelFacts`: lane, node id, lane-specific model id.
FactKey = tuple[Lane, str, str]


class NodeView:
    """One node's status as one lane's plan reads it (built once per node and lane a plan)."""

    __slots__ = ("accepting", "active", "idle_ms", "fits", "loads", "displaceable", "restore_all", "queue")

    def __init__(self, status: RuntimeStatus, lane: Lane, section: str) -> None:
        lane_status = status.lane(lane)
        self.accepting = lane_status.accepting_borrowed
        self.active = lane_status.active_config
        self.idle_ms = max(int(status.idle_for_ms), 0)
        #: The node's fits for this lane's section, by model id (a later duplicate wins).
        self.fits: dict[str, ModelCost] = {c.model_id: c for c in status.costs.models if c.section == section}
        self.loads: dict[str, float] = {c.config_filename: c.load_ms for c in status.costs.loads}
        #: Every config a load in this lane would push out (for a config not among them).
        self.displaceable = displaced_configs(status, lane, "")
        self.restore_all = self.restore_of(self.displaceable)
        #: The lane's queue by model id.
        self.queue = {q.model_id: q for q in lane_status.queue}

    def restore(self, config: str) -> float | None:
        """Load time of every config that loading ``config`` pushes out (None when one is unpriced)."""
        if config in self.displaceable:
            return self.restore_of([c for c in self.displaceable if c != config])
        return self.restore_all

    def restore_of(self, configs: list[str]) -> float | None:
        total = 0.0
        for config in configs:
            load = self.loads.get(config)
            if load is None:
                return None
            total += load
        return total


def displaced_configs(status: RuntimeStatus, lane: Lane, config_filename: str) -> list[str]:
    """Configs a helper would push out to load ``config_filename`` for ``lane``.

    The lane's own runtime always; in a family where one process serves every lane (KoboldCpp),
    the other lane's config and the speech config go too.
    """
    found: list[str] = []
    candidates = [status.lane(lane).active_config]
    if single_process(status.backend_mode):
        candidates += [status.lane(other).active_config for other in LANES if other != lane]
        candidates.append(status.active_stt_config)
    for config in candidates:
        if config and config != config_filename and config not in found:
            found.append(config)
    return found


__all__ = ["UNLOADED_PROBE_FACTOR", "FactKey", "ModelFacts", "NodeView", "displaced_configs"]
