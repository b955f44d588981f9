"""The admin and site API's own routes (contract §7; admin keys): version, models, loads, inventory,
split recipes and node state, loads and unloads on a named node.

Site routes answer 404 on a slave and run a named node's operation here or on that node through
:class:`routerd.site.service.SiteService`.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

import attrs
from twisted.web.iweb import IRequest

from routerd import __version__, documents
from routerd.api.errors import not_found
from routerd.api.jsonio import json_response, read_json
from routerd.api.reply import query_arg
from routerd.api.routes import Routes
from routerd.errors import HTTPError
from routerd.inference.admin import UNLOAD_TARGETS
from routerd.paths import NODE_STATE
from routerd.site.reports import site_states
from routerd.site.service import SiteService, remote_answer
from routerd.wire.records import PROTOCOL_VERSION

if TYPE_CHECKING:
    from routerd.assembly.documents import NodeDocuments
    from routerd.inference.admin import ModelAdmin
    from routerd.inference.recipes import RecipeRouter


def model_arg(body: dict[str, Any]) -> str:
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise HTTPError(400, "model is required")
    return name



def _node_arg(body: dict[str, Any]) -> str:
    node_id = body.get("node_id")
    if not isinstance(node_id, str) or not node_id:
        raise HTTPError(400, "node_id is required")
    return node_id


@attrs.define(slots=False, kw_only=True)
class NodeServices:
    """What the node's own routes (node API and admin API) call: the site, the node's documents and
    its model loads."""

    site: SiteService
    documents: NodeDocuments
    admin: ModelAdmin


@attrs.define(slots=False, kw_only=True)
class AdminAPI(NodeServices):
    """Admin and site API (contract §7; admin keys): version, models, loads, inventory, node state."""

    routes = Routes()

    @property
    def recipes(self) -> RecipeRouter | None:
        return self.documents.recipes

    @routes.route("/router/v1/version", methods=["GET"], auth="admin")
    def version(self, request: IRequest) -> bytes:
        return json_response(request, {"version": __version__, "protocol_version": PROTOCOL_VERSION,
                                       "minimum_protocol_version": PROTOCOL_VERSION})

    @routes.route("/router/v1/models", methods=["GET"], auth="admin")
    def models(self, request: IRequest) -> bytes:
        return json_response(request, documents.models_document(self.site.node_id, self.documents.records(),
                                                                self.documents.catalog()))

    @routes.route("/router/v1/load", methods=["POST"], auth="admin")
    async def load(self, request: IRequest) -> bytes:
        name = model_arg(read_json(request, optional=True))
        recipes = self.recipes
        recipe = recipes.book.by_public_id(name) if recipes is not None else None
        if recipes is not None and recipe is not None:
            return json_response(request, await remote_answer(recipes.load(recipe)))
        return json_response(request, await self.admin.load(name, site=True))

    @routes.route("/router/v1/unload", methods=["POST"], auth="admin")
    async def unload(self, request: IRequest) -> bytes:
        body = read_json(request, optional=True)
        answer = await self.admin.unload(body.get("model"), body.get("target"), site=True)
        return json_response(request, answer)

    @routes.route("/router/v1/site/inventory", methods=["GET"], auth="admin")
    def inventory(self, request: IRequest) -> bytes:
        registry = self.site.registry  # 404 on a slave
        document = documents.inventory(self.site.node_id, self.documents.public_url, registry.nodes(),
                                       self.documents.records(), role=self.site.role,
                                       telemetry=self.documents.own_telemetry())
        document["replica_choices"] = self.documents.replica_choices()
        if self.recipes is not None:
            document["recipes"] = [r.to_json() for r in self.recipes.book.recipes()]
        return json_response(request, document)

    @routes.route("/router/v1/site/recipes", methods=["GET"], auth="admin")
    def recipes_list(self, request: IRequest) -> bytes:
        self.site.require()
        recipes = self.recipes.book.recipes() if self.recipes is not None else ()
        return json_response(request, {"recipes": [r.to_json() for r in recipes]})

    @routes.route("/router/v1/site/recipes", methods=["POST"], auth="admin")
    def recipes_save(self, request: IRequest) -> bytes:
        self.site.require()
        assert self.recipes is not None
        saved = self.recipes.book.save(read_json(request))
        return json_response(request, {"ok": True, "recipe": saved.to_json()})

    @routes.route("/router/v1/site/recipes", methods=["DELETE"], auth="admin")
    def recipes_delete(self, request: IRequest) -> bytes:
        self.site.require()
        assert self.recipes is not None
        recipe_id = query_arg(request, "id")
        if not recipe_id:
            body = read_json(request, optional=True)
            recipe_id = body.get("id") if isinstance(body.get("id"), str) else None
        if not recipe_id:
            raise HTTPError(400, "id is required")
        removed = self.recipes.book.delete(recipe_id)
        return json_response(request, {"ok": True, "recipe": removed.to_json()})

    @routes.route("/router/v1/site/nodes/state", methods=["GET"], auth="admin")
    async def nodes_state(self, request: IRequest) -> bytes:
        agent = self.site.require()
        node_id = query_arg(request, "node_id")
        if not node_id:
            raise HTTPError(400, "node_id is required")
        if node_id == self.site.node_id:
            return json_response(request, self.documents.state_document())
        return json_response(request, await agent.node_json(node_id, NODE_STATE))

    @routes.route("/router/v1/site/nodes/states", methods=["GET"], auth="admin")
    async def nodes_states(self, request: IRequest) -> bytes:
        """Every node's ``/state`` in one answer (the WebUI Nodes page), plus ``node_errors``."""
        self.site.require()
        return json_response(request, await site_states(self.site, self.documents.state_document()))

    @routes.route("/router/v1/site/nodes/load", methods=["POST"], auth="admin")
    async def node_load(self, request: IRequest) -> bytes:
        """Load a model on one named node (``{node_id, model}``; model = that node's local ID)."""
        self.site.require()
        body = read_json(request)
        node_id = _node_arg(body)
        model = model_arg(body)
        return json_response(request, await self.site.on_node(
            node_id, lambda: self.admin.load(model),
            lambda info: self._done(self.site.client.load(info.node_url, model), model, node_id)))

    @routes.route("/router/v1/site/nodes/unload", methods=["POST"], auth="admin")
    async def node_unload(self, request: IRequest) -> bytes:
        """Unload on one named node (``{node_id, model?, target?}`` as that node's ``/unload``)."""
        self.site.require()
        body = read_json(request)
        node_id = _node_arg(body)
        model, target = body.get("model"), body.get("target")
        if model is not None and (not isinstance(model, str) or not model):
            raise HTTPError(400, "model must be a non-empty string")
        if target is not None and target not in UNLOAD_TARGETS:
            raise HTTPError(400, "target must be one of " + ", ".join(UNLOAD_TARGETS))
        return json_response(request, await self.site.on_node(
            node_id, lambda: self.admin.unload(model, target),
            lambda info: self._done(self.site.client.unload(info.node_url, model, target), model, node_id)))

    @staticmethod
    async def _done(work: Awaitable[Any], model: str | None, node_id: str) -> dict[str, Any]:
        """A remote load or unload's answer: done on ``node_id``."""
        await work
        return {"ok": True, "model": model, "node_id": node_id}

    @routes.route("/router/v1/site/", branch=True, methods=None, auth="admin", docs=())  # a 404, no operation
    def site_other(self, request: IRequest) -> bytes:
        self.site.require()
        raise not_found(request.path.decode("utf-8", "replace"))


__all__ = ["AdminAPI", "NodeServices", "model_arg"]
