"""What the master's lending starts with: the stored links of both lanes and the effective settings."""

from __future__ import annotations

from twisted.logger import Logger

from routerd.config.lending import LendingSettings
from routerd.lending.layering import effective
from routerd.lending.links import LinkSet
from routerd.store.store import Store

log = Logger()


async def load_lending_state(
    store: Store, config_settings: LendingSettings
) -> tuple[LinkSet, LinkSet, LendingSettings]:
    """``(image links, text links, effective settings)`` from the router database.

    Settings are layered default < ``config_settings`` < stored override; an override that does
    not validate is logged and skipped.
    """
    image = LinkSet.from_rows("image", await store.links("image"))
    text = LinkSet.from_rows("text", await store.links("text"))
    settings, entries = effective(config_settings, await store.setting_overrides())
    for entry in entries:
        if "override_error" in entry:
            log.warn("stored lending setting override {key}={value!r} is ignored: {reason}",
                     key=entry["key"], value=entry.get("override"), reason=entry["override_error"])
    return image, text, settings


__all__ = ["load_lending_state"]
