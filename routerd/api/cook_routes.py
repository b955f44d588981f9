"""Cook (contract §7): build a ``.kcpps`` on one node from the model files its ``models.file_roots``
expose, preview it with what ``routerd check`` says, apply it (written whole into that node's
``models.config_dir``, then a reload rescans it) or remove one Cook wrote.

The site routes (admin) take ``node_id`` (default: the node serving the site API); for another node
the master forwards the body through that node's ``/router/v1/node/cook/*`` route (cluster token),
so paths are always resolved by the node that holds the files (:mod:`routerd.assets.cook`).

A body ``{"recipe": {...}}`` cooks a split recipe across nodes instead (the fields of
``POST /router/v1/site/recipes``): preview validates it as a save would, apply saves it
(:class:`routerd.registry.recipes.RecipeBook`); the site's recipe routes list and delete it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import attrs
from twisted.internet.defer import Deferred
from twisted.web.iweb import IRequest

from routerd.api.jsonio import json_response, read_json
from routerd.api.reply import query_arg
from routerd.api.routes import Routes
from routerd.paths import NODE_COOK
from routerd.site.cook import Kitchen
from routerd.site.service import SiteService

if TYPE_CHECKING:
    from routerd.registry.records import NodeInfo

SITE_COOK = "/router/v1/site/cook"


@attrs.define(slots=False, kw_only=True)
class CookAPI:
    site: SiteService
    kitchen: Kitchen

    routes = Routes()

    # -- the site: this node or another through the master --------------------------

    async def _on_node(self, node_id: Any, here: Callable[[], Any], path: str,
                       body: dict[str, Any] | None = None) -> Any:
        """``here()`` on this node, else the node API call ``path`` (a GET, or a POST of ``body``)
        on the node ``node_id`` names."""
        async def local() -> Any:
            answer = here()
            return await answer if isinstance(answer, Awaitable) else answer

        def there(info: NodeInfo) -> Deferred[Any]:
            client = self.site.client
            if body is None:
                return client.get_json(info.node_url, path)
            return client.post_json(info.node_url, path, body)

        return await self.site.on_node(node_id, local, there)

    @routes.route(f"{SITE_COOK}/files", methods=["GET"], auth="admin")
    async def site_files(self, request: IRequest) -> bytes:
        answer = await self._on_node(query_arg(request, "node_id"), self.kitchen.files, f"{NODE_COOK}/files")
        return json_response(request, answer)

    @routes.route(f"{SITE_COOK}/preview", methods=["POST"], auth="admin")
    async def site_preview(self, request: IRequest) -> bytes:
        return json_response(request, await self._site_cook(read_json(request), apply=False))

    @routes.route(f"{SITE_COOK}/apply", methods=["POST"], auth="admin")
    async def site_apply(self, request: IRequest) -> bytes:
        return json_response(request, await self._site_cook(read_json(request), apply=True))

    async def _site_cook(self, body: dict[str, Any], *, apply: bool) -> Any:
        """Preview or apply a cook order (or a split recipe) on the node it names."""
        if "recipe" in body:
            self.site.require()  # a slave answers 404 like every site route
            return self.kitchen.recipe(body, save=apply)
        here = (lambda: self.kitchen.apply(body)) if apply else (lambda: self.kitchen.preview(body))
        step = "apply" if apply else "preview"
        return await self._on_node(body.get("node_id"), here, f"{NODE_COOK}/{step}", body)

    @routes.route(f"{SITE_COOK}/<model_id>", methods=["DELETE"], auth="admin")
    async def site_delete(self, request: IRequest, model_id: str) -> bytes:
        answer = await self._on_node(query_arg(request, "node_id"), lambda: self.kitchen.delete(model_id),
                                     f"{NODE_COOK}/delete", {"id": model_id})
        return json_response(request, answer)

    # -- node routes (cluster token): what the master forwards ----------------------

    @routes.route(f"{NODE_COOK}/files", methods=["GET"], auth="cluster")
    def node_files(self, request: IRequest) -> bytes:
        return json_response(request, self.kitchen.files())

    @routes.route(f"{NODE_COOK}/preview", methods=["POST"], auth="cluster")
    def node_preview(self, request: IRequest) -> bytes:
        return json_response(request, self.kitchen.preview(read_json(request)))

    @routes.route(f"{NODE_COOK}/apply", methods=["POST"], auth="cluster")
    async def node_apply(self, request: IRequest) -> bytes:
        return json_response(request, await self.kitchen.apply(read_json(request)))

    @routes.route(f"{NODE_COOK}/delete", methods=["POST"], auth="cluster")
    async def node_delete(self, request: IRequest) -> bytes:
        return json_response(request, await self.kitchen.delete(read_json(request).get("id")))


__all__ = ["CookAPI"]
