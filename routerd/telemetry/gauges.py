"""The host's figures in /metrics, from the node's latest telemetry reading (a scrape reads nothing of the
host itself): ``routerd_host_cpu_percent``, ``routerd_host_memory_used_bytes``,
``routerd_host_memory_total_bytes`` and, per NVIDIA GPU (labels ``gpu``, its index, and ``name``),
``routerd_gpu_utilization_percent``, ``routerd_gpu_memory_used_bytes``, ``routerd_gpu_memory_total_bytes``,
``routerd_gpu_temperature_celsius``, ``routerd_gpu_power_watts``.  A figure not read is not reported."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from routerd.wire.telemetry import NodeTelemetry

__all__ = ["HostGauges"]

_GPU = (("routerd_gpu_utilization_percent", "GPU utilisation, percent", "utilization_percent"),
        ("routerd_gpu_memory_used_bytes", "GPU memory in use", "memory_used_bytes"),
        ("routerd_gpu_memory_total_bytes", "GPU memory in all", "memory_total_bytes"),
        ("routerd_gpu_temperature_celsius", "GPU temperature", "temperature_c"),
        ("routerd_gpu_power_watts", "GPU power draw", "power_w"))


class HostGauges(Collector):
    def __init__(self, latest: Callable[[], NodeTelemetry | None]) -> None:
        self.latest = latest

    def collect(self) -> Iterator[GaugeMetricFamily]:
        reading = self.latest()
        host = reading.host if reading is not None else None
        cpu = GaugeMetricFamily("routerd_host_cpu_percent", "Host CPU use at the latest telemetry reading, "
                                "percent of all cores")
        used = GaugeMetricFamily("routerd_host_memory_used_bytes",
                                 "Host memory in use (total less available)")
        total = GaugeMetricFamily("routerd_host_memory_total_bytes", "Host memory in all")
        if host is not None:
            cpu.add_metric((), host.cpu_percent)
            used.add_metric((), host.memory_used_bytes)
            total.add_metric((), host.memory_total_bytes)
        yield from (cpu, used, total)
        gpus = reading.gpu.gpus if reading is not None else ()
        for name, documentation, field in _GPU:
            family = GaugeMetricFamily(name, documentation, labels=("gpu", "name"))
            for gpu in gpus:
                value = getattr(gpu, field)
                if value is not None:
                    family.add_metric((str(gpu.index), gpu.name), float(value))
            yield family
