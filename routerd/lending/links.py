"""The routing links of one lane (spec "Backlog lending", reference §2.1, §2.4).

A :class:`LinkSet` is immutable: validation and the site API's anchor edits return a new set.
Endpoints are trimmed; a link with a blank endpoint is skipped; duplicates (same four ids) collapse,
the last copy's flags winning; owner and helper must sit on different nodes.  Listing order is
owner node, owner model, helper node, helper model (as the store lists them).

Eligibility of text models (parallelism, context window, multimodal pairing) needs the registry and
is the site API's job; this module knows only ids and flags.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

import attrs

from routerd.wire.lending import Endpoint, Lane, Link

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


class LinkError(ValueError):
    """A link set that does not validate."""


class LinkRowLike(Protocol):
    """The shape of a stored link row (``routerd.store.links.LinkRow``)."""

    @property
    def owner_node_id(self) -> str: ...
    @property
    def owner_model_id(self) -> str: ...
    @property
    def helper_node_id(self) -> str: ...
    @property
    def helper_model_id(self) -> str: ...
    @property
    def load_if_unloaded(self) -> bool: ...
    @property
    def restore_after_borrow(self) -> bool: ...


@attrs.frozen
class Peer:
    """One entry of a site API ``lends_to``/``borrows_from`` list: the model on the other end."""

    node_id: str
    model_id: str
    load_if_unloaded: bool = True
    restore_after_borrow: bool = False


def _endpoint(node_id: str, model_id: str) -> Endpoint | None:
    node, model = node_id.strip(), model_id.strip()
    if not node or not model:
        return None
    return Endpoint(node, model)


def _sort_key(link: Link) -> tuple[str, str, str, str]:
    return (link.owner.node_id, link.owner.model_id, link.helper.node_id, link.helper.model_id)


def normalise(links: Iterable[Link]) -> tuple[Link, ...]:
    """Trim, skip blank endpoints, reject same-node links, collapse duplicates, sort."""
    kept: dict[tuple[str, str, str, str], Link] = {}
    # One Endpoint object per model: lookups keyed by endpoints then hit by identity.
    interned: dict[Endpoint, Endpoint] = {}
    for link in links:
        owner = _endpoint(link.owner.node_id, link.owner.model_id)
        helper = _endpoint(link.helper.node_id, link.helper.model_id)
        if owner is None or helper is None:
            continue
        owner = interned.setdefault(owner, owner)
        helper = interned.setdefault(helper, helper)
        if owner.node_id == helper.node_id:
            raise LinkError(f"model {owner.model_id} cannot lend work to a model on its own node")
        clean = Link(owner, helper, bool(link.load_if_unloaded), bool(link.restore_after_borrow))
        kept[_sort_key(clean)] = clean
    return tuple(kept[key] for key in sorted(kept))


def _touches(link: Link, anchor: Endpoint) -> bool:
    return link.owner == anchor or link.helper == anchor


@attrs.frozen(eq=False)
class PairIndex:
    """A link set laid out for the planner, which walks it as arrays once per plan (8,000 pairs a
    plan on a big site: nothing is built or hashed per pair).

    ``helpers`` holds every distinct helper once, sorted by (node id, model id); ``helper_keys[i]``
    is its ``(lane, node id, model id)`` and ``helper_node[i]`` the position of its node in
    ``nodes``.  ``owners`` holds every owner sorted by (node id, model id) with
    its key and its links in listing order; the pairs of owner ``o`` are ``owner_first[o]`` up to
    ``owner_first[o + 1]`` of ``links``, ``pair_helper`` (helper positions) and ``pair_load``
    (``load_if_unloaded``)."""

    helpers: tuple[Endpoint, ...]
    helper_keys: tuple[tuple[Lane, str, str], ...]
    helper_node: npt.NDArray[np.intp]
    nodes: tuple[str, ...]
    owners: tuple[tuple[Endpoint, tuple[Lane, str, str], tuple[Link, ...]], ...]
    owner_first: npt.NDArray[np.intp]
    links: tuple[Link, ...]
    pair_helper: npt.NDArray[np.intp]
    pair_load: npt.NDArray[np.bool_]


def _pair_index(lane: Lane, by_owner: dict[Endpoint, tuple[Link, ...]]) -> PairIndex:
    import numpy as np  # only once a master plans: not at a node's start (start time, idle memory)

    owners: list[tuple[Endpoint, tuple[Lane, str, str], tuple[Link, ...]]] = []
    links: list[Link] = []
    first = [0]
    for owner in sorted(by_owner, key=lambda e: (e.node_id, e.model_id)):
        owned = by_owner[owner]
        owners.append((owner, (lane, owner.node_id, owner.model_id), owned))
        links.extend(owned)
        first.append(len(links))
    helpers = tuple(sorted({link.helper for link in links}, key=lambda e: (e.node_id, e.model_id)))
    position = {helper: i for i, helper in enumerate(helpers)}
    nodes = tuple(dict.fromkeys(h.node_id for h in helpers))
    node_at = {node: i for i, node in enumerate(nodes)}
    return PairIndex(
        helpers=helpers,
        helper_keys=tuple((lane, h.node_id, h.model_id) for h in helpers),
        helper_node=np.array([node_at[h.node_id] for h in helpers], dtype=np.intp),
        nodes=nodes,
        owners=tuple(owners),
        owner_first=np.array(first, dtype=np.intp),
        links=tuple(links),
        pair_helper=np.array([position[link.helper] for link in links], dtype=np.intp),
        pair_load=np.array([link.load_if_unloaded for link in links], dtype=np.bool_),
    )


@attrs.frozen
class LinkSet:
    """Every link of one lane, validated, with the lookups lending needs."""

    lane: Lane
    links: tuple[Link, ...] = ()
    _by_owner: dict[Endpoint, tuple[Link, ...]] = attrs.field(init=False, eq=False, repr=False)
    _pair_index: PairIndex | None = attrs.field(init=False, default=None, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        by_owner: dict[Endpoint, list[Link]] = {}
        for link in self.links:
            by_owner.setdefault(link.owner, []).append(link)
        frozen = {k: tuple(v) for k, v in by_owner.items()}
        object.__setattr__(self, "_by_owner", frozen)

    @property
    def pair_index(self) -> PairIndex:
        """The planner's layout of the same links (built the first time a plan asks: a set is
        immutable)."""
        if self._pair_index is None:
            object.__setattr__(self, "_pair_index", _pair_index(self.lane, self._by_owner))
        assert self._pair_index is not None
        return self._pair_index

    @classmethod
    def build(cls, lane: Lane, links: Iterable[Link]) -> LinkSet:
        """A validated set (raises :class:`LinkError`)."""
        return cls(lane, normalise(links))

    @classmethod
    def from_rows(cls, lane: Lane, rows: Iterable[LinkRowLike]) -> LinkSet:
        return cls.build(
            lane,
            (
                Link(
                    Endpoint(r.owner_node_id, r.owner_model_id),
                    Endpoint(r.helper_node_id, r.helper_model_id),
                    r.load_if_unloaded,
                    r.restore_after_borrow,
                )
                for r in rows
            ),
        )

    def __iter__(self) -> Iterator[Link]:
        return iter(self.links)

    def __len__(self) -> int:
        return len(self.links)

    # -- lookups ------------------------------------------------------------------------------------

    def enrolled(self, node_id: str) -> set[str]:
        """Models of ``node_id`` that are an owner or a helper in any link (they queue)."""
        out: set[str] = set()
        for link in self.links:
            for end in (link.owner, link.helper):
                if end.node_id == node_id:
                    out.add(end.model_id)
        return out

    def owners(self, node_id: str | None = None) -> list[Endpoint]:
        """Distinct owners (optionally only those on ``node_id``), sorted."""
        found = [e for e in self._by_owner if node_id is None or e.node_id == node_id]
        return sorted(found, key=lambda e: (e.node_id, e.model_id))

    def owned_models(self, node_id: str) -> set[str]:
        """Models of ``node_id`` that lend (have at least one outgoing link)."""
        return {e.model_id for e in self.owners(node_id)}

    def is_owner(self, node_id: str, model_id: str) -> bool:
        return Endpoint(node_id, model_id) in self._by_owner

    def helpers_of(self, owner: Endpoint) -> tuple[Link, ...]:
        """The links along which ``owner`` may lend, in listing order."""
        return self._by_owner.get(owner, ())

    def link(self, owner: Endpoint, helper: Endpoint) -> Link | None:
        for link in self.links:
            if link.owner == owner and link.helper == helper:
                return link
        return None

    def touching(self, anchor: Endpoint) -> list[Link]:
        """Every link with ``anchor`` as owner or helper."""
        return [link for link in self.links if _touches(link, anchor)]

    # -- edits (site API) ---------------------------------------------------------------------------

    def replace_anchor(
        self, anchor: Endpoint, lends_to: Sequence[Peer], borrows_from: Sequence[Peer]
    ) -> LinkSet:
        """Replace every link touching ``anchor`` (both directions) with the given ones.

        ``lends_to`` peers become links anchor → peer; ``borrows_from`` peers become peer → anchor.
        Flags are the peer entry's own.  Raises :class:`LinkError` for a blank anchor or a peer on
        the anchor's node.
        """
        clean = _endpoint(anchor.node_id, anchor.model_id)
        if clean is None:
            raise LinkError("an anchor needs node_id and model_id")
        new: list[Link] = []
        for peer in lends_to:
            end = Endpoint(peer.node_id, peer.model_id)
            new.append(Link(clean, end, peer.load_if_unloaded, peer.restore_after_borrow))
        for peer in borrows_from:
            end = Endpoint(peer.node_id, peer.model_id)
            new.append(Link(end, clean, peer.load_if_unloaded, peer.restore_after_borrow))
        added = normalise(new)
        kept = [link for link in self.links if not _touches(link, clean)]
        return LinkSet.build(self.lane, [*kept, *added])

    def remove_anchor(self, anchor: Endpoint) -> LinkSet:
        """Drop every link touching ``anchor``."""
        clean = _endpoint(anchor.node_id, anchor.model_id) or anchor
        return LinkSet(self.lane, tuple(link for link in self.links if not _touches(link, clean)))

    def peers(self, anchor: Endpoint) -> tuple[list[Peer], list[Peer]]:
        """``(lends_to, borrows_from)`` of ``anchor`` as the site API shows them."""
        lends = [
            Peer(link.helper.node_id, link.helper.model_id, link.load_if_unloaded, link.restore_after_borrow)
            for link in self.links
            if link.owner == anchor
        ]
        borrows = [
            Peer(link.owner.node_id, link.owner.model_id, link.load_if_unloaded, link.restore_after_borrow)
            for link in self.links
            if link.helper == anchor
        ]
        return lends, borrows


__all__ = ["LinkError", "LinkRowLike", "LinkSet", "PairIndex", "Peer", "normalise"]
