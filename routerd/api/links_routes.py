"""Site links API (contract §7; lending reference §2.4): ``/router/v1/site/routing-groups`` (image
lane, model id = the model's image ID) and ``/router/v1/site/text-routing-groups`` (text lane,
model id = its local ID).  Served by a master and by a standalone node, whose site of one has no
other node to link to (every candidate list is empty); 404 on a slave.

* ``GET [?node_id&model_id]`` → ``{links, anchor?, candidates?}``.  Candidates are every model of
  the lane on another node, ineligible ones included (``eligible: false`` with the reason).
* ``POST {anchor, lends_to, borrows_from, acknowledge_different_weights?}`` replaces every link
  touching the anchor, in both directions.  A first link between the anchor and a model whose
  weights differ from the anchor's (``weights_match`` false) is refused with 400
  ``acknowledgement_required`` unless acknowledged.  "First" is per model pair: a peer already
  linked to the anchor in either direction needs no new acknowledgement.
* ``DELETE ?node_id&model_id`` removes every link touching the anchor.

The workflow (validate → persist → install → push) is ``routerd.site.links.LinkEditor``; this
module parses the request and answers the editor's result.
"""

from __future__ import annotations

from typing import Any

import attrs
from twisted.web.iweb import IRequest

from routerd.api.jsonio import json_response, read_json
from routerd.api.reply import query_arg
from routerd.api.routes import Routes
from routerd.errors import HTTPError
from routerd.lending.links import Peer
from routerd.site.links import ACKNOWLEDGEMENT_REQUIRED, EditRequest
from routerd.site.records import SiteRecords
from routerd.wire.lending import Endpoint, Lane

LANE_PATHS: dict[Lane, str] = {
    "image": "/router/v1/site/routing-groups",
    "text": "/router/v1/site/text-routing-groups",
}
_LANE_OF: dict[str, Lane] = {path: lane for lane, path in LANE_PATHS.items()}


def want_bool(value: Any, where: str, default: bool) -> bool:
    """A JSON boolean field (missing or null → ``default``); 400 naming ``where`` otherwise."""
    if value is None:
        return default
    if not isinstance(value, bool):
        raise HTTPError(400, f"{where} must be true or false")
    return value


def want_str(value: Any, where: str) -> str:
    """A JSON string field, trimmed; 400 naming ``where`` when it is missing or not a string."""
    if not isinstance(value, str):
        raise HTTPError(400, f"{where} is required and must be a string")
    return value.strip()


def _endpoint(value: Any, where: str) -> Endpoint:
    if not isinstance(value, dict):
        raise HTTPError(400, f"{where} must be an object with node_id and model_id")
    node_id = want_str(value.get("node_id"), f"{where}.node_id")
    model_id = want_str(value.get("model_id"), f"{where}.model_id")
    if not node_id:
        raise HTTPError(400, f"{where}.node_id must not be empty")
    if not model_id:
        raise HTTPError(400, f"{where}.model_id must not be empty")
    return Endpoint(node_id, model_id)


def _peers(value: Any, where: str) -> tuple[Peer, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise HTTPError(400, f"{where} must be a list")
    out: list[Peer] = []
    for index, item in enumerate(value):
        at = f"{where}[{index}]"
        end = _endpoint(item, at)
        out.append(Peer(end.node_id, end.model_id,
                        want_bool(item.get("load_if_unloaded"), f"{at}.load_if_unloaded", True),
                        want_bool(item.get("restore_after_borrow"), f"{at}.restore_after_borrow", False)))
    return tuple(out)


def parse_edit(body: dict[str, Any]) -> EditRequest:
    """The ``POST`` body; 400 naming the field when it is malformed."""
    if "anchor" not in body:
        raise HTTPError(400, "anchor is required")
    return EditRequest(
        anchor=_endpoint(body["anchor"], "anchor"),
        lends_to=_peers(body.get("lends_to"), "lends_to"),
        borrows_from=_peers(body.get("borrows_from"), "borrows_from"),
        acknowledge_different_weights=want_bool(
            body.get("acknowledge_different_weights"), "acknowledge_different_weights", False),
    )


def _anchor_query(request: IRequest, required: bool) -> Endpoint | None:
    node_id = query_arg(request, "node_id") or ""
    model_id = query_arg(request, "model_id") or ""
    if not node_id and not model_id and not required:
        return None
    if not node_id or not model_id:
        raise HTTPError(400, "node_id and model_id are both required to name the anchor")
    return Endpoint(node_id, model_id)


@attrs.define(slots=False)
class LinksAPI:
    """The three methods of both lanes' endpoints: parse, call the lane's ``LinkEditor``, answer."""

    records: SiteRecords

    routes = Routes()

    @routes.route(LANE_PATHS["image"], methods=["GET"], auth="admin")
    @routes.route(LANE_PATHS["text"], methods=["GET"], auth="admin")
    async def get(self, request: IRequest) -> bytes:
        editor = self.records.links(_lane(request))
        return json_response(request, await editor.view(_anchor_query(request, required=False)))

    @routes.route(LANE_PATHS["image"], methods=["POST"], auth="admin")
    @routes.route(LANE_PATHS["text"], methods=["POST"], auth="admin")
    async def post(self, request: IRequest) -> bytes:
        editor = self.records.links(_lane(request))
        return json_response(request, await editor.replace(parse_edit(read_json(request))))

    @routes.route(LANE_PATHS["image"], methods=["DELETE"], auth="admin")
    @routes.route(LANE_PATHS["text"], methods=["DELETE"], auth="admin")
    async def delete(self, request: IRequest) -> bytes:
        editor = self.records.links(_lane(request))
        anchor = _anchor_query(request, required=True)
        assert anchor is not None
        return json_response(request, await editor.delete(anchor))


def _lane(request: IRequest) -> Lane:
    """The lane whose endpoint ``request`` was routed to."""
    return _LANE_OF[request.path.decode("latin-1")]


__all__ = [
    "ACKNOWLEDGEMENT_REQUIRED",
    "LANE_PATHS",
    "LinksAPI",
    "parse_edit",
]
