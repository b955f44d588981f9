"""Link and lending-setting CRUD for the lending layer."""

from __future__ import annotations

from typing import TypeVar

import pytest
from twisted.internet.task import Clock

from routerd.store.links import LinkRow, SameNodeLinkError
from routerd.store.store import Store
from tests.support import fired

T = TypeVar("T")




def link(owner: str, helper: str, *, load: bool = True, restore: bool = False) -> LinkRow:
    on, om = owner.split("/")
    hn, hm = helper.split("/")
    return LinkRow(on, om, hn, hm, load, restore)


def test_links_are_kept_per_lane_and_listed_in_endpoint_order() -> None:
    store = Store.open_sync()
    fired(store.replace_links("text", [link("b/m", "a/m"), link("a/m", "b/m", restore=True)]))
    fired(store.replace_links("image", [link("a/sd", "c/sd", load=False)]))
    assert fired(store.links("text")) == [link("a/m", "b/m", restore=True), link("b/m", "a/m")]
    assert fired(store.links("image")) == [link("a/sd", "c/sd", load=False)]


def test_replace_links_replaces_the_whole_lane() -> None:
    store = Store.open_sync()
    fired(store.replace_links("image", [link("a/x", "b/x"), link("b/x", "a/x")]))
    fired(store.replace_links("image", [link("c/y", "d/y")]))
    assert fired(store.links("image")) == [link("c/y", "d/y")]


def test_replace_anchor_links_touches_only_links_of_the_anchor_in_both_directions() -> None:
    store = Store.open_sync()
    fired(
        store.replace_links(
            "text", [link("a/m", "b/m"), link("b/m", "a/m"), link("c/m", "b/m"), link("a/other", "b/m")]
        )
    )
    fired(store.replace_anchor_links("text", "a", "m", [link("a/m", "c/m", restore=True)]))
    assert fired(store.links("text")) == [
        link("a/m", "c/m", restore=True),
        link("a/other", "b/m"),
        link("c/m", "b/m"),
    ]


def test_delete_anchor_links_reports_how_many_went() -> None:
    store = Store.open_sync()
    fired(store.replace_links("image", [link("a/x", "b/x"), link("b/x", "a/x"), link("b/x", "c/x")]))
    assert fired(store.delete_anchor_links("image", "a", "x")) == 2
    assert fired(store.links("image")) == [link("b/x", "c/x")]


def test_a_same_node_link_is_refused_and_the_lane_is_left_unchanged() -> None:
    store = Store.open_sync()
    fired(store.replace_links("text", [link("a/m", "b/m")]))
    with pytest.raises(SameNodeLinkError, match="own node"):
        fired(store.replace_links("text", [link("c/m", "d/m"), link("a/m", "a/n")]))
    assert fired(store.links("text")) == [link("a/m", "b/m")]


def test_setting_overrides_set_as_a_batch_with_the_clock_time_and_delete() -> None:
    clock = Clock()
    clock.advance(12.5)
    store = Store.open_sync(clock=clock)
    fired(store.set_setting_overrides({"offload_probe_idle": "5s", "scheduling_min_samples": "30"}))
    clock.advance(1)
    fired(store.set_setting_overrides({"offload_probe_idle": "7s"}))
    assert fired(store.setting_overrides()) == {"offload_probe_idle": "7s", "scheduling_min_samples": "30"}
    times = fired(store.runner.run(lambda c: dict(c.execute("SELECT key, updated_at FROM offload_settings"))))
    assert times == {"offload_probe_idle": 13500, "scheduling_min_samples": 12500}
    assert fired(store.delete_setting_overrides("offload_probe_idle")) == 1
    assert fired(store.setting_overrides()) == {"scheduling_min_samples": "30"}
    assert fired(store.delete_setting_overrides()) == 1
    assert fired(store.setting_overrides()) == {}
