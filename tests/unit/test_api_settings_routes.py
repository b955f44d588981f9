"""Site lending-settings API: listing, batch overrides, deletes, invalid overrides, apply and push."""

from __future__ import annotations

from typing import Any

import pytest

from routerd.config.lending import SETTINGS, LendingSettings
from tests.support import fired
from tests.unit.lending_api_support import Client, Parts

PATH = "/router/v1/site/offload/settings"


def overrides(node: Parts) -> dict[str, str]:
    assert node.store is not None
    return fired(node.store.setting_overrides())


def entry(body: dict[str, Any], key: str) -> dict[str, Any]:
    return next(e for e in body["entries"] if e["key"] == key)


def test_get_lists_every_setting_with_its_default_fingerprint_and_editable() -> None:
    node = Parts()
    code, body = Client(node).get(PATH)
    assert code == 200
    assert [e["key"] for e in body["entries"]] == [s.key for s in SETTINGS]
    assert all(e["source"] == "default" and e["effective"] == e["default"] for e in body["entries"])
    assert body["fingerprint"] == LendingSettings().fingerprint()
    assert body["editable"] is True
    assert node.lending.applied == [] and node.lending.refreshes == 0


def test_get_shows_the_config_layer() -> None:
    node = Parts()
    node.lending.config_settings = LendingSettings(scheduling_min_samples=50)
    _, body = Client(node).get(PATH)
    e = entry(body, "scheduling_min_samples")
    assert (e["config"], e["effective"], e["source"]) == ("50", "50", "config")
    assert body["fingerprint"] == LendingSettings(scheduling_min_samples=50).fingerprint()


def test_post_stores_normalised_overrides_applies_the_effective_settings_pushes_and_replans() -> None:
    node = Parts()
    node.lending.config_settings = LendingSettings(scheduling_min_samples=50)
    code, body = Client(node).post(PATH, {"values": {"offload_restore_delay": " 1500ms ",
                                                     "scheduling_backend_depth": 3,
                                                     "offload_hold_for_faster_helper": False}})
    assert code == 200, body
    assert overrides(node) == {"offload_restore_delay": "1.5s", "scheduling_backend_depth": "3",
                               "offload_hold_for_faster_helper": "false"}
    expected = LendingSettings(scheduling_min_samples=50, offload_restore_delay=1.5,
                               scheduling_backend_depth=3, offload_hold_for_faster_helper=False)
    assert node.lending.applied == [expected] and node.lending.refreshes == 1
    assert body["fingerprint"] == expected.fingerprint()
    depth = entry(body, "scheduling_backend_depth")
    assert (depth["override"], depth["effective"], depth["source"]) == ("3", "3", "db")


def test_a_batch_with_one_bad_value_changes_nothing_and_names_the_key() -> None:
    node = Parts()
    client = Client(node)
    client.post(PATH, {"values": {"scheduling_grant_ttl": "40s"}})
    node.lending.applied.clear()
    node.lending.refreshes = 0
    code, body = client.post(PATH, {"values": {"scheduling_grant_ttl": "50s",
                                               "scheduling_min_samples": 1}})
    assert code == 400
    assert body["error"]["type"] == "invalid_request_error"
    assert "scheduling_min_samples" in body["error"]["message"]
    assert overrides(node) == {"scheduling_grant_ttl": "40s"}
    assert node.lending.applied == [] and node.lending.refreshes == 0


@pytest.mark.parametrize("values,word", [
    ({"no_such_setting": "1"}, "unknown lending setting"),
    ({"offload_probe_idle": "5"}, "offload_probe_idle"),
    ({"offload_probe_idle": None}, "offload_probe_idle must be a string, number or boolean"),
    ({"offload_hold_for_faster_helper": "maybe"}, "offload_hold_for_faster_helper must be true or false"),
])
def test_invalid_values_are_refused(values: dict[str, Any], word: str) -> None:
    node = Parts()
    code, body = Client(node).post(PATH, {"values": values})
    assert code == 400 and word in body["error"]["message"]
    assert overrides(node) == {}


@pytest.mark.parametrize("body", [{}, {"values": ["a"]}, {"values": "x"}])
def test_post_without_a_values_object_is_a_bad_request(body: dict[str, Any]) -> None:
    code, answer = Client(Parts()).post(PATH, body)
    assert code == 400 and "values" in answer["error"]["message"]


def test_an_invalid_stored_override_is_shown_but_not_applied() -> None:
    node = Parts()
    node.lending.config_settings = LendingSettings(scheduling_backend_depth=4)
    assert node.store is not None
    fired(node.store.set_setting_overrides({"scheduling_backend_depth": "0"}))
    code, body = Client(node).post(PATH, {"values": {"scheduling_grant_ttl": "1m"}})
    assert code == 200
    depth = entry(body, "scheduling_backend_depth")
    assert depth["override"] == "0" and depth["effective"] == "4" and depth["source"] == "config"
    assert "override_error" in depth
    assert node.lending.applied[-1].scheduling_backend_depth == 4
    assert node.lending.applied[-1].scheduling_grant_ttl == 60.0


def test_delete_with_a_key_clears_one_override_and_without_clears_all() -> None:
    node = Parts()
    client = Client(node)
    client.post(PATH, {"values": {"scheduling_grant_ttl": "40s", "offload_probe_idle": "9s"}})
    code, body = client.delete(PATH, key="scheduling_grant_ttl")
    assert code == 200
    assert overrides(node) == {"offload_probe_idle": "9s"}
    assert node.lending.applied[-1] == LendingSettings(offload_probe_idle=9.0)
    assert entry(body, "scheduling_grant_ttl")["source"] == "default"
    code, body = client.delete(PATH)
    assert code == 200 and overrides(node) == {}
    assert node.lending.applied[-1] == LendingSettings()
    assert node.lending.refreshes == 3
    assert body["fingerprint"] == LendingSettings().fingerprint()


def test_delete_of_an_unknown_key_is_a_bad_request_unless_it_is_stored() -> None:
    node = Parts()
    code, _ = Client(node).delete(PATH, key="nope")
    assert code == 400 and node.lending.refreshes == 0
    assert node.store is not None
    fired(node.store.set_setting_overrides({"from_a_newer_build": "1"}))
    code, _ = Client(node).delete(PATH, key="from_a_newer_build")
    assert code == 200 and overrides(node) == {}


def test_without_a_store_settings_are_listed_read_only_and_changes_are_refused() -> None:
    node = Parts(store=None)
    client = Client(node)
    code, body = client.get(PATH)
    assert code == 200 and body["editable"] is False
    code, body = client.post(PATH, {"values": {"scheduling_grant_ttl": "40s"}})
    assert code == 409 and body["error"]["code"] == "read_only"
    assert node.lending.applied == []


@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
def test_the_settings_api_is_closed_on_a_slave(method: str) -> None:
    code, body = Client(Parts.slave()).call(method, PATH, {"values": {}})
    assert code == 404 and body["error"]["code"] == "not_found"
