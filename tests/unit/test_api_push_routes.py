"""Push receipt on a node: links and lending settings from the master, kept in the slave's router database
so a restart while the master is down serves with them."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.defer import Deferred

from routerd.config.lending import LendingSettings
from routerd.lending.bootstrap import install_lending_state
from routerd.routing.guardians import GuardianSet
from routerd.wire.lending import Endpoint, Link
from tests.support import fired
from tests.unit.lending_api_support import Client, FakeLending, Parts

LINKS = "/router/v1/node/offload/links"
SETTINGS = "/router/v1/node/offload/settings"


def link_json(owner: str, helper: str, **flags: bool) -> dict[str, Any]:
    on, om = owner.split("/")
    hn, hm = helper.split("/")
    return {"owner": {"node_id": on, "model_id": om}, "helper": {"node_id": hn, "model_id": hm}, **flags}


def test_pushed_links_are_installed_for_both_lanes_and_counted() -> None:
    node = Parts.slave()
    code, body = Client(node).post(LINKS, {
        "image": [link_json("master/sd-x", "slave-a/sd-x", load_if_unloaded=False)],
        "text": [link_json("slave-a/llm", "master/llm", restore_after_borrow=True),
                 link_json("master/llm", "slave-a/llm")]})
    assert code == 200
    assert body == {"ok": True, "image": 1, "text": 2, "guardians": 0}
    [(image, text)] = node.lending.installed
    assert image.lane == "image" and text.lane == "text"
    assert list(image) == [Link(Endpoint("master", "sd-x"), Endpoint("slave-a", "sd-x"), False, False)]
    assert list(text) == [Link(Endpoint("master", "llm"), Endpoint("slave-a", "llm"), True, False),
                          Link(Endpoint("slave-a", "llm"), Endpoint("master", "llm"), True, True)]


def test_empty_lists_clear_the_links() -> None:
    node = Parts.slave()
    code, body = Client(node).post(LINKS, {"image": [], "text": []})
    assert code == 200 and body == {"ok": True, "image": 0, "text": 0, "guardians": 0}
    assert [len(s) for s in node.lending.installed[0]] == [0, 0]


@pytest.mark.parametrize("body,word", [
    ({"image": []}, "text is required"),
    ({"image": {}, "text": []}, "image is required and must be a list"),
    ({"image": [], "text": [{"owner": {"node_id": "a", "model_id": "m"}}]}, "text[0].helper"),
    ({"image": [], "text": [link_json("a/m", "b/m") | {"load_if_unloaded": "1"}]},
     "expected bool @ text[0].load_if_unloaded"),
    ({"image": [], "text": [{"owner": {"node_id": "a", "model_id": 3}, "helper": {}}]},
     "text[0].owner.model_id"),
    ({"image": [link_json("a/m", "a/n")], "text": []}, "cannot lend work to a model on its own node"),
])
def test_malformed_link_pushes_are_refused_and_install_nothing(body: dict[str, Any], word: str) -> None:
    node = Parts.slave()
    code, answer = Client(node).post(LINKS, body)
    assert code == 400 and word in answer["error"]["message"]
    assert node.lending.installed == []


def test_pushed_settings_drop_unknown_keys_and_apply_the_rest() -> None:
    node = Parts.slave()
    master = LendingSettings(scheduling_grant_ttl=45.0, offload_probe_helper_slots=3)
    values: dict[str, Any] = {**master.texts(), "setting_from_the_future": "7"}
    code, body = Client(node).post(SETTINGS, {"values": values, "fingerprint": "0123456789ab"})
    assert code == 200
    assert node.lending.applied == [master]
    assert body == {"ok": True, "fingerprint": master.fingerprint(), "dropped": ["setting_from_the_future"]}


def test_keys_missing_from_a_settings_push_take_their_defaults() -> None:
    node = Parts.slave()
    node.lending.settings = LendingSettings(scheduling_backend_depth=9)
    code, body = Client(node).post(SETTINGS, {"values": {"offload_probe_idle": "2s"}})
    assert code == 200
    assert node.lending.applied == [LendingSettings(offload_probe_idle=2.0)]
    assert body["fingerprint"] == LendingSettings(offload_probe_idle=2.0).fingerprint()


@pytest.mark.parametrize("body,word", [
    ({"values": {"offload_probe_idle": "2s", "scheduling_backend_depth": "0"}}, "scheduling_backend_depth"),
    ({"fingerprint": "abc"}, "values is required"),
    ({"values": {}, "fingerprint": 5}, "fingerprint must be a string"),
])
def test_invalid_settings_pushes_apply_nothing(body: dict[str, Any], word: str) -> None:
    node = Parts.slave()
    code, answer = Client(node).post(SETTINGS, body)
    assert code == 400 and word in answer["error"]["message"]
    assert node.lending.applied == []


@pytest.mark.parametrize("path,body", [(LINKS, {"image": [], "text": []}), (SETTINGS, {"values": {}})])
def test_a_master_refuses_pushes_because_its_own_database_is_authoritative(path: str,
                                                                          body: dict[str, Any]) -> None:
    node = Parts()
    code, answer = Client(node).post(path, body)
    assert code == 409 and answer["error"]["code"] == "is_master"
    assert node.lending.installed == [] and node.lending.applied == []


# -- a slave keeps what its master pushed (restart while the master is down) ----------------------------

GUARDIAN = {"scope": "node", "node_id": "slave-a", "guardian": {"node_id": "slave-a", "model_id": "vision"}}


def restarted(node: Parts, config: LendingSettings | None = None) -> FakeLending:
    """What the slave's lending starts with after a restart: its router database read back."""
    assert node.store is not None
    lending = FakeLending()
    fired(Deferred.fromCoroutine(install_lending_state(node.store, lending, config or LendingSettings())))
    return lending


def test_pushed_links_and_guardians_are_kept_and_served_with_after_a_restart() -> None:
    node = Parts.slave()
    code, _ = Client(node).post(LINKS, {
        "image": [link_json("master/sd-x", "slave-a/sd-x", load_if_unloaded=False)],
        "text": [link_json("master/llm", "slave-a/llm", restore_after_borrow=True)],
        "guardians": [GUARDIAN]})
    assert code == 200
    lending = restarted(node)
    [(image, text)] = lending.installed
    assert list(image) == [Link(Endpoint("master", "sd-x"), Endpoint("slave-a", "sd-x"), False, False)]
    assert list(text) == [Link(Endpoint("master", "llm"), Endpoint("slave-a", "llm"), True, True)]
    assert lending.guardians == GuardianSet.parse([GUARDIAN])


def test_pushed_settings_are_kept_exactly_over_the_slaves_own_config() -> None:
    """The slave runs the master's resolved values, so after a restart too: its config file's value
    (here a depth of 5) does not come back, and a key the push left out is its default again."""
    node = Parts.slave()
    pushed = LendingSettings(scheduling_backend_depth=3, offload_restore_delay=4.0)
    values = {k: v for k, v in pushed.texts().items() if k != "offload_probe_idle"}
    code, _ = Client(node).post(SETTINGS, {"values": values})
    assert code == 200
    lending = restarted(node, LendingSettings(scheduling_backend_depth=5, offload_probe_idle=9.0))
    assert lending.applied == [pushed]


def test_the_masters_next_push_replaces_what_the_slave_kept() -> None:
    node = Parts.slave()
    client = Client(node)
    client.post(LINKS, {"image": [], "text": [link_json("master/llm", "slave-a/llm")],
                        "guardians": [GUARDIAN]})
    client.post(SETTINGS, {"values": {"scheduling_backend_depth": "3"}})
    client.post(LINKS, {"image": [], "text": []})
    client.post(SETTINGS, {"values": {"offload_probe_idle": "7s"}})
    lending = restarted(node)
    assert [len(s) for s in lending.installed[0]] == [0, 0] and len(lending.guardians) == 0
    assert lending.applied == [LendingSettings(offload_probe_idle=7.0)]


def test_a_refused_push_keeps_nothing() -> None:
    node = Parts.slave()
    client = Client(node)
    client.post(LINKS, {"image": [], "text": [link_json("master/llm", "slave-a/llm")]})
    code, _ = client.post(LINKS, {"image": [link_json("a/m", "a/n")], "text": []})
    assert code == 400
    [(_image, text)] = restarted(node).installed
    assert len(text) == 1
