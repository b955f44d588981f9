"""A node's telemetry (contract §6 "Telemetry"): the host's CPU and memory, its NVIDIA GPUs, each
backend runtime's queue, load history and own counters, and the "needs attention" flags.

A node builds it (:mod:`routerd.telemetry`), sends it in its snapshot (``GET /router/v1/node/models``,
the master's health poll) as ``telemetry``, and the master shows it in the site inventory.  The snapshot
carries it as a plain JSON object so that a bad telemetry part never refuses the node's models; the master
reads it with :func:`parse_telemetry` (strict: a string is never a number) when it shows it.
"""

from __future__ import annotations

from typing import Any

import attrs

from routerd.wire.records import converter, strict_scalars, structure_strictly

__all__ = [
    "ATTENTION_CODES",
    "GPU_STATES",
    "Attention",
    "BackendCounters",
    "GpuReading",
    "GpuReport",
    "HostReading",
    "NodeTelemetry",
    "RuntimeTelemetry",
    "parse_telemetry",
    "telemetry_to_json",
]

#: ``gpu.state``: ``ok`` (NVML answered: ``gpus`` lists each), ``none`` (no NVIDIA driver or no GPU),
#: ``error`` (NVML failed: ``reason`` says how; the rest of the telemetry stands).
GPU_STATES = ("ok", "none", "error")
#: Why a node or runtime needs attention (``attention[].code``).
ATTENTION_CODES = ("swap_thrash", "long_queue", "failed_requests", "failed_loads")


@attrs.frozen(kw_only=True)
class HostReading:
    cpu_percent: float
    cpu_count: int
    memory_used_bytes: int
    memory_total_bytes: int


@attrs.frozen(kw_only=True)
class GpuReading:
    """One GPU; a figure its driver does not report is None."""

    index: int
    name: str
    utilization_percent: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None


@attrs.frozen(kw_only=True)
class GpuReport:
    state: str
    reason: str = ""
    gpus: tuple[GpuReading, ...] = ()


@attrs.frozen(kw_only=True)
class BackendCounters:
    """What a backend reports of itself (llama-server ``--metrics``: its ``/metrics``).  The rates are
    llama-server's averages over the window since the previous scrape (this node's previous reading)."""

    tokens_per_second: float | None = None
    prompt_tokens_per_second: float | None = None
    requests_processing: int | None = None
    requests_deferred: int | None = None
    prompt_tokens_total: int | None = None
    prompt_tokens_cached_total: int | None = None
    tokens_predicted_total: int | None = None
    n_tokens_max: int | None = None


@attrs.frozen(kw_only=True)
class RuntimeTelemetry:
    """One backend runtime: ``queue_depth`` counts the requests waiting for it (in the router's queue of
    its lane and at the runtime: a load, a switch or a free slot); ``loaded_since_ms`` is when its model
    became ready (None unless ready); ``last_load_ms`` how long its last load took; ``loads`` and
    ``failed_loads`` count its loads within the attention window."""

    kind: str
    backend: str
    state: str
    model_id: str | None = None
    queue_depth: int = 0
    loaded_since_ms: int | None = None
    last_load_ms: int | None = None
    loads: int = 0
    failed_loads: int = 0
    counters: BackendCounters | None = None
    counters_error: str = ""


@attrs.frozen(kw_only=True)
class Attention:
    code: str
    message: str
    runtime: str | None = None


@attrs.frozen(kw_only=True)
class NodeTelemetry:
    taken_ms: int
    window_s: float
    host: HostReading | None = None
    host_error: str = ""
    gpu: GpuReport = attrs.field(factory=lambda: GpuReport(state="none"))
    runtimes: tuple[RuntimeTelemetry, ...] = ()
    failed_requests: int = 0
    attention: tuple[Attention, ...] = ()


def _strict_float(value: Any, _type: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a number, got {type(value).__name__}")
    return float(value)


def _make_converter() -> Any:
    conv = strict_scalars(converter.copy())
    conv.register_structure_hook(float, _strict_float)
    return conv


_converter = _make_converter()


def parse_telemetry(obj: Any) -> NodeTelemetry:
    """Telemetry from decoded JSON; ``WireError`` naming the bad field."""
    telemetry: NodeTelemetry = structure_strictly(_converter, obj, NodeTelemetry, "telemetry")
    return telemetry


def telemetry_to_json(telemetry: NodeTelemetry) -> dict[str, Any]:
    out: dict[str, Any] = _converter.unstructure(telemetry, NodeTelemetry)
    return out
