"""Node API routes of lending's loop (contract §6): queue events, lease grants and the relay."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from klein import Klein
from twisted.internet.defer import ensureDeferred
from twisted.web.iweb import IRequest

from routerd.api.jsonio import json_response, read_json
from routerd.errors import HTTPError, error_body
from routerd.lending.coordinator import RelayRequest
from routerd.lending.service import offload_returned
from routerd.routing.call import Call, new_request_id
from routerd.routing.classify import classify
from routerd.routing.forward import CameBack
from routerd.routing.relay import header
from routerd.routing.selector import SelectorError, parse_json_object
from routerd.wire.lending import LANES, TRIGGERS, Lease, from_json, to_json

if TYPE_CHECKING:
    from routerd.node import Node






def add_routes(app: Klein, node: Node, guarded: Callable[..., Any]) -> None:
    @app.route("/router/v1/node/offload/event", methods=["POST"])
    @guarded
    async def offload_event(request: IRequest) -> bytes:
        if node.coordinator is None:
            raise HTTPError(409, "this node is not the master", "cluster_error", "not_master")
        body = read_json(request)
        lane, owner, model, trigger = (body.get(k) for k in ("lane", "owner_node_id", "model_id", "trigger"))
        if lane not in LANES:
            raise HTTPError(400, "lane must be image or text")
        if not isinstance(owner, str) or not owner.strip() or not isinstance(model, str) or not model.strip():
            raise HTTPError(400, "owner_node_id and model_id are required")
        if trigger not in TRIGGERS:
            raise HTTPError(400, f"trigger must be one of {', '.join(TRIGGERS)}")
        lease = await node.coordinator.event(lane, owner.strip(), model.strip(), trigger)
        return json_response(request, {"lease": to_json(lease) if lease is not None else None})

    @app.route("/router/v1/node/offload/grant", methods=["POST"])
    @guarded
    def offload_grant(request: IRequest) -> bytes:
        body = read_json(request)
        try:
            lease = from_json(body, Lease)
        except Exception as exc:  # noqa: BLE001 - cattrs reports structure errors in several types
            raise HTTPError(400, f"invalid lease: {exc}") from None
        if not (lease.owner_model_id and lease.helper_node_id and lease.helper_model_id):
            raise HTTPError(400, "a lease needs owner_model_id, helper_node_id and helper_model_id")
        node.lending.receive_lease(lease, lease.lane, lease.owner_model_id, "grant")
        return json_response(request, to_json(lease))

    @app.route("/router/v1/node/offload/borrowed", methods=["GET"])
    def offload_borrowed(request: IRequest) -> bytes:
        return json_response(request, {"borrowed": node.lending.borrowed_requests()})

    @app.route("/router/v1/node/offload/request", methods=["POST"])
    def offload_request(request: IRequest) -> Any:
        """The master's relay: pass an owner's lent request to the helper its live lease names."""
        return ensureDeferred(_relay(node, request))


async def _relay(node: Node, request: IRequest) -> bytes:
    def refuse(err: HTTPError) -> bytes:
        request.setResponseCode(err.status)
        request.setHeader(b"content-type", b"application/json")
        return error_body("openai", err.message, err.type, err.code)

    if node.coordinator is None:
        return refuse(HTTPError(409, "this node is not the master", "cluster_error", "not_master"))
    owner = header(request, b"x-routerd-offload-owner").strip()
    owner_model = header(request, b"x-routerd-offload-owner-model").strip()
    lane = header(request, b"x-routerd-offload-lane").strip()
    path = header(request, b"x-routerd-offload-path").strip()
    route = classify("POST", path) if path.startswith("/") else None
    if not owner or not owner_model or lane not in LANES or route is None or route.lane != lane:
        return refuse(HTTPError(400, "relay needs X-Routerd-Offload-Owner, -Owner-Model, -Lane and an "
                                     "inference path in -Path for that lane"))
    body = request.content.read() if request.content is not None else b""
    parsed = None
    if route.runtime != "stt":
        try:
            parsed = parse_json_object(body)
        except SelectorError as exc:
            return refuse(HTTPError(400, str(exc)))
    request_id = header(request, b"x-routerd-request-id") or new_request_id()
    call = Call(request=request, route=route, path=path, body=body,
                content_type=header(request, b"content-type"), parsed=parsed, stream=False,
                request_id=request_id, started=time.time(), selector=None)
    relay = RelayRequest(lane, owner, owner_model, path)
    try:
        return await node.coordinator.relay(request, relay, call, rewrite_to=None, returns_raise=False)
    except CameBack as exc:
        return refuse(offload_returned(str(exc)))
