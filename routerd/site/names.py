"""One name per model across the site's pages (contract §9): the registry's public ID.

A node records a request under the public ID the client asked for when it knows it (a master's own
routing, or the name a master or lending relay sends with a forwarded request), and under the
local ID otherwise (a model load, a request sent to the node directly).  :class:`SiteNames` is the
site's view that turns the second kind into the first, makes a public image ID name its model's
public ID, and tells a node which of its local IDs a public ID covers, so a filter on the public ID
finds both kinds of rows.
"""

from __future__ import annotations

from collections.abc import Sequence

from routerd.wire.records import ModelRecord


class SiteNames:
    """The site's public IDs, read from its registry's records."""

    def __init__(self, records: Sequence[ModelRecord]) -> None:
        self._public = {(r.node_id, r.local_id): r.public_id for r in records}
        self._by_image = {r.public_image_id: r.public_id for r in records if r.public_image_id}
        self._known = {r.public_id for r in records}

    def canonical(self, name: str) -> str:
        """The public ID ``name`` stands for: a model's public image ID names its public ID."""
        if name in self._known:
            return name
        return self._by_image.get(name, name)

    def public(self, node_id: str, local_id: str) -> str:
        """The public ID of ``local_id`` on ``node_id`` (the local ID when the site has no record)."""
        return self._public.get((node_id, local_id), local_id)

    def locals_of(self, public: str | None, node_id: str) -> tuple[str, ...]:
        """``node_id``'s local IDs whose public ID is ``public`` under another name."""
        if public is None:
            return ()
        return tuple(sorted(local for (node, local), name in self._public.items()
                            if node == node_id and name == public and local != public))

    def of_row(self, node_id: str, model: str, local_id: str) -> str:
        """The public ID a row names: its ``model``, unless it was recorded under its local name."""
        if not local_id or model == local_id:
            return self.public(node_id, model)
        return model


__all__ = ["SiteNames"]
