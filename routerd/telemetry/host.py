"""Readers of the host: CPU and memory through ``psutil``, NVIDIA GPUs through NVML (``nvidia-ml-py``'s
``pynvml``).  Each is a small object a test replaces (a fake NVML module, a fake ``psutil``).

A machine without an NVIDIA driver reads as GPU state ``none`` (NVML's library or driver is missing, or it
counts no device), checked once: a driver does not appear while the node runs.  Any other NVML failure reads
as state ``error`` with NVML's message and is tried again at the next reading; it never stops the reading of
the rest.
"""

from __future__ import annotations

from typing import Any

from twisted.logger import Logger

from routerd.wire.telemetry import GpuReading, GpuReport, HostReading

__all__ = ["HostReader", "NvmlGpus"]

log = Logger()


class HostReader:
    """CPU use since the previous reading (``psutil.cpu_percent(None)``: the first reading is 0) and memory
    in use (total less available, as ``free`` counts it)."""

    def __init__(self, psutil_module: Any = None) -> None:
        if psutil_module is None:
            import psutil

            psutil_module = psutil
        self.psutil = psutil_module
        self.psutil.cpu_percent(None)  # starts the first interval

    def read(self) -> HostReading:
        memory = self.psutil.virtual_memory()
        return HostReading(cpu_percent=float(self.psutil.cpu_percent(None)),
                           cpu_count=int(self.psutil.cpu_count() or 0),
                           memory_used_bytes=int(memory.total - memory.available),
                           memory_total_bytes=int(memory.total))


def _load_pynvml() -> Any:
    import pynvml

    return pynvml


#: NVML's own errors that mean "no NVIDIA GPU here" rather than a fault.
_ABSENT = ("NVMLError_LibraryNotFound", "NVMLError_DriverNotLoaded", "NVMLError_NoPermission",
           "NVMLError_NotFound")


class NvmlGpus:
    """Every GPU NVML counts: utilisation, memory, temperature and power (a figure the device does not
    report is None)."""

    def __init__(self, nvml: Any = None) -> None:
        self.nvml = nvml if nvml is not None else _load_pynvml()
        self._started = False
        self._absent: str | None = None  # why there is no GPU, once known

    def _absent_error(self, exc: BaseException) -> bool:
        return any(isinstance(exc, cls) for name in _ABSENT
                   if isinstance(cls := getattr(self.nvml, name, None), type))

    def read(self) -> GpuReport:
        if self._absent is not None:
            return GpuReport(state="none", reason=self._absent)
        nvml = self.nvml
        try:
            if not self._started:
                nvml.nvmlInit()
                self._started = True
            count = int(nvml.nvmlDeviceGetCount())
            if count == 0:
                self._absent = "NVML counts no GPU"
                return GpuReport(state="none", reason=self._absent)
            return GpuReport(state="ok", gpus=tuple(self._device(i) for i in range(count)))
        except nvml.NVMLError as exc:
            if not self._started and self._absent_error(exc):
                self._absent = f"no NVIDIA GPU: {exc}"
                return GpuReport(state="none", reason=self._absent)
            log.warn("reading the GPUs through NVML failed: {reason}", reason=str(exc))
            return GpuReport(state="error", reason=f"NVML: {exc}")

    def _device(self, index: int) -> GpuReading:
        nvml = self.nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        name = nvml.nvmlDeviceGetName(handle)
        if isinstance(name, bytes):
            name = name.decode("utf-8", "replace")
        utilization = self._optional(lambda: float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
        memory = self._optional(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        temperature = self._optional(
            lambda: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)))
        power = self._optional(lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)
        limit = self._optional(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0)
        return GpuReading(index=index, name=str(name), utilization_percent=utilization,
                          memory_used_bytes=int(memory.used) if memory is not None else None,
                          memory_total_bytes=int(memory.total) if memory is not None else None,
                          temperature_c=temperature, power_w=power, power_limit_w=limit)

    def _optional(self, read: Any) -> Any:
        """A figure, or None when the device does not support it (any other NVML error propagates)."""
        try:
            return read()
        except self.nvml.NVMLError_NotSupported:
            return None
