"""The runtime-status document (``GET /router/v1/node/runtime-status``, contract §6 "Status").

One type end to end: a node builds it, serves it as JSON, the master parses it (strictly: a string
is never a number) and both STT scheduling and the lending planner read the same object.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from routerd.lanes import LANES, Lane
from routerd.wire.lending import Costs, LaneStatus, parse_strictly, strict_converter
from routerd.wire.records import WireError, require_node_id

__all__ = ["RuntimeStatus", "parse_status", "status_to_json"]


@attrs.frozen
class RuntimeStatus:
    """A node's runtime status.

    ``active_stt_config`` is the filename of the STT config loaded on that node ("" when none);
    ``lanes`` holds each lending lane's queue and whether it accepts borrowed work; ``costs`` the
    node's fitted cost coefficients; ``idle_for_ms`` how long it has been idle from its own work.
    """

    node_id: str
    build_version: str = ""
    backend_mode: str = ""
    active_requests: int = 0
    queued_requests: int = 0
    active_stt_config: str = ""
    idle_for_ms: int = 0
    settings_fingerprint: str = ""
    lanes: Mapping[Lane, LaneStatus] = attrs.field(factory=dict)
    costs: Costs = attrs.field(factory=Costs)

    @property
    def workload(self) -> int:
        """Whole-node active plus queued requests."""
        return self.active_requests + self.queued_requests

    def lane(self, lane: Lane) -> LaneStatus:
        return self.lanes.get(lane) or LaneStatus()


def parse_status(obj: Any) -> RuntimeStatus:
    """A runtime status from decoded JSON; ``WireError`` when it does not match the contract.

    Lenient where peers may differ: unknown keys and lanes this build does not know are ignored,
    and a ``null`` STT config means none.
    """
    if not isinstance(obj, Mapping):
        raise WireError("runtime status must be a JSON object")
    doc = dict(obj)
    if doc.get("active_stt_config") is None:
        doc.pop("active_stt_config", None)
    lanes = doc.get("lanes")
    if isinstance(lanes, Mapping):
        doc["lanes"] = {lane: value for lane, value in lanes.items() if lane in LANES}
    status = parse_strictly(doc, RuntimeStatus, "runtime status")
    return attrs.evolve(status, node_id=require_node_id(status.node_id, "runtime status"))


def status_to_json(status: RuntimeStatus) -> dict[str, Any]:
    out: dict[str, Any] = strict_converter.unstructure(status, RuntimeStatus)
    return out
