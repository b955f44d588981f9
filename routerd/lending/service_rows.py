"""The decision-log rows a node's lending service writes as owner and as helper.

As owner (kind ``dispatch``): a lease updated, cleared or refused, a request lent or returned, with
the lease's helper and slots and the request's class and key name (never the key).  As helper (kind
``helper``): borrowed work handed back, and this node's own request that waited behind borrowed
work (behind how many, for how long).  On any node (kind ``queue``): a request the swap-avoiding
order passed over.  The log is read live from the service (it may be replaced).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from routerd.lending.priority import CLASSES
from routerd.lending.queue import LaneQueue
from routerd.lending.queue_entries import SwapPass
from routerd.wire.lending import Lane, Lease


class _Recorder(Protocol):
    def record(self, kind: str, outcome: str, **fields: Any) -> None: ...


class _Logged(Protocol):
    @property
    def decisions(self) -> _Recorder | None:
        """The node's decision log (None: it keeps none); read at every row."""


class ServiceRows:
    """Writes the service's rows (see the module doc); nothing when the node keeps no log."""

    def __init__(self, node_id: str, queues: Mapping[Lane, LaneQueue], service: _Logged) -> None:
        self.node_id = node_id
        self.queues = queues
        self.service = service

    def dispatch(self, outcome: str, lane: Lane, model_id: str, lease: Lease | None, *,
                 reason: str = "", trigger: str = "", request_id: str = "", wait_ms: int = 0) -> None:
        decisions = self.service.decisions
        if decisions is None:
            return
        queue = self.queues[lane]
        fields: dict[str, Any] = {"lane": lane, "owner_node_id": self.node_id,
                                  "owner_model_id": model_id, "lent_out": queue.lent_count(model_id)}
        if lease is not None:
            fields.update(helper_node_id=lease.helper_node_id, helper_model_id=lease.helper_model_id,
                          slots=lease.slots())
        if reason:
            fields["reason"] = reason
        if trigger:
            fields["trigger"] = trigger
        if request_id:
            fields["request_id"] = request_id
            entry = queue.entry(request_id)
            if entry is not None:  # its class and key's name (never the key)
                fields["priority"] = CLASSES[entry.priority]
                if entry.key_name:
                    fields["key_name"] = entry.key_name
        if wait_ms:
            fields["wait_ms"] = wait_ms
        decisions.record("dispatch", outcome, **fields)

    def waited(self, lane: Lane, request_id: str, ahead: int, wait_ms: int) -> None:
        """This node's own request waited behind borrowed work: say behind how many, how long."""
        decisions = self.service.decisions
        if decisions is not None:
            decisions.record("helper", "native_waited_behind_borrowed", lane=lane, request_id=request_id,
                             borrowed_ahead=ahead, wait_ms=wait_ms)

    def passed_over(self, lane: Lane, passed: SwapPass) -> None:
        """The swap-avoiding order served the loaded model ahead of a waiting request: name it (its
        model as owner, the loaded model as helper), its class, key name and wait so far."""
        decisions = self.service.decisions
        if decisions is None:
            return
        fields: dict[str, Any] = {
            "lane": lane, "request_id": passed.passed, "reason": "swap_avoided", "wait_ms": passed.waited_ms,
            "owner_model_id": passed.passed_model_id, "helper_model_id": passed.model_id}
        entry = self.queues[lane].entry(passed.passed)
        if entry is not None:
            fields["priority"] = CLASSES[entry.priority]
            if entry.key_name:
                fields["key_name"] = entry.key_name
        decisions.record("queue", "passed_over", **fields)

    def helper(self, outcome: str, lane: Lane, request_id: str, reason: str) -> None:
        decisions = self.service.decisions
        if decisions is not None:
            decisions.record("helper", outcome, lane=lane, reason=reason, request_id=request_id)


__all__ = ["ServiceRows"]
