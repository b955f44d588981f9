"""The lending editors of the site API: links (per lane) and lending settings.

Each editor is one workflow — validate → persist → install → push — that the HTTP handlers call with
parsed input and whose result they answer.  Errors are ``StatusError``s with the reason (400 for a
refused edit, 409 for a read-only node); nothing is stored when an edit is refused.

Eligibility of text models uses the master's own catalog for its own models.  A remote model is
judged from its registry record: text capability, context window, ``parallel`` and
``max_number_sequences`` (a peer too old to send the last two is judged on the first two).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol

import attrs

from routerd.catalog.eligibility import MULTIMODAL_MISMATCH, text_ineligibility
from routerd.catalog.model import ModelConfig
from routerd.config.lending import SPECS, LendingSettings, SettingError, normalise
from routerd.errors import HTTPError
from routerd.lending.layering import effective
from routerd.lending.links import LinkError, LinkSet, Peer
from routerd.routing.guardians import Guardian, GuardianError, GuardianSet, Scope, parse_guardian
from routerd.store.guardians import GuardianRow
from routerd.store.links import LinkRow
from routerd.store.store import Store
from routerd.wire.lending import LANES, Endpoint, Lane, Link, lane_model_id, to_json
from routerd.wire.records import ModelRecord
from routerd.wire.records import text_ineligibility as record_text_ineligibility

ACKNOWLEDGEMENT_REQUIRED = "acknowledgement_required"

_WHAT: dict[Lane, str] = {"image": "an image model", "text": "a text model"}


class CatalogView(Protocol):
    def get(self, local_id: str) -> ModelConfig | None: ...


class LendingTarget(Protocol):
    """The seams of ``LendingService`` an edit takes effect through."""

    @property
    def config_settings(self) -> LendingSettings: ...

    def install_links(self, image: LinkSet, text: LinkSet) -> None: ...

    def apply_settings(self, settings: LendingSettings) -> None: ...

    async def push(self) -> None: ...


@attrs.frozen
class EditRequest:
    """A parsed ``POST`` body."""

    anchor: Endpoint
    lends_to: tuple[Peer, ...]
    borrows_from: tuple[Peer, ...]
    acknowledge_different_weights: bool = False


def _name(end: Endpoint) -> str:
    return f"{end.node_id}/{end.model_id}"


def _link_flags(link: Link | None) -> dict[str, bool]:
    if link is None:
        return {"selected": False, "load_if_unloaded": True, "restore_after_borrow": False}
    return {"selected": True, "load_if_unloaded": link.load_if_unloaded,
            "restore_after_borrow": link.restore_after_borrow}


class LaneModels:
    """The registry's models of one lane, with eligibility and the picker's labels."""

    def __init__(self, lane: Lane, records: Sequence[ModelRecord], own_node_id: str,
                 catalog: CatalogView) -> None:
        self.lane = lane
        self._own_node_id = own_node_id
        self._catalog = catalog
        self._by_endpoint: dict[Endpoint, ModelRecord] = {}
        for record in records:
            model_id = lane_model_id(lane, record)
            if model_id is not None:
                self._by_endpoint.setdefault(Endpoint(record.node_id, model_id), record)

    def find(self, end: Endpoint) -> ModelRecord | None:
        return self._by_endpoint.get(end)

    def ineligibility(self, record: ModelRecord) -> str | None:
        """Why ``record`` cannot be linked in this lane on its own, or None.  The master's own models
        are judged from its catalog; a peer's from the facts its record carries."""
        if self.lane != "text":
            return None
        if record.node_id == self._own_node_id:
            local = self._catalog.get(record.local_id)
            if local is not None:
                return text_ineligibility(local)
        return record_text_ineligibility(record)

    def pair_ineligibility(self, anchor: ModelRecord | None, record: ModelRecord) -> str | None:
        """Why ``record`` cannot be linked with ``anchor`` (when known), or None."""
        reason = self.ineligibility(record)
        if reason is not None:
            return reason
        if (self.lane == "text" and anchor is not None
                and anchor.capabilities.multimodal != record.capabilities.multimodal):
            return MULTIMODAL_MISMATCH
        return None

    @staticmethod
    def weights_match(anchor: ModelRecord | None, record: ModelRecord) -> bool:
        return anchor is not None and anchor.model_hash != "" and anchor.model_hash == record.model_hash

    def _describe(self, end: Endpoint, record: ModelRecord) -> dict[str, Any]:
        out: dict[str, Any] = {"node_id": end.node_id, "model_id": end.model_id,
                               "filename": record.filename}
        if record.model_hash:
            out["model_hash"] = record.model_hash
        if record.config_hash:
            out["config_hash"] = record.config_hash
        if self.lane == "text":
            if record.capabilities.context > 0:
                out["context_size"] = record.capabilities.context
            out["multimodal"] = record.capabilities.multimodal
        out["available"] = record.available
        return out

    def anchor_view(self, anchor: Endpoint) -> dict[str, Any]:
        record = self.find(anchor)
        if record is None:
            return {"node_id": anchor.node_id, "model_id": anchor.model_id, "known": False}
        out = {**self._describe(anchor, record), "known": True}
        reason = self.ineligibility(record)
        out["eligible"] = reason is None
        if reason is not None:
            out["ineligible_reason"] = reason
        return out

    def candidates(self, anchor: Endpoint, links: LinkSet) -> list[dict[str, Any]]:
        """Every model of the lane on another node than the anchor's, sorted by node then model."""
        anchor_record = self.find(anchor)
        out: list[dict[str, Any]] = []
        for end in sorted(self._by_endpoint):
            if end.node_id == anchor.node_id:
                continue
            record = self._by_endpoint[end]
            entry = self._describe(end, record)
            reason = self.pair_ineligibility(anchor_record, record)
            entry["weights_match"] = self.weights_match(anchor_record, record)
            entry["eligible"] = reason is None
            if reason is not None:
                entry["ineligible_reason"] = reason
            entry["lends_to"] = _link_flags(links.link(anchor, end))
            entry["borrows_from"] = _link_flags(links.link(end, anchor))
            out.append(entry)
        return out

    def validate(self, edit: EditRequest, current: LinkSet) -> None:
        """Refuse (400) an edit that names an unknown, ineligible or same-node peer, or that makes
        a first link to different weights without the acknowledgement."""
        anchor = edit.anchor
        named = [("lends_to", i, p) for i, p in enumerate(edit.lends_to)]
        named += [("borrows_from", i, p) for i, p in enumerate(edit.borrows_from)]
        if not named:
            return
        anchor_record = self.find(anchor)
        if anchor_record is None:
            raise HTTPError(400, f"anchor {_name(anchor)} is not {_WHAT[self.lane]} known to the registry")
        reason = self.ineligibility(anchor_record)
        if reason is not None:
            raise HTTPError(400, f"anchor model cannot lend or borrow work: {reason}")
        already = {link.helper if link.owner == anchor else link.owner for link in current.touching(anchor)}
        unacknowledged: set[Endpoint] = set()
        for where, index, peer in named:
            end = Endpoint(peer.node_id, peer.model_id)
            if end.node_id == anchor.node_id:
                owner = anchor.model_id if where == "lends_to" else end.model_id
                raise HTTPError(400, f"{where}[{index}]: model {owner} cannot lend work to a model"
                                     " on its own node")
            record = self.find(end)
            if record is None:
                raise HTTPError(400, f"{where}[{index}]: {_name(end)} is not {_WHAT[self.lane]}"
                                     " known to the registry")
            reason = self.pair_ineligibility(anchor_record, record)
            if reason is not None:
                raise HTTPError(400, f"{where}[{index}]: {_name(end)} is not eligible: {reason}")
            if not self.weights_match(anchor_record, record) and end not in already:
                unacknowledged.add(end)
        if unacknowledged and not edit.acknowledge_different_weights:
            names = ", ".join(_name(end) for end in sorted(unacknowledged))
            raise HTTPError(
                400,
                f"{names}: weights differ from {_name(anchor)}'s; linking them for the first time"
                " needs acknowledge_different_weights: true",
                "invalid_request_error", ACKNOWLEDGEMENT_REQUIRED)


def _rows(links: Sequence[Link]) -> list[LinkRow]:
    return [LinkRow(link.owner.node_id, link.owner.model_id, link.helper.node_id, link.helper.model_id,
                    link.load_if_unloaded, link.restore_after_borrow) for link in links]


async def stored_links(store: Store, lane: Lane) -> LinkSet:
    return LinkSet.from_rows(lane, await store.links(lane))


async def install_stored_links(store: Store, lending: LendingTarget) -> None:
    """Install both lanes' stored links into the node's lending and push them to the slaves."""
    sets = {lane: await stored_links(store, lane) for lane in LANES}
    lending.install_links(sets["image"], sets["text"])
    await lending.push()


@attrs.frozen
class LinkEditor:
    """Read and edit one lane's links on the master."""

    lane: Lane
    store: Store
    lending: LendingTarget
    models: LaneModels

    async def view(self, anchor: Endpoint | None) -> dict[str, Any]:
        """``{links, anchor?, candidates?}``."""
        links = await stored_links(self.store, self.lane)
        out: dict[str, Any] = {"links": [to_json(link) for link in links]}
        if anchor is not None:
            out["anchor"] = self.models.anchor_view(anchor)
            out["candidates"] = self.models.candidates(anchor, links)
        return out

    async def replace(self, edit: EditRequest) -> dict[str, Any]:
        """Replace every link touching the anchor (both directions); the view after."""
        current = await stored_links(self.store, self.lane)
        self.models.validate(edit, current)
        try:
            updated = current.replace_anchor(edit.anchor, edit.lends_to, edit.borrows_from)
        except LinkError as exc:
            raise HTTPError(400, str(exc)) from None
        anchor = edit.anchor
        await self.store.replace_anchor_links(self.lane, anchor.node_id, anchor.model_id,
                                              _rows(updated.touching(anchor)))
        await install_stored_links(self.store, self.lending)
        return await self.view(anchor)

    async def delete(self, anchor: Endpoint) -> dict[str, Any]:
        """Remove every link touching the anchor; ``{links, removed}``."""
        removed = await self.store.delete_anchor_links(self.lane, anchor.node_id, anchor.model_id)
        await install_stored_links(self.store, self.lending)
        links = await stored_links(self.store, self.lane)
        return {"links": [to_json(link) for link in links], "removed": removed}


def normalise_batch(values: Mapping[str, Any]) -> dict[str, str]:
    """Every value's canonical text; one 400 naming every key that does not validate."""
    out: dict[str, str] = {}
    errors: list[str] = []
    for key, value in values.items():
        if value is None or isinstance(value, (dict, list)):
            errors.append(f"{key} must be a string, number or boolean")
            continue
        try:
            out[key] = normalise(key, value)
        except SettingError as exc:
            message = str(exc)
            errors.append(message if key in message else f"{key}: {message}")
    if errors:
        raise HTTPError(400, "invalid lending settings: " + "; ".join(errors))
    return out


@attrs.frozen
class SettingsEditor:
    """The master's lending settings: default < config < stored override."""

    store: Store | None
    lending: LendingTarget

    def _writable(self) -> Store:
        if self.store is None:
            raise HTTPError(409, "lending settings are read-only: this node has no router database",
                            "invalid_request_error", "read_only")
        return self.store

    async def document(self, *, apply: bool = False) -> dict[str, Any]:
        """``{entries, fingerprint, editable}``; with ``apply`` the effective settings are applied
        to the node's lending and pushed to the slaves first."""
        overrides = await self.store.setting_overrides() if self.store is not None else {}
        settings, entries = effective(self.lending.config_settings, overrides)
        if apply:
            self.lending.apply_settings(settings)
            await self.lending.push()
        return {"entries": entries, "fingerprint": settings.fingerprint(), "editable": self.store is not None}

    async def set(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Store the batch as overrides (all or nothing), apply and push."""
        store = self._writable()
        await store.set_setting_overrides(normalise_batch(values))
        return await self.document(apply=True)

    async def clear(self, key: str | None) -> dict[str, Any]:
        """Clear one override (``key``) or all of them, apply and push."""
        store = self._writable()
        if key is not None:
            if not key:
                raise HTTPError(400, "key must not be empty")
            if key not in SPECS and key not in await store.setting_overrides():
                raise HTTPError(400, f"unknown lending setting {key!r}")
        await store.delete_setting_overrides(key)
        return await self.document(apply=True)



# -- guardian models (spec "Guardian models"; contract §7 /router/v1/site/guardians) ------------------


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


async def stored_guardians(store: Store) -> GuardianSet:
    """The stored guardian settings; a row that does not parse is skipped."""
    entries: list[Guardian] = []
    for row in await store.guardians():
        try:
            entries.append(parse_guardian(
                {"scope": row.scope, "node_id": row.node_id or None, "model_id": row.model_id or None,
                 "guardian": {"node_id": row.guardian_node_id, "model_id": row.guardian_model_id}}))
        except GuardianError:
            continue
    return GuardianSet(entries)


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
        await self.store.put_guardians([
            GuardianRow(e.scope, e.node_id, e.model_id, e.guardian.node_id, e.guardian.model_id)
            for e in entries])
        await self._apply()
        return await self.view()

    async def delete(self, scope: Scope, node_id: str, model_id: str) -> dict[str, Any]:
        """Remove the setting of one scope key; the view after, with ``removed``."""
        removed = await self.store.delete_guardian(scope, node_id, model_id)
        await self._apply()
        return {**await self.view(), "removed": removed}


__all__ = [
    "ACKNOWLEDGEMENT_REQUIRED",
    "CatalogView",
    "EditRequest",
    "GuardianEditor",
    "GuardianTarget",
    "LaneModels",
    "LendingTarget",
    "LinkEditor",
    "SettingsEditor",
    "guardian_ineligibility",
    "install_stored_links",
    "normalise_batch",
    "stored_guardians",
    "stored_links",
]
