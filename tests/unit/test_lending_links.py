"""Link sets: validation, enrolment, owners and helpers, anchor edits (reference §2)."""

from __future__ import annotations

import pytest

from routerd.lending.links import LinkError, LinkSet, Peer
from routerd.store.links import LinkRow
from routerd.wire.lending import Endpoint, Link


def link(owner: str, helper: str, load: bool = True, restore: bool = False) -> Link:
    on, om = owner.split("/")
    hn, hm = helper.split("/")
    return Link(Endpoint(on, om), Endpoint(hn, hm), load, restore)


def test_a_link_to_a_model_on_the_same_node_is_refused() -> None:
    with pytest.raises(LinkError, match="model cc cannot lend work to a model on its own node"):
        LinkSet.build("image", [link("master/cc", "master/dd")])


def test_endpoints_are_trimmed_blank_ones_skipped_and_duplicates_collapse() -> None:
    links = [
        Link(Endpoint(" master ", "cc "), Endpoint("slave", " ff"), True, False),
        link("master/cc", "slave/ff", load=False, restore=True),
        Link(Endpoint("master", " "), Endpoint("slave", "ff")),
    ]
    assert LinkSet.build("image", links).links == (link("master/cc", "slave/ff", load=False, restore=True),)


def test_links_are_listed_by_owner_then_helper() -> None:
    s = LinkSet.build("text", [link("b/x", "a/y"), link("a/y", "b/x"), link("a/a", "c/z")])
    assert [(lk.owner.node_id, lk.owner.model_id) for lk in s.links] == [("a", "a"), ("a", "y"), ("b", "x")]


def test_links_are_one_way_and_owners_and_helpers_are_both_enrolled() -> None:
    s = LinkSet.build("image", [link("master/cc", "slave/ff")])
    assert s.enrolled("master") == {"cc"}
    assert s.enrolled("slave") == {"ff"}
    assert s.is_owner("master", "cc")
    assert not s.is_owner("slave", "ff")  # a helper-only model never lends
    assert s.owned_models("slave") == set()
    assert s.owners() == [Endpoint("master", "cc")]
    assert s.helpers_of(Endpoint("slave", "ff")) == ()


def test_helpers_of_an_owner_are_its_outgoing_links() -> None:
    s = LinkSet.build("image", [link("m/a", "s1/b"), link("m/a", "s2/c"), link("s1/b", "m/a")])
    assert [lk.helper for lk in s.helpers_of(Endpoint("m", "a"))] == [
        Endpoint("s1", "b"),
        Endpoint("s2", "c"),
    ]
    assert s.link(Endpoint("m", "a"), Endpoint("s2", "c")) == link("m/a", "s2/c")
    assert s.link(Endpoint("s2", "c"), Endpoint("m", "a")) is None


def test_replace_anchor_replaces_every_link_touching_the_anchor_in_both_directions() -> None:
    s = LinkSet.build(
        "image", [link("m/a", "s/b"), link("s/b", "m/a"), link("s/c", "m/a"), link("x/y", "s/b")]
    )
    anchor = Endpoint("m", "a")
    new = s.replace_anchor(anchor, lends_to=[Peer("t", "d", False, True)], borrows_from=[Peer("s", "b")])
    assert set(new.links) == {
        link("m/a", "t/d", load=False, restore=True),
        link("s/b", "m/a"),
        link("x/y", "s/b"),
    }
    assert s.touching(anchor) != new.touching(anchor)
    assert new.peers(anchor) == ([Peer("t", "d", False, True)], [Peer("s", "b", True, False)])


def test_replace_anchor_refuses_a_peer_on_the_anchor_node_and_a_blank_anchor() -> None:
    s = LinkSet("image")
    with pytest.raises(LinkError, match="own node"):
        s.replace_anchor(Endpoint("m", "a"), [Peer("m", "b")], [])
    with pytest.raises(LinkError):
        s.replace_anchor(Endpoint(" ", "a"), [Peer("s", "b")], [])


def test_remove_anchor_drops_both_directions() -> None:
    s = LinkSet.build("text", [link("m/a", "s/b"), link("s/b", "m/a"), link("s/c", "t/d")])
    assert s.remove_anchor(Endpoint("s", "b")).links == (link("s/c", "t/d"),)


def test_store_rows_convert_into_a_link_set() -> None:
    rows = [LinkRow("master", "cc", "slave", "ff", True, True)]
    assert LinkSet.from_rows("image", rows).links == (link("master/cc", "slave/ff", restore=True),)


def test_the_planners_layout_numbers_helpers_in_order_and_lists_each_owners_pairs() -> None:
    """PairIndex (issue 24 item 3): helpers sorted by node and model with their nodes numbered,
    owners sorted with their fact keys, and each owner's pairs as one run of the pair arrays."""
    index = LinkSet.build("text", [
        link("b/x", "c/z"), link("a/y", "c/z", load=False), link("a/y", "b/x"), link("b/x", "a/y"),
    ]).pair_index
    assert index.helpers == (Endpoint("a", "y"), Endpoint("b", "x"), Endpoint("c", "z"))
    assert index.helper_keys == (("text", "a", "y"), ("text", "b", "x"), ("text", "c", "z"))
    assert index.nodes == ("a", "b", "c") and index.helper_node.tolist() == [0, 1, 2]
    assert [(owner, key) for owner, key, _links in index.owners] == [
        (Endpoint("a", "y"), ("text", "a", "y")), (Endpoint("b", "x"), ("text", "b", "x"))]
    assert index.owner_first.tolist() == [0, 2, 4]
    assert [str(x.helper.node_id) for x in index.links] == ["b", "c", "a", "c"]
    assert index.pair_helper.tolist() == [1, 2, 0, 2]
    assert index.pair_load.tolist() == [True, False, True, True]
