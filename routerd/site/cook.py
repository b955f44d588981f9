"""Cook on this node (contract §7): build a ``.kcpps`` from the model files its ``models.file_roots``
expose, preview it with what ``routerd check`` says, apply it (written whole into
``models.config_dir``, then a reload rescans it) or remove one Cook wrote; and cook a split recipe
across nodes with the site's recipe book.

The site asks the node that holds the files (``routerd.api.cook_routes``); paths are always resolved
by that node (:mod:`routerd.assets.cook`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import attrs
from twisted.internet.defer import Deferred

from routerd.assets.cook import CookError, CookShelf, cook, model_files, parse_order, valid_id
from routerd.errors import HTTPError
from routerd.process.reload import ReloadFailed

if TYPE_CHECKING:
    from routerd.config.schema import Config
    from routerd.inference.recipes import RecipeRouter
    from routerd.process.reload import ReloadReport

_STATUS = {"not_found": 404, "exists": 409, "not_cooked": 409, "no_file_roots": 403}


class Reloads(Protocol):
    def reload(self) -> Deferred[ReloadReport]: ...


def _refusal(exc: CookError) -> HTTPError:
    status = _STATUS.get(exc.code, 400)
    kind = "not_found" if status == 404 else "invalid_request_error"
    return HTTPError(status, str(exc), kind, exc.code)


@attrs.define
class Kitchen:
    """This node's cook; ``config`` is read per call (a reload may change it)."""

    node_id: str
    config: Callable[[], Config]
    reloader: Reloads
    recipes: RecipeRouter | None = None

    def _cooked(self, body: dict[str, Any]) -> Any:
        config = self.config()
        try:
            return cook(parse_order(body), config.models.file_roots, config.models.config_dir, config)
        except CookError as exc:
            raise _refusal(exc) from None

    def preview(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"node_id": self.node_id, **self._cooked(body).to_json()}

    async def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        cooked = self._cooked(body)
        if cooked.problems:
            raise HTTPError(400, "routerd check refuses the config: " + "; ".join(cooked.problems),
                            "invalid_request_error", "cook_check_failed")
        try:
            path = CookShelf(self.config().models.config_dir).write(cooked)
        except CookError as exc:
            raise _refusal(exc) from None
        report = await self._rescan()
        return {"node_id": self.node_id, "applied": True, "path": path, **cooked.to_json(),
                "reload": report}

    async def delete(self, model_id: Any) -> dict[str, Any]:
        try:
            path = CookShelf(self.config().models.config_dir).remove(valid_id(model_id))
        except CookError as exc:
            raise _refusal(exc) from None
        return {"node_id": self.node_id, "deleted": True, "id": model_id, "path": path,
                "reload": await self._rescan()}

    def files(self) -> dict[str, Any]:
        models = self.config().models
        return {"node_id": self.node_id, "file_roots": len(models.file_roots),
                "files": model_files(models.file_roots), "cooked": CookShelf(models.config_dir).cooked()}

    async def _rescan(self) -> dict[str, Any]:
        try:
            report = await self.reloader.reload()
        except ReloadFailed as exc:  # the file is written; the YAML beside it is what failed
            raise HTTPError(400, "written, but the reload was refused: " + "; ".join(exc.errors),
                            "invalid_request_error", "reload_refused") from None
        return report.to_json()

    def recipe(self, body: dict[str, Any], save: bool) -> dict[str, Any]:
        """A split recipe: validated (preview) or saved (apply) by the site's recipe book."""
        if set(body) != {"recipe"} or not isinstance(body["recipe"], dict):
            raise HTTPError(400, "a split recipe is cooked as {\"recipe\": {...}} and nothing else",
                            "invalid_request_error", "invalid_cook")
        recipes = self.recipes
        if recipes is None:
            raise HTTPError(404, "split recipes are not served here", "not_found", "not_found")
        recipe = recipes.book.save(body["recipe"]) if save else recipes.book.check(body["recipe"])
        return {"kind": "recipe", "recipe": recipe.to_json(), "applied": save,
                "check": {"ok": True, "errors": []}}


__all__ = ["Kitchen", "Reloads"]
