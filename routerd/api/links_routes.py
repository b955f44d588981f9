"""Site links API (contract §7; lending reference §2.4): ``/router/v1/site/routing-groups`` (image
lane, model id = the model's image ID) and ``/router/v1/site/text-routing-groups`` (text lane,
model id = its local ID).  Master only; 404 elsewhere.

* ``GET [?node_id&model_id]`` → ``{links, anchor?, candidates?}``.  Candidates are every model of
  the lane on another node, ineligible ones included (``eligible: false`` with the reason).
* ``POST {anchor, lends_to, borrows_from, acknowledge_different_weights?}`` replaces every link
  touching the anchor, in both directions.  A first link between the anchor and a model whose
  weights differ from the anchor's (``weights_match`` false) is refused with 400
  ``acknowledgement_required`` unless acknowledged.  "First" is per model pair: a peer already
  linked to the anchor in either direction needs no new acknowledgement.
* ``DELETE ?node_id&model_id`` removes every link touching the anchor.

After a change the links of both lanes are read back from the store, installed into the node's
lending and pushed to the slaves.  Nothing is stored when a request is refused.

Eligibility of text models uses the master's own catalog for its own models.  A remote model is
judged from its registry record: text capability, context window, ``parallel`` and
``max_number_sequences`` (a peer too old to send the last two is judged on the first two).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
from twisted.web.iweb import IRequest

from routerd.api.errors import api_app
from routerd.api.jsonio import json_response, read_json
from routerd.api.lending_http import (
    CatalogView,
    LendingNode,
    require_master,
    want_bool,
    want_str,
)
from routerd.api.reply import query_arg
from routerd.catalog.eligibility import MULTIMODAL_MISMATCH, text_ineligibility
from routerd.catalog.model import ModelConfig
from routerd.errors import HTTPError
from routerd.lending.links import LinkError, LinkSet, Peer
from routerd.store.links import LinkRow
from routerd.store.store import Store
from routerd.wire.lending import LANES, Endpoint, Lane, Link, lane_model_id, to_json
from routerd.wire.records import ModelRecord

LANE_PATHS: dict[Lane, str] = {
    "image": "/router/v1/site/routing-groups",
    "text": "/router/v1/site/text-routing-groups",
}

ACKNOWLEDGEMENT_REQUIRED = "acknowledgement_required"

_WHAT: dict[Lane, str] = {"image": "an image model", "text": "a text model"}


@attrs.frozen
class EditRequest:
    """A parsed ``POST`` body."""

    anchor: Endpoint
    lends_to: tuple[Peer, ...]
    borrows_from: tuple[Peer, ...]
    acknowledge_different_weights: bool = False


def _endpoint(value: Any, where: str) -> Endpoint:
    if not isinstance(value, dict):
        raise HTTPError(400, f"{where} must be an object with node_id and model_id")
    node_id = want_str(value.get("node_id"), f"{where}.node_id")
    model_id = want_str(value.get("model_id"), f"{where}.model_id")
    if not node_id:
        raise HTTPError(400, f"{where}.node_id must not be empty")
    if not model_id:
        raise HTTPError(400, f"{where}.model_id must not be empty")
    return Endpoint(node_id, model_id)


def _peers(value: Any, where: str) -> tuple[Peer, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise HTTPError(400, f"{where} must be a list")
    out: list[Peer] = []
    for index, item in enumerate(value):
        at = f"{where}[{index}]"
        end = _endpoint(item, at)
        out.append(Peer(end.node_id, end.model_id,
                        want_bool(item.get("load_if_unloaded"), f"{at}.load_if_unloaded", True),
                        want_bool(item.get("restore_after_borrow"), f"{at}.restore_after_borrow", False)))
    return tuple(out)


def parse_edit(body: dict[str, Any]) -> EditRequest:
    """The ``POST`` body; 400 naming the field when it is malformed."""
    if "anchor" not in body:
        raise HTTPError(400, "anchor is required")
    return EditRequest(
        anchor=_endpoint(body["anchor"], "anchor"),
        lends_to=_peers(body.get("lends_to"), "lends_to"),
        borrows_from=_peers(body.get("borrows_from"), "borrows_from"),
        acknowledge_different_weights=want_bool(
            body.get("acknowledge_different_weights"), "acknowledge_different_weights", False),
    )


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

    def _config(self, record: ModelRecord) -> ModelConfig:
        if record.node_id == self._own_node_id:
            local = self._catalog.get(record.local_id)
            if local is not None:
                return local
        return ModelConfig(local_id=record.local_id, filename=record.filename, path="",
                           backend_mode=record.backend_mode, capabilities=record.capabilities,
                           config_hash=record.config_hash, image_id=record.image_id,
                           model_hash=record.model_hash, parallel=record.parallel,
                           vllm_max_sequences=record.max_number_sequences)

    def ineligibility(self, record: ModelRecord) -> str | None:
        """Why ``record`` cannot be linked in this lane on its own, or None."""
        if self.lane == "text":
            return text_ineligibility(self._config(record))
        return None

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


def _anchor_query(request: IRequest, required: bool) -> Endpoint | None:
    node_id = query_arg(request, "node_id") or ""
    model_id = query_arg(request, "model_id") or ""
    if not node_id and not model_id and not required:
        return None
    if not node_id or not model_id:
        raise HTTPError(400, "node_id and model_id are both required to name the anchor")
    return Endpoint(node_id, model_id)


class LinksAPI:
    """The three methods of both lanes' endpoints."""

    app = api_app()

    def __init__(self, node: LendingNode) -> None:
        self.node = node

    def _store(self) -> Store:
        require_master(self.node)
        if self.node.store is None:
            raise HTTPError(404, "routing links are not configured", "not_found", "not_found")
        return self.node.store

    def _models(self, lane: Lane) -> LaneModels:
        master = require_master(self.node)
        return LaneModels(lane, master.registry.records(), self.node.node_id, self.node.catalog)

    async def _links(self, store: Store, lane: Lane) -> LinkSet:
        return LinkSet.from_rows(lane, await store.links(lane))

    async def _answer(self, request: IRequest, store: Store, lane: Lane, anchor: Endpoint | None) -> bytes:
        links = await self._links(store, lane)
        out: dict[str, Any] = {"links": [to_json(link) for link in links]}
        if anchor is not None:
            models = self._models(lane)
            out["anchor"] = models.anchor_view(anchor)
            out["candidates"] = models.candidates(anchor, links)
        return json_response(request, out)

    async def _install(self, store: Store) -> None:
        """Install both lanes' stored links into the node's lending and push them to the slaves."""
        sets = {lane: await self._links(store, lane) for lane in LANES}
        self.node.lending.install_links(sets["image"], sets["text"])
        await self.node.lending.push()

    async def get(self, request: IRequest, lane: Lane) -> bytes:
        store = self._store()
        return await self._answer(request, store, lane, _anchor_query(request, required=False))

    async def post(self, request: IRequest, lane: Lane) -> bytes:
        store = self._store()
        edit = parse_edit(read_json(request))
        current = await self._links(store, lane)
        self._models(lane).validate(edit, current)
        try:
            updated = current.replace_anchor(edit.anchor, edit.lends_to, edit.borrows_from)
        except LinkError as exc:
            raise HTTPError(400, str(exc)) from None
        anchor = edit.anchor
        await store.replace_anchor_links(lane, anchor.node_id, anchor.model_id,
                                         _rows(updated.touching(anchor)))
        await self._install(store)
        return await self._answer(request, store, lane, anchor)

    async def delete(self, request: IRequest, lane: Lane) -> bytes:
        store = self._store()
        anchor = _anchor_query(request, required=True)
        assert anchor is not None
        removed = await store.delete_anchor_links(lane, anchor.node_id, anchor.model_id)
        await self._install(store)
        links = await self._links(store, lane)
        return json_response(request, {"links": [to_json(link) for link in links], "removed": removed})

    @app.route(LANE_PATHS["image"], methods=["GET"])
    def get_image(self, request: IRequest) -> Any:
        return self.get(request, "image")

    @app.route(LANE_PATHS["image"], methods=["POST"])
    def post_image(self, request: IRequest) -> Any:
        return self.post(request, "image")

    @app.route(LANE_PATHS["image"], methods=["DELETE"])
    def delete_image(self, request: IRequest) -> Any:
        return self.delete(request, "image")

    @app.route(LANE_PATHS["text"], methods=["GET"])
    def get_text(self, request: IRequest) -> Any:
        return self.get(request, "text")

    @app.route(LANE_PATHS["text"], methods=["POST"])
    def post_text(self, request: IRequest) -> Any:
        return self.post(request, "text")

    @app.route(LANE_PATHS["text"], methods=["DELETE"])
    def delete_text(self, request: IRequest) -> Any:
        return self.delete(request, "text")


__all__ = [
    "ACKNOWLEDGEMENT_REQUIRED",
    "LANE_PATHS",
    "EditRequest",
    "LaneModels",
    "LinksAPI",
    "parse_edit",
]
