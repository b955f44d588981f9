"""Site guardians API (contract §7; spec "Guardian models"): ``/router/v1/site/guardians``.
Served by a master and by a standalone node (a site of one); 404 on a slave; admin keys.

* ``GET`` → ``{guardians: [setting], candidates: [{node_id, model_id, filename, available}],
  text_models: [{node_id, model_id, filename, available, guardian: {scope, node_id, model_id}|null}]}``
  — the settings, every model that may be a guardian (a multimodal text model), and every text-only
  model with the guardian that applies to it (model, then node, then cluster scope).
* ``POST`` one setting ``{scope: "model"|"node"|"cluster", node_id?, model_id?, guardian: {node_id,
  model_id}}``, or ``{guardians: [setting, ...]}`` (all or nothing): each replaces the setting of the
  same scope key → the ``GET`` document.  A guardian that is not a multimodal text model → 400
  ``guardian_not_multimodal``; an unknown node or model → 400.
* ``DELETE ?scope&node_id&model_id`` (node_id for the node scope, both for the model scope) → the
  ``GET`` document plus ``removed`` (0 when nothing was set).

``model_id`` is a model's local ID on its node.  The workflow (validate → persist → install → push
to the slaves with the links) is ``routerd.site.guardians.GuardianEditor``.
"""

from __future__ import annotations

from typing import Any

import attrs
from twisted.web.iweb import IRequest

from routerd.api.jsonio import json_response, read_json
from routerd.api.reply import query_arg
from routerd.api.routes import Routes
from routerd.errors import HTTPError
from routerd.routing.guardians import Guardian, GuardianError, parse_guardian, parse_scope_key
from routerd.site.records import SiteRecords

GUARDIANS_PATH = "/router/v1/site/guardians"


def parse_settings(body: dict[str, Any]) -> list[Guardian]:
    """The ``POST`` body: one setting, or ``{guardians: [...]}``; 400 naming the bad field."""
    try:
        if "guardians" in body:
            items = body["guardians"]
            if not isinstance(items, list) or not items:
                raise HTTPError(400, "guardians must be a non-empty list of settings")
            return [parse_guardian(item, f"guardians[{index}]") for index, item in enumerate(items)]
        return [parse_guardian(body, "body")]
    except GuardianError as exc:
        raise HTTPError(400, str(exc)) from None


@attrs.define(slots=False)
class GuardiansAPI:
    records: SiteRecords

    routes = Routes()

    @routes.route(GUARDIANS_PATH, methods=["GET"], auth="admin")
    async def get(self, request: IRequest) -> bytes:
        return json_response(request, await self.records.guardians().view())

    @routes.route(GUARDIANS_PATH, methods=["POST"], auth="admin")
    async def post(self, request: IRequest) -> bytes:
        editor = self.records.guardians()
        return json_response(request, await editor.put(parse_settings(read_json(request))))

    @routes.route(GUARDIANS_PATH, methods=["DELETE"], auth="admin")
    async def delete(self, request: IRequest) -> bytes:
        editor = self.records.guardians()
        try:
            scope, node_id, model_id = parse_scope_key(query_arg(request, "scope"),
                                                       query_arg(request, "node_id"),
                                                       query_arg(request, "model_id"))
        except GuardianError as exc:
            raise HTTPError(400, str(exc)) from None
        return json_response(request, await editor.delete(scope, node_id, model_id))


__all__ = ["GUARDIANS_PATH", "GuardiansAPI", "parse_settings"]
