"""docs/contract.md names every field of the telemetry a node sends in its snapshot (§6 "Telemetry") and every
host series /metrics reports from it: the names are read from the wire types and the gauges' code."""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest

import routerd.telemetry.gauges as gauges
from routerd.wire.telemetry import (
    Attention,
    BackendCounters,
    GpuReading,
    GpuReport,
    HostReading,
    NodeTelemetry,
    RuntimeTelemetry,
)

from .contract_doc import section, text

TYPES = (NodeTelemetry, HostReading, GpuReport, GpuReading, RuntimeTelemetry, BackendCounters, Attention)


def _telemetry_definition() -> str:
    six = section(6)
    start = six.index("**Telemetry**")
    end = six.find("\n**", start + 1)
    return six[start:end if end >= 0 else None]


@pytest.mark.parametrize("cls", TYPES, ids=lambda cls: cls.__name__)
def test_every_telemetry_field_is_in_the_contract(cls: type) -> None:
    definition = _telemetry_definition()
    names = set(re.findall(r"[a-z_]+", definition))
    assert [f.name for f in attrs.fields(cls) if f.name not in names] == []


def test_every_host_series_in_metrics_is_in_the_contract() -> None:
    series = set(re.findall(r'"(routerd_(?:host|gpu)_[a-z_]+)"', Path(gauges.__file__).read_text("utf-8")))
    assert len(series) == 8
    assert sorted(name for name in series if f"`{name}`" not in text()) == []
