"""The site's guardian models (spec "Guardian models"; contract §7 ``/router/v1/site/guardians``):
which multimodal text model answers for a text-only model, per model, node or the whole cluster.

The editor validates against the registry, persists, installs into the node's lending and pushes to
the slaves with the links; a refused setting answers 400 with the reason and stores nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Protocol

from routerd.errors import HTTPError
from routerd.lending.bootstrap import guardian_rows, stored_guardians
from routerd.routing.guardians import Guardian, GuardianSet, Scope
from routerd.store.store import Store
from routerd.wire.lending import Endpoint
from routerd.wire.records import ModelRecord


class GuardianTarget(Protocol):
    """The seams of ``LendingService`` a guardian edit takes effect through."""

    def install_guardians(self, guardians: GuardianSet) -> None: ...

    async def push(self) -> None: ...


def guardian_ineligibility(record: ModelRecord) -> str | None:
    """Why ``record`` cannot be a guardian (it must be a multimodal text model), or None."""
    if not record.capabilities.llm:
        return "it is not a text model"
    if not record.capabilities.multimodal:
        return "it is not multimodal (a text model with an mmproj is needed)"
    return None


class GuardianEditor:
    """The master's guardian settings: validate → persist → install → push.

    A guardian must be a multimodal text model known to the registry; a model scope names a text
    model known to the registry (its local ID on its node); a node scope names a known node.
    Anything else is refused with 400 and the reason, and nothing is stored.
    """

    def __init__(self, store: Store, lending: GuardianTarget, records: Sequence[ModelRecord],
                 nodes: Collection[str]) -> None:
        self.store = store
        self.lending = lending
        self.records = list(records)
        self.nodes = set(nodes) | {r.node_id for r in self.records}

    def _find(self, node_id: str, model_id: str) -> ModelRecord | None:
        for record in self.records:
            if record.node_id == node_id and record.local_id == model_id:
                return record
        return None

    def validate(self, entry: Guardian, where: str = "") -> None:
        at = f"{where}: " if where else ""
        if entry.scope in ("model", "node") and entry.node_id not in self.nodes:
            raise HTTPError(400, f"{at}node {entry.node_id!r} is not known to the registry")
        if entry.scope == "model":
            target = self._find(entry.node_id, entry.model_id)
            if target is None or not target.capabilities.llm:
                raise HTTPError(400, f"{at}model {entry.node_id}/{entry.model_id} is not a text model"
                                     " known to the registry")
            if entry.guardian == Endpoint(entry.node_id, entry.model_id):
                raise HTTPError(400, f"{at}a model cannot be its own guardian")
        g = entry.guardian
        if g.node_id not in self.nodes:
            raise HTTPError(400, f"{at}guardian node {g.node_id!r} is not known to the registry")
        record = self._find(g.node_id, g.model_id)
        if record is None:
            raise HTTPError(400, f"{at}guardian {g.node_id}/{g.model_id} is not a model known to the"
                                 " registry")
        reason = guardian_ineligibility(record)
        if reason is not None:
            raise HTTPError(400, f"{at}guardian {g.node_id}/{g.model_id} is not a multimodal text model:"
                                 f" {reason}", "invalid_request_error", "guardian_not_multimodal")

    async def view(self) -> dict[str, Any]:
        """``{guardians, candidates, text_models}``: the settings; every model that may be a
        guardian; every text-only model with the guardian that applies to it (or null)."""
        current = await stored_guardians(self.store)
        candidates = [{"node_id": r.node_id, "model_id": r.local_id, "filename": r.filename,
                       "available": r.available}
                      for r in sorted(self.records, key=lambda r: (r.node_id, r.local_id))
                      if guardian_ineligibility(r) is None]
        text_models: list[dict[str, Any]] = []
        for r in sorted(self.records, key=lambda r: (r.node_id, r.local_id)):
            if not r.capabilities.llm or r.capabilities.multimodal:
                continue
            applied = current.resolve(r.node_id, r.local_id)
            text_models.append({"node_id": r.node_id, "model_id": r.local_id, "filename": r.filename,
                                "available": r.available,
                                "guardian": None if applied is None else {
                                    "scope": applied.scope, "node_id": applied.guardian.node_id,
                                    "model_id": applied.guardian.model_id}})
        return {"guardians": current.to_json(), "candidates": candidates, "text_models": text_models}

    async def _apply(self) -> None:
        self.lending.install_guardians(await stored_guardians(self.store))
        await self.lending.push()

    async def put(self, entries: Sequence[Guardian]) -> dict[str, Any]:
        """Store every setting (replacing the one of the same scope key) or none; the view after."""
        for index, entry in enumerate(entries):
            self.validate(entry, f"guardians[{index}]" if len(entries) > 1 else "")
        await self.store.put_guardians(guardian_rows(entries))
        await self._apply()
        return await self.view()

    async def delete(self, scope: Scope, node_id: str, model_id: str) -> dict[str, Any]:
        """Remove the setting of one scope key; the view after, with ``removed``."""
        removed = await self.store.delete_guardian(scope, node_id, model_id)
        await self._apply()
        return {**await self.view(), "removed": removed}


__all__ = ["GuardianEditor", "GuardianTarget", "guardian_ineligibility", "stored_guardians"]
