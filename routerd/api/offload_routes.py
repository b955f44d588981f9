"""Node API routes of lending's loop (contract §6): queue events, lease grants, borrowed work and
the master's relay."""

from __future__ import annotations

import time
from typing import Any

from twisted.internet.defer import ensureDeferred
from twisted.web.iweb import IRequest

from routerd.api.errors import answer_error
from routerd.api.jsonio import json_response, read_json
from routerd.api.reply import RequestReply, incoming
from routerd.api.routes import Routes
from routerd.errors import HTTPError
from routerd.lending.coordinator import Coordinator
from routerd.lending.offload import offload_returned, relay_from_headers
from routerd.lending.service import LendingService
from routerd.routing.call import Call, new_request_id
from routerd.routing.classify import classify
from routerd.routing.forward import CameBack
from routerd.routing.selector import SelectorError, parse_json_object
from routerd.wire.lending import LANES, TRIGGERS, Lease, from_json, to_json


def _not_master() -> HTTPError:
    return HTTPError(409, "this node is not the master", "cluster_error", "not_master")


class OffloadAPI:
    routes = Routes()

    def __init__(self, *, coordinator: Coordinator | None, lending: LendingService) -> None:
        self.coordinator = coordinator
        self.lending = lending

    @routes.route("/router/v1/node/offload/event", methods=["POST"], auth="cluster")
    async def event(self, request: IRequest) -> bytes:
        if self.coordinator is None:
            raise _not_master()
        body = read_json(request)
        lane, owner, model, trigger = (body.get(k) for k in ("lane", "owner_node_id", "model_id", "trigger"))
        if lane not in LANES:
            raise HTTPError(400, "lane must be image or text")
        if not isinstance(owner, str) or not owner.strip() or not isinstance(model, str) or not model.strip():
            raise HTTPError(400, "owner_node_id and model_id are required")
        if trigger not in TRIGGERS:
            raise HTTPError(400, f"trigger must be one of {', '.join(TRIGGERS)}")
        lease = await self.coordinator.event(lane, owner.strip(), model.strip(), trigger)
        return json_response(request, {"lease": to_json(lease) if lease is not None else None})

    @routes.route("/router/v1/node/offload/grant", methods=["POST"], auth="cluster")
    def grant(self, request: IRequest) -> bytes:
        body = read_json(request)
        try:
            lease = from_json(body, Lease)
        except Exception as exc:  # noqa: BLE001 - cattrs reports structure errors in several types
            raise HTTPError(400, f"invalid lease: {exc}") from None
        if not (lease.owner_model_id and lease.helper_node_id and lease.helper_model_id):
            raise HTTPError(400, "a lease needs owner_model_id, helper_node_id and helper_model_id")
        self.lending.receive_lease(lease, lease.lane, lease.owner_model_id, "grant")
        return json_response(request, to_json(lease))

    @routes.route("/router/v1/node/offload/borrowed", methods=["GET"], auth="cluster")
    def borrowed(self, request: IRequest) -> bytes:
        return json_response(request, {"borrowed": self.lending.borrowed_requests()})

    @routes.route("/router/v1/node/offload/request", methods=["POST"], auth="cluster")
    def relay(self, request: IRequest) -> Any:
        """The master's relay: pass an owner's lent request to the helper its live lease names.
        Refusals are answered in the OpenAI envelope whatever the inference path."""
        return ensureDeferred(self._relay(request))

    async def _relay(self, request: IRequest) -> bytes:
        try:
            return await self._relay_or_raise(request)
        except HTTPError as err:
            return answer_error(request, err, "openai")

    async def _relay_or_raise(self, request: IRequest) -> bytes:
        if self.coordinator is None:
            raise _not_master()
        facts = incoming(request, "")
        relay = relay_from_headers(facts.header)
        route = classify("POST", relay.path) if relay is not None and relay.path.startswith("/") else None
        if relay is None or route is None or route.lane != relay.lane:
            raise HTTPError(400, "relay needs X-Routerd-Offload-Owner, -Owner-Model, -Lane and an "
                                 "inference path in -Path for that lane")
        parsed = None
        if route.runtime != "stt":
            try:
                parsed = parse_json_object(facts.body)
            except SelectorError as exc:
                raise HTTPError(400, str(exc)) from None
        reply = RequestReply(request)
        call = Call(reply=reply, route=route, path=relay.path, body=facts.body,
                    content_type=facts.content_type, parsed=parsed, stream=False,
                    request_id=facts.header("x-routerd-request-id") or new_request_id(),
                    started=time.time(), selector=None, query=facts.query)
        try:
            return await self.coordinator.relay(reply, relay, call, rewrite_to=None, returns_raise=False)
        except CameBack as exc:
            raise offload_returned(str(exc)) from None
