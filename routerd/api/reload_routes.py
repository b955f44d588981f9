"""``POST /router/v1/reload`` (admin): re-read the YAML and rescan the models folder.

The answer names the config keys applied, those that need a restart, and the models added, removed
and changed (``routerd.process.reload``).  A config or models folder that cannot be used answers 400
with every error and changes nothing.
"""

from __future__ import annotations

from twisted.web.iweb import IRequest

from routerd.api.jsonio import json_response
from routerd.api.routes import Routes
from routerd.errors import HTTPError
from routerd.process.reload import Reloader, ReloadFailed


class ReloadAPI:
    routes = Routes()

    def __init__(self, reloader: Reloader) -> None:
        self.reloader = reloader

    @routes.route("/router/v1/reload", methods=["POST"], auth="admin")
    async def reload(self, request: IRequest) -> bytes:
        try:
            report = await self.reloader.reload()
        except ReloadFailed as exc:
            raise HTTPError(400, "reload refused, nothing changed: " + "; ".join(exc.errors),
                            "invalid_request_error", "reload_refused") from None
        return json_response(request, report.to_json())


__all__ = ["ReloadAPI"]
