"""Site lending-settings API (contract §7; lending reference §1): ``/router/v1/site/offload/settings``.

Served by a master and by a standalone node (a site of one); 404 on a slave.

* ``GET`` → ``{entries, fingerprint, editable}``: every setting with its default, config value
  (when it differs from the default), stored override, effective value and source; the fingerprint
  of the effective settings; ``editable`` = the node has a router database.
* ``POST {"values": {key: value, ...}}`` stores the batch as overrides.  Every value is normalised
  first; if any one fails (or names an unknown key) the answer is 400 naming each bad key and
  nothing is stored.
* ``DELETE ?key=K`` clears one override; ``DELETE`` clears them all.

After a change the effective settings (default < config < override) are applied to the node's
lending and pushed to the slaves (``routerd.site.settings.SettingsEditor``).  Without a router
database, changes answer 409.
"""

from __future__ import annotations

import attrs
from twisted.web.iweb import IRequest

from routerd.api.jsonio import json_response, read_json
from routerd.api.reply import query_arg
from routerd.api.routes import Routes
from routerd.errors import HTTPError
from routerd.site.records import SiteRecords

PATH = "/router/v1/site/offload/settings"


@attrs.define(slots=False)
class SettingsAPI:
    records: SiteRecords

    routes = Routes()

    @routes.route(PATH, methods=["GET"], auth="admin")
    async def get(self, request: IRequest) -> bytes:
        return json_response(request, await self.records.settings().document())

    @routes.route(PATH, methods=["POST"], auth="admin")
    async def post(self, request: IRequest) -> bytes:
        editor = self.records.settings()
        values = read_json(request).get("values")
        if not isinstance(values, dict):
            raise HTTPError(400, 'values is required: an object of {"key": value}')
        return json_response(request, await editor.set(values))

    @routes.route(PATH, methods=["DELETE"], auth="admin")
    async def delete(self, request: IRequest) -> bytes:
        return json_response(request, await self.records.settings().clear(query_arg(request, "key")))


__all__ = ["PATH", "SettingsAPI"]
