"""The site's lending settings (contract §7 ``/router/v1/site/offload/settings``): default < config <
stored override, edited as one batch (all or nothing), then applied and pushed to the slaves.

A batch with one bad value is refused with 400 naming every bad key and nothing is stored; a node
without a router database answers edits with 409 ``read_only``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from routerd.config.lending import SPECS, SettingError, normalise
from routerd.errors import HTTPError
from routerd.lending.layering import effective
from routerd.site.links import LendingTarget
from routerd.store.store import Store


def normalise_batch(values: Mapping[str, Any]) -> dict[str, str]:
    """Every value's canonical text; one 400 naming every key that does not validate."""
    out: dict[str, str] = {}
    errors: list[str] = []
    for key, value in values.items():
        if value is None or isinstance(value, (dict, list)):
            errors.append(f"{key} must be a string, number or boolean")
            continue
        try:
            out[key] = normalise(key, value)
        except SettingError as exc:
            message = str(exc)
            errors.append(message if key in message else f"{key}: {message}")
    if errors:
        raise HTTPError(400, "invalid lending settings: " + "; ".join(errors))
    return out


@attrs.frozen
class SettingsEditor:
    """The master's lending settings: default < config < stored override."""

    store: Store | None
    lending: LendingTarget

    def _writable(self) -> Store:
        if self.store is None:
            raise HTTPError(409, "lending settings are read-only: this node has no router database",
                            "invalid_request_error", "read_only")
        return self.store

    async def document(self, *, apply: bool = False) -> dict[str, Any]:
        """``{entries, fingerprint, editable}``; with ``apply`` the effective settings are applied
        to the node's lending, pushed to the slaves and planned with first."""
        overrides = await self.store.setting_overrides() if self.store is not None else {}
        settings, entries = effective(self.lending.config_settings, overrides)
        if apply:
            self.lending.apply_settings(settings)
            await self.lending.refresh()
        return {"entries": entries, "fingerprint": settings.fingerprint(), "editable": self.store is not None}

    async def set(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Store the batch as overrides (all or nothing), apply and push."""
        store = self._writable()
        await store.set_setting_overrides(normalise_batch(values))
        return await self.document(apply=True)

    async def clear(self, key: str | None) -> dict[str, Any]:
        """Clear one override (``key``) or all of them, apply and push."""
        store = self._writable()
        if key is not None:
            if not key:
                raise HTTPError(400, "key must not be empty")
            if key not in SPECS and key not in await store.setting_overrides():
                raise HTTPError(400, f"unknown lending setting {key!r}")
        await store.delete_setting_overrides(key)
        return await self.document(apply=True)


__all__ = ["SettingsEditor", "normalise_batch"]
