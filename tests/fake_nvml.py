"""A fake NVML (the functions and errors of ``pynvml`` that routerd.telemetry.host calls), for the unit and
browser tests of the rack telemetry: GPUs on a machine that has none."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import attrs

GIB = 1024 ** 3


class NVMLError(Exception):
    pass


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801 - pynvml's name
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - pynvml's name
    pass


class NVMLError_GpuIsLost(NVMLError):  # noqa: N801 - pynvml's name
    pass


@attrs.define
class FakeGpu:
    name: str
    util: int
    used: int
    total: int
    temp: int
    power_mw: int | None
    limit_mw: int = 300_000


class FakeNvml:
    NVMLError = NVMLError
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, gpus: list[FakeGpu], *, init_error: Exception | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.count_error: Exception | None = None
        self.inits = 0

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's name
        self.inits += 1
        if self.init_error is not None:
            raise self.init_error

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        if self.count_error is not None:
            raise self.count_error
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:  # noqa: N802
        return self.gpus[index]

    def nvmlDeviceGetName(self, gpu: FakeGpu) -> bytes:  # noqa: N802
        return gpu.name.encode()

    def nvmlDeviceGetUtilizationRates(self, gpu: FakeGpu) -> Any:  # noqa: N802
        return SimpleNamespace(gpu=gpu.util, memory=0)

    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGpu) -> Any:  # noqa: N802
        return SimpleNamespace(used=gpu.used, total=gpu.total, free=gpu.total - gpu.used)

    def nvmlDeviceGetTemperature(self, gpu: FakeGpu, sensor: int) -> int:  # noqa: N802
        assert sensor == self.NVML_TEMPERATURE_GPU
        return gpu.temp

    def nvmlDeviceGetPowerUsage(self, gpu: FakeGpu) -> int:  # noqa: N802
        if gpu.power_mw is None:
            raise NVMLError_NotSupported("Not Supported")
        return gpu.power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, gpu: FakeGpu) -> int:  # noqa: N802
        return gpu.limit_mw
