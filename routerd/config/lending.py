"""The lending settings (``cluster.*``): definitions, normalisation, layering, fingerprint.

One table (``SETTINGS``) names each key with its kind, default and range; the
config loader, the override store, the site API and the push to slaves all use
it, so a key is defined in exactly one place.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Literal

import attrs

from routerd.config.durations import DurationError, format_duration, parse_duration

Kind = Literal["duration", "integer", "boolean"]


@attrs.frozen
class SettingSpec:
    key: str
    kind: Kind
    default: str
    description: str
    minimum: int | None = None
    maximum: int | None = None


SETTINGS: tuple[SettingSpec, ...] = (
    SettingSpec("scheduling_refresh_interval", "duration", "1m0s",
                "how often every node refits its costs and the master replans"),
    SettingSpec("scheduling_sample_window", "duration", "24h0m0s",
                "how far back finished requests and loads count toward cost fits"),
    SettingSpec("scheduling_min_samples", "integer", "20",
                "measured requests a model needs inside the window before it is priced", 2, 100000),
    SettingSpec("scheduling_backend_depth", "integer", "2",
                "requests per lane admitted into the backend at once; the rest wait in the router", 1, 64),
    SettingSpec("scheduling_grant_ttl", "duration", "30s", "lease lifetime unless renewed"),
    SettingSpec("scheduling_context_reserve", "integer", "256",
                "floor of tokens reserved for the answer when a request states no max_tokens", 0, 1048576),
    SettingSpec("offload_restore_delay", "duration", "1.5s",
                "quiet time before a helper reloads the model borrowing displaced"),
    SettingSpec("offload_probe_idle", "duration", "5s",
                "own-work idle time after which an eligible helper gets a one-request probe"),
    SettingSpec("offload_faster_helper_slots", "integer", "2",
                "lease slots for a helper at least as fast per job as the owner", 1, 64),
    SettingSpec("offload_slower_helper_slots", "integer", "1",
                "lease slots for a paying but slower helper", 1, 64),
    SettingSpec("offload_probe_helper_slots", "integer", "1", "lease slots for a probe", 1, 64),
    SettingSpec("offload_hold_for_faster_helper", "boolean", "true",
                "keep a waiting request for a busy, faster helper instead of the owner's second slot"),
    SettingSpec("offload_decisions_retention", "duration", "720h0m0s", "decision-log retention"),
    SettingSpec("offload_lent_stall_timeout", "duration", "3m0s",
                "no change in lent requests for this long makes the master ask the helper"),
)

SPECS: Mapping[str, SettingSpec] = {s.key: s for s in SETTINGS}


class SettingError(ValueError):
    """A lending setting value that does not validate."""


def normalise(key: str, value: object) -> str:
    """Validate one value and return its canonical text form."""
    spec = SPECS.get(key)
    if spec is None:
        raise SettingError(f"unknown lending setting {key!r}")
    if spec.kind == "duration":
        try:
            seconds = parse_duration(value)
        except DurationError as exc:
            raise SettingError(f"{key}: {exc}") from None
        if seconds <= 0:
            raise SettingError(f"{key} must be positive, got {value!r}")
        return format_duration(seconds)
    if spec.kind == "integer":
        if isinstance(value, bool):
            raise SettingError(f"{key} must be a whole number, got {value!r}")
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        text = str(value).strip()
        try:
            number = int(text)
        except ValueError:
            raise SettingError(f"{key} must be a whole number, got {value!r}") from None
        assert spec.minimum is not None and spec.maximum is not None
        if not spec.minimum <= number <= spec.maximum:
            raise SettingError(f"{key} must be between {spec.minimum} and {spec.maximum}, got {number}")
        return str(number)
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value).strip().lower()
    if text in ("true", "1", "t", "yes", "on"):
        return "true"
    if text in ("false", "0", "f", "no", "off"):
        return "false"
    raise SettingError(f"{key} must be true or false, got {value!r}")


def _typed(key: str, text: str) -> float | int | bool:
    kind = SPECS[key].kind
    if kind == "duration":
        return parse_duration(text)
    if kind == "integer":
        return int(text)
    return text == "true"


def _seconds(key: str) -> float:
    """The default of a duration setting, in seconds (the table is the one place defaults live)."""
    assert SPECS[key].kind == "duration"
    return parse_duration(SPECS[key].default)


def _whole(key: str) -> int:
    assert SPECS[key].kind == "integer"
    return int(SPECS[key].default)


def _flag(key: str) -> bool:
    assert SPECS[key].kind == "boolean"
    return SPECS[key].default == "true"


@attrs.frozen
class LendingSettings:
    """Resolved lending settings; durations in seconds, defaults from ``SETTINGS``."""

    scheduling_refresh_interval: float = _seconds("scheduling_refresh_interval")
    scheduling_sample_window: float = _seconds("scheduling_sample_window")
    scheduling_min_samples: int = _whole("scheduling_min_samples")
    scheduling_backend_depth: int = _whole("scheduling_backend_depth")
    scheduling_grant_ttl: float = _seconds("scheduling_grant_ttl")
    scheduling_context_reserve: int = _whole("scheduling_context_reserve")
    offload_restore_delay: float = _seconds("offload_restore_delay")
    offload_probe_idle: float = _seconds("offload_probe_idle")
    offload_faster_helper_slots: int = _whole("offload_faster_helper_slots")
    offload_slower_helper_slots: int = _whole("offload_slower_helper_slots")
    offload_probe_helper_slots: int = _whole("offload_probe_helper_slots")
    offload_hold_for_faster_helper: bool = _flag("offload_hold_for_faster_helper")
    offload_decisions_retention: float = _seconds("offload_decisions_retention")
    offload_lent_stall_timeout: float = _seconds("offload_lent_stall_timeout")

    @classmethod
    def from_texts(cls, values: Mapping[str, str]) -> LendingSettings:
        """Build from canonical texts (missing keys keep their defaults)."""
        kwargs = {key: _typed(key, normalise(key, text)) for key, text in values.items()}
        return cls(**kwargs)  # type: ignore[arg-type]

    def texts(self) -> dict[str, str]:
        """Canonical text of every setting, in table order."""
        out: dict[str, str] = {}
        for spec in SETTINGS:
            value = getattr(self, spec.key)
            if spec.kind == "duration":
                out[spec.key] = format_duration(value)
            elif spec.kind == "boolean":
                out[spec.key] = "true" if value else "false"
            else:
                out[spec.key] = str(value)
        return out

    def fingerprint(self) -> str:
        """First 12 hex characters of sha256 over ``key=value\\n`` in table order."""
        blob = "".join(f"{k}={v}\n" for k, v in self.texts().items())
        return hashlib.sha256(blob.encode()).hexdigest()[:12]
