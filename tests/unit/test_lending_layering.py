"""routerd.lending.layering: default < config < override, invalid overrides shown but not applied."""

from __future__ import annotations

from routerd.config.lending import SETTINGS, LendingSettings
from routerd.lending.layering import effective


def entry(entries: list[dict[str, object]], key: str) -> dict[str, object]:
    return next(e for e in entries if e["key"] == key)


def test_without_config_or_overrides_every_setting_is_its_default_in_table_order() -> None:
    settings, entries = effective(LendingSettings(), {})
    assert settings == LendingSettings()
    assert [e["key"] for e in entries] == [s.key for s in SETTINGS]
    for spec, e in zip(SETTINGS, entries, strict=True):
        assert e == {"key": spec.key, "kind": spec.kind, "description": spec.description,
                     "default": spec.default, "effective": spec.default, "source": "default"}


def test_a_config_value_differing_from_the_default_is_listed_and_wins() -> None:
    settings, entries = effective(LendingSettings(scheduling_grant_ttl=45.0), {})
    assert settings.scheduling_grant_ttl == 45.0
    assert entry(entries, "scheduling_grant_ttl") == {  # type: ignore[arg-type]
        "key": "scheduling_grant_ttl", "kind": "duration", "description": "lease lifetime unless renewed",
        "default": "30s", "config": "45s", "effective": "45s", "source": "config"}


def test_an_override_beats_the_config_and_is_normalised() -> None:
    settings, entries = effective(LendingSettings(offload_restore_delay=3.0),
                                  {"offload_restore_delay": " 1500ms ", "scheduling_min_samples": "7"})
    assert settings.offload_restore_delay == 1.5
    assert settings.scheduling_min_samples == 7
    e = entry(entries, "offload_restore_delay")  # type: ignore[arg-type]
    assert (e["config"], e["override"], e["effective"], e["source"]) == ("3s", " 1500ms ", "1.5s", "db")


def test_an_invalid_override_is_shown_with_its_error_but_the_config_value_applies() -> None:
    settings, entries = effective(LendingSettings(scheduling_backend_depth=4),
                                  {"scheduling_backend_depth": "500", "offload_probe_idle": "soon"})
    assert settings.scheduling_backend_depth == 4
    assert settings.offload_probe_idle == 5.0
    depth = entry(entries, "scheduling_backend_depth")  # type: ignore[arg-type]
    assert depth["override"] == "500" and depth["effective"] == "4" and depth["source"] == "config"
    assert "between 1 and 64" in str(depth["override_error"])
    idle = entry(entries, "offload_probe_idle")  # type: ignore[arg-type]
    assert idle["override"] == "soon" and idle["source"] == "default" and "override_error" in idle


def test_override_keys_this_build_does_not_know_are_ignored() -> None:
    settings, entries = effective(LendingSettings(), {"future_setting": "1"})
    assert settings == LendingSettings()
    assert all(e["key"] != "future_setting" for e in entries)


def test_the_fingerprint_follows_the_effective_values() -> None:
    base, _ = effective(LendingSettings(), {})
    changed, _ = effective(LendingSettings(), {"offload_hold_for_faster_helper": "off"})
    assert base.fingerprint() == LendingSettings().fingerprint()
    assert changed.offload_hold_for_faster_helper is False
    assert changed.fingerprint() != base.fingerprint()
