"""The documents a node answers with: model listings, its snapshot, state, runtime status and the
master's inventory.  Pure functions of what they are given (records, catalog, runtime and lending
status): the node wires the inputs, the HTTP edge serialises the result.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import attrs

from routerd import __version__
from routerd.backends.slot import SlotStatus
from routerd.catalog.catalog import Catalog
from routerd.catalog.model import RUNTIME_KINDS, Capabilities, ModelConfig, RuntimeKind
from routerd.lanes import Lane
from routerd.metrics import RuntimeView
from routerd.registry.records import NodeInfo
from routerd.routing.adapters.ollama import ListedModel
from routerd.routing.call import ActiveRequest
from routerd.wire.lending import Costs, LaneStatus
from routerd.wire.records import (
    PROTOCOL_VERSION,
    ModelRecord,
    Snapshot,
    WireError,
    record_from_config,
    record_to_json,
)
from routerd.wire.status import RuntimeStatus
from routerd.wire.telemetry import parse_telemetry, telemetry_to_json

LoadedConfig = Callable[[RuntimeKind], str | None]


def is_loaded(model: ModelConfig, loaded_config: LoadedConfig) -> bool:
    return any(loaded_config(k) == model.filename for k in RUNTIME_KINDS if model.capabilities.serves(k))


def local_records(catalog: Catalog, node_id: str, node_url: str,
                  loaded_config: LoadedConfig) -> list[ModelRecord]:
    return [record_from_config(m, node_id=node_id, node_url=node_url, loaded=is_loaded(m, loaded_config))
            for m in catalog.models]


def with_benchmarks(records: Iterable[ModelRecord],
                    latest: Callable[[str], dict[str, Any] | None]) -> list[ModelRecord]:
    """Records carrying their model's latest benchmark result (contract §9), where there is one."""
    out = []
    for record in records:
        result = latest(record.local_id)
        out.append(record if result is None else attrs.evolve(record, benchmark=result))
    return out


def with_local_loaded(records: Iterable[ModelRecord], node_id: str, catalog: Catalog,
                      loaded_config: LoadedConfig) -> list[ModelRecord]:
    """The master's merged records with its own models' ``loaded`` read live."""
    out = []
    for record in records:
        if record.node_id == node_id:
            model = catalog.get(record.local_id)
            loaded = model is not None and is_loaded(model, loaded_config)
            if record.loaded != loaded:
                record = attrs.evolve(record, loaded=loaded)
        out.append(record)
    return out


def snapshot(node_id: str, node_url: str, records: Sequence[ModelRecord],
             telemetry: dict[str, Any] | None = None) -> Snapshot:
    return Snapshot(node_id=node_id, node_url=node_url, build_version=__version__,
                    protocol_version=PROTOCOL_VERSION, models=tuple(records), telemetry=telemetry)


def _size(model: ModelConfig | None) -> int:
    total = 0
    for path in (model.weight_files().values() if model is not None else ()):
        try:
            total += os.path.getsize(path)
        except OSError:
            pass
    return total


def _modified(model: ModelConfig | None, fallback: float) -> str:
    try:
        mtime = os.path.getmtime(model.path) if model is not None else fallback
    except OSError:
        mtime = 0.0
    return datetime.datetime.fromtimestamp(mtime, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def listing(records: Sequence[ModelRecord], keep: Callable[[Capabilities], bool], catalog: Catalog,
            node_id: str, started_at: float) -> list[ListedModel]:
    """The client listings (``/v1/models``, ``/api/tags``, …): one entry per public ID."""
    out = []
    seen: set[str] = set()
    loaded_ids = {r.public_id for r in records if r.loaded and r.available}
    for record in records:
        caps = record.capabilities
        if not keep(caps) or record.disabled or not record.available or record.public_id in seen:
            continue
        seen.add(record.public_id)
        words = tuple(w for w in ("llm", "multimodal", "embeddings", "image", "stt", "tts")
                      if getattr(caps, w))
        model = catalog.get(record.local_id) if record.node_id == node_id else None
        out.append(ListedModel(
            name=record.public_id, model_hash=record.model_hash, size=_size(model),
            modified_at=_modified(model, started_at), capabilities=words, context=caps.context,
            loaded=record.public_id in loaded_ids))
    return out


def image_listing(records: Sequence[ModelRecord]) -> list[dict[str, Any]]:
    """``/sdapi/v1/sd-models``: one entry per public image ID."""
    out = []
    seen: set[str] = set()
    for record in records:
        image_id = record.public_image_id
        if not record.capabilities.image or not image_id or image_id in seen or record.disabled:
            continue
        seen.add(image_id)
        out.append({"title": image_id, "model_name": image_id, "filename": record.filename,
                    "hash": record.model_hash[:10]})
    return out


def models_document(node_id: str, records: Sequence[ModelRecord], catalog: Catalog) -> dict[str, Any]:
    return {
        "node_id": node_id,
        "models": [record_to_json(r) for r in records],
        "invalid": [{"filename": b.filename, "reason": b.reason} for b in catalog.invalid],
    }


def inventory(node_id: str, node_url: str, nodes: Iterable[NodeInfo],
              records: Sequence[ModelRecord], role: str = "master",
              telemetry: dict[str, Any] | None = None) -> dict[str, Any]:
    """``/router/v1/site/inventory`` of a master, or of a standalone node (``role``; no ``nodes``);
    ``telemetry`` is this node's own reading, each slave's is the one its latest snapshot carried."""
    out = [{"node_id": node_id, "node_url": node_url, "role": role, "healthy": True,
            "build_version": __version__, "telemetry": telemetry}]
    for info in nodes:
        out.append({"node_id": info.node_id, "node_url": info.node_url, "role": "slave",
                    "healthy": info.healthy, "build_version": info.build_version,
                    **node_telemetry(info.telemetry)})
    return {"nodes": out, "models": [record_to_json(r) for r in records], "recipes": []}


def node_telemetry(sent: dict[str, Any] | None) -> dict[str, Any]:
    """A slave's telemetry as the inventory shows it: read strictly, or null with ``telemetry_error``."""
    if sent is None:
        return {"telemetry": None}
    try:
        return {"telemetry": telemetry_to_json(parse_telemetry(sent))}
    except WireError as exc:
        return {"telemetry": None, "telemetry_error": exc.message}


def state(node_id: str, now_ms: int, runtimes: Iterable[SlotStatus], active: Iterable[ActiveRequest],
          held: list[dict[str, Any]], warm: dict[str, dict[str, int]] | None = None) -> dict[str, Any]:
    """``/router/v1/node/state``: runtimes, requests in a backend, requests the router holds and what
    kept each model warm (:func:`warm_counts`)."""
    return {"node_id": node_id, "runtimes": [s.to_json() for s in runtimes],
            "active_requests": [a.to_json(now_ms) for a in active], "held_requests": held,
            "warm": warm or {}}


#: The counts of one model in a node state's ``warm`` (each starts at 0).
WARM_FIELDS = ("swap_batch_served", "swaps_avoided", "kv_slots_saved", "kv_slots_restored", "kv_bytes_saved",
               "kv_bytes_restored")


def warm_counts(swaps: Iterable[tuple[str, str, int, int]],
                kv_slots: Iterable[tuple[str, str, int, int, int, int, int]]) -> dict[str, dict[str, int]]:
    """Per local model ID, since start: requests served ahead of a switch and switches avoided (the
    swap-avoiding order's tallies, per lane: summed) and KV slots saved and restored with their bytes
    (the slot keeper's rows): the tallies ``/metrics`` reads, as a node state's ``warm``.  Only models
    with a tally are listed."""
    out: dict[str, dict[str, int]] = {}

    def add(model: str, **counts: int) -> None:
        entry = out.setdefault(model, dict.fromkeys(WARM_FIELDS, 0))
        for name, value in counts.items():
            entry[name] += value

    for _lane, model, served, avoided in swaps:
        add(model, swap_batch_served=served, swaps_avoided=avoided)
    for _runtime, model, saved, restored, saved_bytes, restored_bytes, _failed in kv_slots:
        add(model, kv_slots_saved=saved, kv_slots_restored=restored, kv_bytes_saved=saved_bytes,
            kv_bytes_restored=restored_bytes)
    return out


#: ``replica_choice`` reasons that count as an affinity miss (``affinity_hit`` is the hit).
_AFFINITY_MISSES = frozenset({"affinity_new", "affinity_gone", "affinity_moved"})


def replica_choice_counts(choices: Iterable[tuple[tuple[str, ...], float]],
                          moves: Iterable[tuple[tuple[str, ...], float]]) -> list[dict[str, Any]]:
    """Per replica (public ID, node), since start: the master's affinity hits and misses, choices by
    load (``least_loaded`` or ``tie_rotation``, in either mode) and session keys moved off it by the
    load bound; from the ``routerd_replica_choices`` children (model, node, mode, reason) and the
    ``routerd_replica_bound_moves`` children (model, node) with their values."""
    out: dict[tuple[str, str], dict[str, Any]] = {}

    def entry(model: str, node: str) -> dict[str, Any]:
        return out.setdefault((model, node), {"public_id": model, "node_id": node, "affinity_hits": 0,
                                              "affinity_misses": 0, "least_loaded": 0, "bound_moves": 0})

    for (model, node, _mode, reason), value in choices:
        field = ("affinity_hits" if reason == "affinity_hit" else
                 "affinity_misses" if reason in _AFFINITY_MISSES else "least_loaded")
        entry(model, node)[field] += int(value)
    for (model, node), value in moves:
        entry(model, node)["bound_moves"] += int(value)
    return [out[key] for key in sorted(out)]


def runtime_status(node_id: str, backend_mode: str, runtimes: Sequence[SlotStatus], stt_config: str,
                   idle_for_ms: int, fingerprint: str, lanes: Mapping[Lane, LaneStatus],
                   costs: Costs) -> RuntimeStatus:
    """``/router/v1/node/runtime-status`` (contract "Status")."""
    return RuntimeStatus(
        node_id=node_id,
        build_version=__version__,
        backend_mode=backend_mode,
        active_requests=sum(s.users for s in runtimes),
        queued_requests=sum(s.waiters for s in runtimes),
        active_stt_config=stt_config,
        idle_for_ms=idle_for_ms,
        settings_fingerprint=fingerprint,
        lanes=lanes,
        costs=costs,
    )


# -- what the metrics read at each scrape -----------------------------------------------------------


class _Slot(Protocol):
    name: str

    def status(self) -> SlotStatus: ...


class _Leases(Protocol):
    def live_leases(self) -> list[dict[str, Any]]: ...


class _Nodes(Protocol):
    def nodes(self) -> Sequence[NodeInfo]: ...


class _Master(Protocol):
    @property
    def registry(self) -> _Nodes: ...


def runtime_views(slots: Iterable[_Slot]) -> list[RuntimeView]:
    """Each backend slot's state, model and load (``routerd_runtime_*``)."""
    views = []
    for slot in slots:
        s = slot.status()
        views.append(RuntimeView(s.kind, slot.name, s.state, s.model_id or "", s.users, s.waiters))
    return views


def node_health(node_id: str, master: _Master | None) -> list[tuple[str, bool]]:
    """This node (healthy while it answers) and, on a master, each slave (``routerd_node_healthy``)."""
    own = [(node_id, True)]
    if master is None:
        return own
    return own + [(n.node_id, n.healthy) for n in master.registry.nodes()]


def lease_sides(owner_lanes: Iterable[str], coordinator: _Leases | None) -> list[tuple[str, str]]:
    """(lane, side) of every live lease: held by this owner, or in the master's book."""
    sides: list[tuple[str, str]] = [(lane, "owner") for lane in owner_lanes]
    if coordinator is not None:
        sides += [(str(lease["lane"]), "book") for lease in coordinator.live_leases()]
    return sides
