"""Node API routes of lending's loop (contract §6): queue events, lease grants, borrowed work and
the master's relay.

Events, grants and the relay are every lent request's own calls between nodes, so they are lean
routes: the lean HTTP channel serves them from the request's facts, under the same
admission as every other path (a request handed to twisted.web reaches the same handlers)."""

from __future__ import annotations

import time

from twisted.internet.defer import Deferred, ensureDeferred
from twisted.web.iweb import IRequest

from routerd.api.errors import require_post
from routerd.api.jsonio import json_reply, json_response, parse_json_body
from routerd.api.routes import Routes
from routerd.errors import HTTPError
from routerd.lending.coordinator import Coordinator
from routerd.lending.lend_trace import relay_span
from routerd.lending.offload import RelayRequest, offload_returned, relay_from_headers
from routerd.lending.service import LendingService
from routerd.paths import BORROWED_PATH, EVENT_PATH, GRANT_PATH, RELAY_PATH
from routerd.routing.call import PUBLIC_MODEL_HEADER, Call, Incoming, Reply, new_request_id, sent_public_model
from routerd.routing.classify import classify
from routerd.routing.forward import CameBack
from routerd.routing.selector import SelectorError, parse_json_object
from routerd.site.service import not_master
from routerd.tracing import NO_TRACER, TRACEPARENT, Tracer
from routerd.wire.lending import LANES, TRIGGERS, Lease, from_json, to_json


class OffloadAPI:
    routes = Routes()

    def __init__(self, *, coordinator: Coordinator | None, lending: LendingService,
                 tracer: Tracer = NO_TRACER) -> None:
        self.coordinator = coordinator
        self.lending = lending
        self.tracer = tracer

    @routes.lean(EVENT_PATH, methods=["POST"], auth="cluster")
    def event(self, method: str, path: str, facts: Incoming, reply: Reply) -> Deferred[bytes]:
        """An owner's queue event (the master only), answered with the owner's lease or none."""
        require_post(method, path, reply)
        if self.coordinator is None:
            raise not_master()
        body = parse_json_body(facts.body)
        lane, owner, model, trigger = (body.get(k) for k in ("lane", "owner_node_id", "model_id", "trigger"))
        if lane not in LANES:
            raise HTTPError(400, "lane must be image or text")
        if not isinstance(owner, str) or not owner.strip() or not isinstance(model, str) or not model.strip():
            raise HTTPError(400, "owner_node_id and model_id are required")
        if trigger not in TRIGGERS:
            raise HTTPError(400, f"trigger must be one of {', '.join(TRIGGERS)}")
        leased = ensureDeferred(self.coordinator.event(lane, owner.strip(), model.strip(), trigger))
        return leased.addCallback(
            lambda lease: json_reply(reply, {"lease": to_json(lease) if lease is not None else None}))

    @routes.lean(GRANT_PATH, methods=["POST"], auth="cluster")
    def grant(self, method: str, path: str, facts: Incoming, reply: Reply) -> bytes:
        require_post(method, path, reply)
        body = parse_json_body(facts.body)
        try:
            lease = from_json(body, Lease)
        except Exception as exc:  # noqa: BLE001 - cattrs reports structure errors in several types
            raise HTTPError(400, f"invalid lease: {exc}") from None
        if not (lease.owner_model_id and lease.helper_node_id and lease.helper_model_id):
            raise HTTPError(400, "a lease needs owner_model_id, helper_node_id and helper_model_id")
        self.lending.receive_lease(lease, lease.lane, lease.owner_model_id, "grant")
        return json_reply(reply, to_json(lease))

    @routes.route(BORROWED_PATH, methods=["GET"], auth="cluster")
    def borrowed(self, request: IRequest) -> bytes:
        return json_response(request, {"borrowed": self.lending.borrowed_requests()})

    @routes.lean(RELAY_PATH, methods=["POST"], auth="cluster", returns=True)
    def relay(self, method: str, path: str, facts: Incoming, reply: Reply) -> Deferred[bytes]:
        """The master's relay: pass an owner's lent request to the helper its live lease names,
        its answer streamed through as it arrives.  Refusals are answered in the OpenAI envelope
        whatever the inference path (the envelope of the relay's own path)."""
        require_post(method, path, reply)
        if self.coordinator is None:
            raise not_master()
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
        call = Call(reply=reply, route=route, path=relay.path, body=facts.body,
                    content_type=facts.content_type, parsed=parsed, stream=False,
                    request_id=facts.header("x-routerd-request-id") or new_request_id(),
                    started=time.time(), selector=None, query=facts.query, key_name=facts.key_name)
        # passed on to the helper, for its analytics row
        call.public_model = sent_public_model(facts.header(PUBLIC_MODEL_HEADER))
        if self.tracer is not NO_TRACER:
            call.trace = relay_span(self.tracer, facts.header(TRACEPARENT), relay, call.request_id)
        return ensureDeferred(self._relay(self.coordinator, reply, relay, call))

    @staticmethod
    async def _relay(coordinator: Coordinator, reply: Reply, relay: RelayRequest, call: Call) -> bytes:
        try:
            answer = await coordinator.relay(reply, relay, call, rewrite_to=None, returns_raise=False)
        except CameBack as exc:
            call.trace.end("returned")
            raise offload_returned(str(exc)) from None
        except BaseException as exc:
            call.trace.end(exc.__class__.__name__)
            raise
        call.trace.end()
        return answer
