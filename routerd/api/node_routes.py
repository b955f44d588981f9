"""The node API's documents and loads (contract §6; cluster token): registration with the master,
the snapshot, runtime status and state documents (assembly.documents computes them) and loads.
"""

from __future__ import annotations

import attrs
from twisted.web.iweb import IRequest

from routerd.api.admin_routes import NodeServices, model_arg
from routerd.api.jsonio import json_response, read_json
from routerd.api.routes import Routes
from routerd.paths import NODE_LOAD, NODE_MODELS, NODE_REGISTER, NODE_RUNTIME_STATUS, NODE_STATE, NODE_UNLOAD
from routerd.wire.status import status_to_json


@attrs.define(slots=False, kw_only=True)
class NodeAPI(NodeServices):
    """Node API (contract §6; cluster token): registration, documents, loads."""

    routes = Routes()

    @routes.route(NODE_REGISTER, methods=["POST"], auth="cluster")
    def register(self, request: IRequest) -> bytes:
        master = self.site.require_master()
        return json_response(request, master.register(read_json(request, optional=True)))

    @routes.route(NODE_MODELS, methods=["GET"], auth="cluster")
    def models(self, request: IRequest) -> bytes:
        return json_response(request, self.documents.snapshot())

    @routes.route(NODE_RUNTIME_STATUS, methods=["GET"], auth="cluster")
    def runtime_status(self, request: IRequest) -> bytes:
        return json_response(request, status_to_json(self.documents.runtime_status()))

    @routes.route(NODE_STATE, methods=["GET"], auth="cluster")
    @routes.route("/router/v1/state", methods=["GET"], auth="admin")
    def state(self, request: IRequest) -> bytes:
        return json_response(request, self.documents.state_document())

    @routes.route(NODE_LOAD, methods=["POST"], auth="cluster")
    async def load(self, request: IRequest) -> bytes:
        return json_response(request, await self.admin.load(model_arg(read_json(request, optional=True))))

    @routes.route(NODE_UNLOAD, methods=["POST"], auth="cluster")
    async def unload(self, request: IRequest) -> bytes:
        body = read_json(request, optional=True)
        return json_response(request, await self.admin.unload(body.get("model"), body.get("target")))


__all__ = ["NodeAPI"]
