"""Site lending-settings API (contract §7; lending reference §1): ``/router/v1/site/offload/settings``.

Master only (404 elsewhere).

* ``GET`` → ``{entries, fingerprint, editable}``: every setting with its default, config value
  (when it differs from the default), stored override, effective value and source; the fingerprint
  of the effective settings; ``editable`` = the node has a router database.
* ``POST {"values": {key: value, ...}}`` stores the batch as overrides.  Every value is normalised
  first; if any one fails (or names an unknown key) the answer is 400 naming each bad key and
  nothing is stored.
* ``DELETE ?key=K`` clears one override; ``DELETE`` clears them all.

After a change the effective settings (default < config < override) are applied to the node's
lending and pushed to the slaves.  Without a router database, changes answer 409.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twisted.web.iweb import IRequest

from routerd.api.errors import api_app
from routerd.api.jsonio import json_response, read_json
from routerd.api.lending_http import LendingNode, require_master
from routerd.api.reply import query_arg
from routerd.config.lending import SPECS, SettingError, normalise
from routerd.errors import HTTPError
from routerd.lending.layering import effective
from routerd.store.store import Store

PATH = "/router/v1/site/offload/settings"


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


class SettingsAPI:
    app = api_app()

    def __init__(self, node: LendingNode) -> None:
        self.node = node

    def _writable_store(self) -> Store:
        if self.node.store is None:
            raise HTTPError(409, "lending settings are read-only: this node has no router database",
                            "invalid_request_error", "read_only")
        return self.node.store

    async def _overrides(self) -> dict[str, str]:
        store = self.node.store
        return await store.setting_overrides() if store is not None else {}

    async def _answer(self, request: IRequest, *, apply: bool) -> bytes:
        settings, entries = effective(self.node.lending.config_settings, await self._overrides())
        if apply:
            self.node.lending.apply_settings(settings)
            await self.node.lending.push()
        return json_response(request, {"entries": entries, "fingerprint": settings.fingerprint(),
                                        "editable": self.node.store is not None})

    @app.route(PATH, methods=["GET"])
    async def get(self, request: IRequest) -> bytes:
        require_master(self.node)
        return await self._answer(request, apply=False)

    @app.route(PATH, methods=["POST"])
    async def post(self, request: IRequest) -> bytes:
        require_master(self.node)
        store = self._writable_store()
        body = read_json(request)
        values = body.get("values")
        if not isinstance(values, dict):
            raise HTTPError(400, 'values is required: an object of {"key": value}')
        await store.set_setting_overrides(normalise_batch(values))
        return await self._answer(request, apply=True)

    @app.route(PATH, methods=["DELETE"])
    async def delete(self, request: IRequest) -> bytes:
        require_master(self.node)
        store = self._writable_store()
        key = query_arg(request, "key")
        if key is not None:
            if not key:
                raise HTTPError(400, "key must not be empty")
            if key not in SPECS and key not in await store.setting_overrides():
                raise HTTPError(400, f"unknown lending setting {key!r}")
        await store.delete_setting_overrides(key)
        return await self._answer(request, apply=True)


__all__ = ["PATH", "SettingsAPI", "normalise_batch"]
