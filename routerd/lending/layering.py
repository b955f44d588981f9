"""Layering of the lending settings: built-in default < config file < database override.

Pure: :func:`effective` takes the config file's resolved settings and the stored override texts
and returns the settings to run plus one entry per setting as the site API lists it
(lending reference §1).  A stored override that does not validate is *shown* (``override`` and
``override_error``) but not applied; the next lower layer wins.

The config layer arrives already resolved (a :class:`LendingSettings`), so a config value equal to
the built-in default cannot be told apart from an unset one: it is listed with source ``default``
and no ``config`` field.  It runs the same value either way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, NotRequired, TypedDict

from routerd.config.lending import SETTINGS, Kind, LendingSettings, SettingError, normalise

Source = Literal["default", "config", "db"]


class SettingEntry(TypedDict):
    """One row of ``GET /router/v1/site/offload/settings`` ``entries``."""

    key: str
    kind: Kind
    description: str
    default: str
    effective: str
    source: Source
    config: NotRequired[str]
    override: NotRequired[str]
    override_error: NotRequired[str]


def effective(
    config: LendingSettings, overrides: Mapping[str, str]
) -> tuple[LendingSettings, list[SettingEntry]]:
    """The settings to run and their listing, in table order.

    ``overrides`` maps setting keys to stored texts; keys this build does not know are ignored.
    """
    config_texts = config.texts()
    default_texts = LendingSettings().texts()
    chosen: dict[str, str] = {}
    entries: list[SettingEntry] = []
    for spec in SETTINGS:
        value = default_texts[spec.key]
        source: Source = "default"
        entry = SettingEntry(key=spec.key, kind=spec.kind, description=spec.description,
                             default=spec.default, effective=value, source=source)
        from_config = config_texts[spec.key]
        if from_config != value:
            entry["config"] = from_config
            value, source = from_config, "config"
        raw = overrides.get(spec.key)
        if raw is not None:
            entry["override"] = raw
            try:
                value, source = normalise(spec.key, raw), "db"
            except SettingError as exc:
                entry["override_error"] = str(exc)
        entry["effective"] = value
        entry["source"] = source
        chosen[spec.key] = value
        entries.append(entry)
    return LendingSettings.from_texts(chosen), entries


__all__ = ["SettingEntry", "Source", "effective"]
