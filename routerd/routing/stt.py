"""Selector-less speech-to-text scheduling (cluster spec "Registration and health"; reference §6.6).

A transcription request that names no model goes to one STT-capable config chosen from the
nodes' runtime status.  First match wins:

1. a **local** candidate whose filename is the local node's ``active_stt_config`` (the loaded
   local STT config), however busy the node is;
2. **loaded remote**: remote candidates whose node has that candidate's file as its
   ``active_stt_config``, the smallest whole-node ``active_requests + queued_requests``;
3. **wholly idle**: any candidate, local or remote, on a node with nothing active or queued;
4. **queue locally**: when the node may queue locally (a master or standalone node), its first
   local candidate;
5. **remote queue**: among remote candidates, the smallest ``queued_requests``;
6. otherwise :class:`NoSTT` (503).

Candidates whose node reported no status are left out (older nodes stay usable for explicit
requests).  Ties in 2, 3 and 5 are sorted by ``(workload, node_id|filename)``; the tied prefix is
picked round-robin with one shared counter that advances on every such pick.

Pure: the caller reserves the chosen record (``Registry.reserve(record, "stt")``) before any
config loads, then forwards or serves it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs

from routerd.errors import StatusError
from routerd.wire.records import ModelRecord
from routerd.wire.status import RuntimeStatus

__all__ = ["NoSTT", "RoundRobinCounter", "choose_stt", "stt_candidates"]


class NoSTT(StatusError):
    """No node can take a selector-less transcription: 503 ``backend_error``."""

    def __init__(self) -> None:
        reason = "no compatible transcription configuration is available"
        super().__init__(503, reason, "backend_error", "backend_error")


@attrs.define
class RoundRobinCounter:
    """The shared tie-break counter; one per node, kept across requests."""

    value: int = 0

    def take(self) -> int:
        value = self.value
        self.value += 1
        return value


def stt_candidates(records: Iterable[ModelRecord]) -> list[ModelRecord]:
    """The records that may take a selector-less transcription: STT-capable, available, enabled."""
    return [r for r in records if r.capabilities.stt and r.available and not r.disabled]


def _label(record: ModelRecord) -> str:
    return f"{record.node_id}|{record.filename}"


def _pick(candidates: Sequence[ModelRecord], workload: Callable[[ModelRecord], int],
          counter: RoundRobinCounter) -> ModelRecord | None:
    if not candidates:
        return None
    ordered = sorted(candidates, key=lambda r: (workload(r), _label(r)))
    least = workload(ordered[0])
    tied = [r for r in ordered if workload(r) == least]
    return tied[counter.take() % len(tied)]


def choose_stt(candidates: Iterable[ModelRecord], statuses: Mapping[str, RuntimeStatus],
               own_node_id: str, counter: RoundRobinCounter, *,
               queue_locally: bool = True) -> ModelRecord:
    """The STT record a selector-less transcription goes to; :class:`NoSTT` if none.

    ``statuses`` maps node_id to that node's runtime status (the local one included).
    ``queue_locally`` is true on a master or standalone node (step 4).
    """
    seen: set[tuple[str, str]] = set()
    usable: list[ModelRecord] = []
    for record in stt_candidates(candidates):
        key = (record.node_id, record.filename)
        if record.node_id in statuses and key not in seen:
            seen.add(key)
            usable.append(record)
    local = sorted((r for r in usable if r.node_id == own_node_id), key=_label)
    remote = [r for r in usable if r.node_id != own_node_id]

    def status(record: ModelRecord) -> RuntimeStatus:
        return statuses[record.node_id]

    own = statuses.get(own_node_id)
    if own is not None and own.active_stt_config:
        for record in local:
            if record.filename == own.active_stt_config:
                return record
    loaded = [r for r in remote if status(r).active_stt_config == r.filename]
    chosen = _pick(loaded, lambda r: status(r).workload, counter)
    if chosen is not None:
        return chosen
    idle = [r for r in usable if status(r).workload == 0]
    chosen = _pick(idle, lambda r: 0, counter)
    if chosen is not None:
        return chosen
    if queue_locally and local:
        return local[0]
    chosen = _pick(remote, lambda r: status(r).queued_requests, counter)
    if chosen is not None:
        return chosen
    raise NoSTT()
