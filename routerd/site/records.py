"""The site's admin records: lending links, lending settings and guardian models, each edited by its
one editor (:mod:`~routerd.site.links`, :mod:`~routerd.site.settings`, :mod:`~routerd.site.guardians`).

:class:`SiteRecords` hands out the editor of a request after the master-only check; the router
database and the catalog are read per request (the store opens after the node is built, a reload
replaces the catalog).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from routerd.errors import HTTPError
from routerd.site.guardians import GuardianEditor
from routerd.site.links import CatalogView, LaneModels, LinkEditor
from routerd.site.service import SiteService
from routerd.site.settings import SettingsEditor
from routerd.store.store import Store
from routerd.wire.lending import Lane


@attrs.define
class SiteRecords:
    """The editors of the site's admin records; ``lending`` is the node's lending service (its
    seams ``LendingTarget`` and ``GuardianTarget``)."""

    site: SiteService
    lending: Any
    store: Callable[[], Store | None]
    catalog: Callable[[], CatalogView]

    def links(self, lane: Lane) -> LinkEditor:
        """One lane's link editor; 404 on a slave or without a router database."""
        registry = self.site.registry
        store = self.store()
        if store is None:
            raise HTTPError(404, "routing links are not configured", "not_found", "not_found")
        models = LaneModels(lane, registry.records(), self.site.node_id, self.catalog())
        return LinkEditor(lane, store, self.lending, models)

    def settings(self) -> SettingsEditor:
        """The lending settings editor; 404 on a slave."""
        self.site.require()
        return SettingsEditor(self.store(), self.lending)

    def guardians(self) -> GuardianEditor:
        """The guardian editor; 404 on a slave or without a router database."""
        registry = self.site.registry
        store = self.store()
        if store is None:
            raise HTTPError(404, "guardian models are not configured", "not_found", "not_found")
        nodes = {self.site.node_id, *(info.node_id for info in registry.nodes())}
        return GuardianEditor(store, self.lending, registry.records(), nodes)


__all__ = ["SiteRecords"]
