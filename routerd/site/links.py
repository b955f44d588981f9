"""The site's lending links (per lane; contract §7 routing groups): the models of a lane with their
eligibility, and the editor that reads and replaces the links touching one anchor.

The editor is one workflow — validate → persist → install → push — that the HTTP handlers call with
parsed input and whose result they answer.  Errors are ``StatusError``s with the reason (400 for a
refused edit); nothing is stored when an edit is refused.

Eligibility of text models uses the master's own catalog for its own models.  A remote model is
judged from its registry record: text capability, context window, ``parallel`` and
``max_number_sequences`` (a peer too old to send the last two is judged on the first two).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import attrs

from routerd.catalog.eligibility import MULTIMODAL_MISMATCH, text_ineligibility
from routerd.catalog.model import ModelConfig
from routerd.config.lending import LendingSettings
from routerd.errors import HTTPError
from routerd.lending.bootstrap import link_rows
from routerd.lending.links import LinkError, LinkSet, Peer
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

    async def refresh(self) -> None:
        """Push links and settings to the slaves and plan with them now (a no-op off a master)."""


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


async def stored_links(store: Store, lane: Lane) -> LinkSet:
    return LinkSet.from_rows(lane, await store.links(lane))


async def install_stored_links(store: Store, lending: LendingTarget) -> None:
    """Install both lanes' stored links into the node's lending, push them to the slaves and
    re-plan with them at once (as a settings change does)."""
    sets = {lane: await stored_links(store, lane) for lane in LANES}
    lending.install_links(sets["image"], sets["text"])
    await lending.refresh()


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
                                              link_rows(updated.touching(anchor)))
        await install_stored_links(self.store, self.lending)
        return await self.view(anchor)

    async def delete(self, anchor: Endpoint) -> dict[str, Any]:
        """Remove every link touching the anchor; ``{links, removed}``."""
        removed = await self.store.delete_anchor_links(self.lane, anchor.node_id, anchor.model_id)
        await install_stored_links(self.store, self.lending)
        links = await stored_links(self.store, self.lane)
        return {"links": [to_json(link) for link in links], "removed": removed}


__all__ = [
    "ACKNOWLEDGEMENT_REQUIRED",
    "CatalogView",
    "EditRequest",
    "LaneModels",
    "LendingTarget",
    "LinkEditor",
    "install_stored_links",
    "stored_links",
]
