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

from typing import TYPE_CHECKING, Any, Protocol

from twisted.internet.defer import Deferred
from twisted.web.iweb import IRequest

from routerd.api.errors import master_only
from routerd.api.jsonio import json_response, read_json
from routerd.api.remote import remote_answer
from routerd.api.reply import query_arg
from routerd.api.routes import Routes
from routerd.assets.cook import CookError, CookShelf, cook, model_files, parse_order, valid_id
from routerd.errors import HTTPError
from routerd.process.reload import ReloadFailed

if TYPE_CHECKING:
    from routerd.cluster.master import MasterAgent
    from routerd.config.schema import Config
    from routerd.inference.recipes import RecipeRouter
    from routerd.process.reload import ReloadReport

NODE_COOK = "/router/v1/node/cook"
SITE_COOK = "/router/v1/site/cook"
_STATUS = {"not_found": 404, "exists": 409, "not_cooked": 409, "no_file_roots": 403}


class _Reloads(Protocol):
    def reload(self) -> Deferred[ReloadReport]: ...


class CookNode(Protocol):
    """What Cook reads of a node: its ID and config, the site it serves and its reloader."""

    @property
    def node_id(self) -> str: ...

    @property
    def config(self) -> Config: ...

    @property
    def site(self) -> MasterAgent | None: ...

    @property
    def reloader(self) -> _Reloads: ...

    @property
    def recipes(self) -> RecipeRouter | None: ...


def _refusal(exc: CookError) -> HTTPError:
    status = _STATUS.get(exc.code, 400)
    kind = "not_found" if status == 404 else "invalid_request_error"
    return HTTPError(status, str(exc), kind, exc.code)


class CookAPI:
    routes = Routes()

    def __init__(self, node: CookNode) -> None:
        self.node = node

    # -- this node ------------------------------------------------------------------

    def _cooked(self, body: dict[str, Any]) -> Any:
        config = self.node.config
        try:
            return cook(parse_order(body), config.models.file_roots, config.models.config_dir, config)
        except CookError as exc:
            raise _refusal(exc) from None

    def _preview_local(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"node_id": self.node.node_id, **self._cooked(body).to_json()}

    async def _apply_local(self, body: dict[str, Any]) -> dict[str, Any]:
        cooked = self._cooked(body)
        if cooked.problems:
            raise HTTPError(400, "routerd check refuses the config: " + "; ".join(cooked.problems),
                            "invalid_request_error", "cook_check_failed")
        try:
            path = CookShelf(self.node.config.models.config_dir).write(cooked)
        except CookError as exc:
            raise _refusal(exc) from None
        report = await self._rescan()
        return {"node_id": self.node.node_id, "applied": True, "path": path, **cooked.to_json(),
                "reload": report}

    async def _delete_local(self, model_id: Any) -> dict[str, Any]:
        try:
            path = CookShelf(self.node.config.models.config_dir).remove(valid_id(model_id))
        except CookError as exc:
            raise _refusal(exc) from None
        return {"node_id": self.node.node_id, "deleted": True, "id": model_id, "path": path,
                "reload": await self._rescan()}

    def _files_local(self) -> dict[str, Any]:
        models = self.node.config.models
        return {"node_id": self.node.node_id, "file_roots": len(models.file_roots),
                "files": model_files(models.file_roots), "cooked": CookShelf(models.config_dir).cooked()}

    async def _rescan(self) -> dict[str, Any]:
        try:
            report = await self.node.reloader.reload()
        except ReloadFailed as exc:  # the file is written; the YAML beside it is what failed
            raise HTTPError(400, "written, but the reload was refused: " + "; ".join(exc.errors),
                            "invalid_request_error", "reload_refused") from None
        return report.to_json()

    # -- the site: this node or another through the master --------------------------

    def _target(self, node_id: Any) -> str | None:
        """The URL of the node ``node_id`` names, or None for this node."""
        site = self.node.site
        if site is None:
            raise master_only()
        if node_id in (None, "", self.node.node_id):
            return None
        if not isinstance(node_id, str):
            raise HTTPError(400, "node_id must be a string")
        info = site.registry.node(node_id)
        if info is None:
            raise HTTPError(404, f"node {node_id[:80]!r} is not known", "not_found", "node_not_found")
        return info.node_url

    def _master(self) -> MasterAgent:
        assert self.node.site is not None
        return self.node.site

    @routes.route(f"{SITE_COOK}/files", methods=["GET"], auth="admin")
    async def site_files(self, request: IRequest) -> bytes:
        url = self._target(query_arg(request, "node_id"))
        if url is None:
            return json_response(request, self._files_local())
        answer = await remote_answer(self._master().client.get_json(url, f"{NODE_COOK}/files"))
        return json_response(request, answer)

    def _recipe(self, body: dict[str, Any], save: bool) -> dict[str, Any]:
        """A split recipe: validated (preview) or saved (apply) by the site's recipe book."""
        self._target(None)  # a slave answers 404 like every site route
        if set(body) != {"recipe"} or not isinstance(body["recipe"], dict):
            raise HTTPError(400, "a split recipe is cooked as {\"recipe\": {...}} and nothing else",
                            "invalid_request_error", "invalid_cook")
        recipes = self.node.recipes
        if recipes is None:
            raise HTTPError(404, "split recipes are not served here", "not_found", "not_found")
        recipe = recipes.book.save(body["recipe"]) if save else recipes.book.check(body["recipe"])
        return {"kind": "recipe", "recipe": recipe.to_json(), "applied": save,
                "check": {"ok": True, "errors": []}}

    @routes.route(f"{SITE_COOK}/preview", methods=["POST"], auth="admin")
    async def site_preview(self, request: IRequest) -> bytes:
        body = read_json(request)
        if "recipe" in body:
            return json_response(request, self._recipe(body, save=False))
        url = self._target(body.get("node_id"))
        if url is None:
            return json_response(request, self._preview_local(body))
        answer = await remote_answer(self._master().client.post_json(url, f"{NODE_COOK}/preview", body))
        return json_response(request, answer)

    @routes.route(f"{SITE_COOK}/apply", methods=["POST"], auth="admin")
    async def site_apply(self, request: IRequest) -> bytes:
        body = read_json(request)
        if "recipe" in body:
            return json_response(request, self._recipe(body, save=True))
        url = self._target(body.get("node_id"))
        if url is None:
            return json_response(request, await self._apply_local(body))
        answer = await remote_answer(self._master().client.post_json(url, f"{NODE_COOK}/apply", body))
        return json_response(request, answer)

    @routes.route(f"{SITE_COOK}/<model_id>", methods=["DELETE"], auth="admin")
    async def site_delete(self, request: IRequest, model_id: str) -> bytes:
        url = self._target(query_arg(request, "node_id"))
        if url is None:
            return json_response(request, await self._delete_local(model_id))
        answer = await remote_answer(self._master().client.post_json(url, f"{NODE_COOK}/delete",
                                                                     {"id": model_id}))
        return json_response(request, answer)

    # -- node routes (cluster token): what the master forwards ----------------------

    @routes.route(f"{NODE_COOK}/files", methods=["GET"], auth="cluster")
    def node_files(self, request: IRequest) -> bytes:
        return json_response(request, self._files_local())

    @routes.route(f"{NODE_COOK}/preview", methods=["POST"], auth="cluster")
    def node_preview(self, request: IRequest) -> bytes:
        return json_response(request, self._preview_local(read_json(request)))

    @routes.route(f"{NODE_COOK}/apply", methods=["POST"], auth="cluster")
    async def node_apply(self, request: IRequest) -> bytes:
        return json_response(request, await self._apply_local(read_json(request)))

    @routes.route(f"{NODE_COOK}/delete", methods=["POST"], auth="cluster")
    async def node_delete(self, request: IRequest) -> bytes:
        return json_response(request, await self._delete_local(read_json(request).get("id")))


__all__ = ["CookAPI", "CookNode"]
