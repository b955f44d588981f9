"""The ``tracing`` section (contract §2): OpenTelemetry traces sent over OTLP/HTTP, off by default."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from routerd.config.reader import Reader
from routerd.config.schema import TracingConfig

TRACING_KEYS = ("enabled", "endpoint", "service_name", "sampling_ratio", "headers")


def parse_tracing(section: Mapping[str, Any], reader: Reader) -> TracingConfig:
    """The ``tracing`` section, every problem added to the reader's errors."""
    default = TracingConfig()
    enabled = reader.boolean(section, "tracing", "enabled", default.enabled)
    endpoint = reader.string(section, "tracing", "endpoint", default.endpoint)
    if not endpoint.startswith(("http://", "https://")):
        reader.errs.add("tracing.endpoint", f"must be an http:// or https:// URL, got {endpoint!r}")
        endpoint = default.endpoint
    service = reader.string(section, "tracing", "service_name", default.service_name) or default.service_name
    ratio = reader.number(section, "tracing", "sampling_ratio", default.sampling_ratio)
    if not 0.0 <= ratio <= 1.0:
        reader.errs.add("tracing.sampling_ratio", f"must be between 0 and 1, got {ratio}")
        ratio = default.sampling_ratio
    raw = section.get("headers", {})
    headers: list[tuple[str, str]] = []
    if not isinstance(raw, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                               for k, v in raw.items()):
        reader.errs.add("tracing.headers", "must be a mapping of header names to string values")
    else:
        headers = sorted(raw.items())
    reader.unknown(section, "tracing", TRACING_KEYS)
    return TracingConfig(enabled=enabled, endpoint=endpoint, service_name=service,
                         sampling_ratio=ratio, headers=tuple(headers))
