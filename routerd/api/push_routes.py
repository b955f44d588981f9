"""Receipt of the master's pushes (contract §6; cluster token enforced by the guard).

* ``POST /router/v1/node/offload/links`` ``{"image": [link], "text": [link]}`` installs both lanes'
  links (the full snapshot; a lane's list replaces that lane) → ``{"ok": true, "image": n, "text": m,
  "guardians": g}``.  The body also carries ``"guardians": [setting]`` (guardian models); a push
  without it (an older master) clears them.
* ``POST /router/v1/node/offload/settings`` ``{"values": {...}, "fingerprint"}`` runs exactly the
  master's resolved values: keys this build does not know are dropped, the rest normalised (any
  invalid → 400, nothing applied), keys missing from the push take their built-in defaults →
  ``{"ok": true, "fingerprint": <applied>, "dropped": [keys]}``.

Each push takes effect at once and is kept in the slave's router database
(``routerd.lending.bootstrap.PushedState``): restarted while its master is down, the slave serves with
the last links, settings and guardians pushed; the master's next push replaces them.

A master or a standalone node (a site of one) refuses both with 409 ``is_master``: its links and
settings come from its own database.
"""

from __future__ import annotations

from typing import Any

import attrs
from twisted.logger import Logger
from twisted.web.iweb import IRequest

from routerd.api.jsonio import json_response, read_json
from routerd.api.routes import Routes
from routerd.config.lending import SPECS, LendingSettings
from routerd.errors import HTTPError
from routerd.lending.bootstrap import PushedState
from routerd.lending.links import LinkError, LinkSet
from routerd.paths import LINKS_PATH, SETTINGS_PATH
from routerd.routing.guardians import GuardianError, GuardianSet
from routerd.site.service import SiteService
from routerd.site.settings import normalise_batch
from routerd.wire.lending import Lane, Link, parse_strictly

log = Logger()


def parse_link_set(lane: Lane, value: Any) -> LinkSet:
    """A lane's pushed list as a validated set; 400 when malformed or invalid."""
    if not isinstance(value, list):
        raise HTTPError(400, f"{lane} is required and must be a list of links")
    links = [parse_strictly(item, Link, f"{lane}[{index}]") for index, item in enumerate(value)]
    try:
        return LinkSet.build(lane, links)
    except LinkError as exc:
        raise HTTPError(400, f"{lane}: {exc}") from None


def _refuse_on_master(site: SiteService, what: str) -> None:
    if site.serves:  # a master, or a standalone node (a site of one)
        raise HTTPError(409, f"this node serves its own site; its {what} come from its own database",
                        "cluster_error", "is_master")


@attrs.define(slots=False, kw_only=True)
class PushAPI:
    site: SiteService
    pushed: PushedState

    routes = Routes()

    @routes.route(LINKS_PATH, methods=["POST"], auth="cluster")
    async def links(self, request: IRequest) -> bytes:
        _refuse_on_master(self.site, "links")
        body = read_json(request)
        image = parse_link_set("image", body.get("image"))
        text = parse_link_set("text", body.get("text"))
        try:
            guardians = GuardianSet.parse(body.get("guardians") or [], "guardians")
        except GuardianError as exc:
            raise HTTPError(400, str(exc)) from None
        await self.pushed.links(image, text, guardians)
        return json_response(request, {"ok": True, "image": len(image), "text": len(text),
                                       "guardians": len(guardians)})

    @routes.route(SETTINGS_PATH, methods=["POST"], auth="cluster")
    async def settings(self, request: IRequest) -> bytes:
        _refuse_on_master(self.site, "settings")
        body = read_json(request)
        values = body.get("values")
        if not isinstance(values, dict):
            raise HTTPError(400, 'values is required: an object of {"key": value}')
        pushed = body.get("fingerprint")
        if pushed is not None and not isinstance(pushed, str):
            raise HTTPError(400, "fingerprint must be a string")
        dropped = sorted(key for key in values if key not in SPECS)
        known = normalise_batch({k: v for k, v in values.items() if k in SPECS})
        settings = LendingSettings.from_texts(known)
        await self.pushed.settings(settings)
        fingerprint = settings.fingerprint()
        if dropped:
            log.info("lending settings from the master: dropped unknown keys {keys}", keys=dropped)
        if pushed and pushed != fingerprint:
            log.info("lending settings applied with fingerprint {ours}; the master's is {theirs}",
                     ours=fingerprint, theirs=pushed)
        return json_response(request, {"ok": True, "fingerprint": fingerprint, "dropped": dropped})


__all__ = ["PushAPI", "parse_link_set"]
