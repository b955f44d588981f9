"""A change of the site's links or lending settings re-plans at once (spec "Who decides": the master
plans on events and on the refresh tick; a saved link or setting is planned with now, not a refresh
interval later).

The master is the coordinator tests' fake (registry, runtime statuses, a recording client) with the
real lending service reaching the real coordinator in process, the real link and settings editors
and an in-memory store; the clock never moves, so nothing here is the tick's doing.
"""

from __future__ import annotations

from pathlib import Path

from twisted.internet.defer import Deferred

from routerd.config.lending import LendingSettings
from routerd.lending.links import Peer
from routerd.lending.transport import InProcess
from routerd.node import Node
from routerd.site.links import EditRequest, LaneModels, LinkEditor
from routerd.site.settings import SettingsEditor
from routerd.store.store import Store
from routerd.wire.lending import Endpoint, to_json
from tests.support import fired
from tests.unit.lending_api_support import FakeCatalog
from tests.unit.node_fixture import TEXT, World, master_cluster, slave_cluster
from tests.unit.test_lending_coordinator import (
    A_LEASE,
    B_TO_K,
    GRANT_PATH,
    MASTER,
    Cluster,
    helper_status,
    owner_status,
    record,
)

LINKS_PATH = "/router/v1/node/offload/links"


def master_with_a_waiting_owner() -> tuple[Cluster, Store]:
    """s1's model A holds 8 requests and links nowhere yet; s2's H is idle and faster.  The refresh
    tick is an hour away."""
    cluster = Cluster(links=(B_TO_K,), settings=LendingSettings(scheduling_refresh_interval=3600.0))
    cluster.service.transport = InProcess(MASTER, lambda: cluster.coordinator)
    for node_id, model_id in (("s1", "A"), ("s2", "H")):
        cluster.master.registry.add_node(node_id)
        cluster.master.registry.models.append(record(node_id, model_id))
    cluster.master.status = {"s1": owner_status("s1", "A"), "s2": helper_status("s2", "H"),
                             "s3": owner_status("s3", "B", pending=0), "s4": helper_status("s4", "K")}
    cluster.coordinator.start()
    return cluster, Store.open_sync(clock=cluster.clock)


def test_saving_a_link_plans_at_once_and_grants_the_new_owner_its_lease() -> None:
    cluster, store = master_with_a_waiting_owner()
    editor = LinkEditor("text", store, cluster.service,
                        LaneModels("text", cluster.master.registry.records(), MASTER, FakeCatalog()))
    edit = EditRequest(Endpoint("s1", "A"), (Peer("s2", "H"),), (), acknowledge_different_weights=True)
    fired(Deferred.fromCoroutine(editor.replace(edit)))
    assert cluster.master.polls == 1
    assert cluster.master.client.to(GRANT_PATH)[-1] == ("http://s1:1", to_json(A_LEASE))
    assert [(r["owner_model_id"], r["outcome"], r["trigger"]) for r in cluster.rows(kind="plan")] == [
        ("A", "granted", "tick")]
    # pushed before the plan: the owner knows the link its lease names
    paths = [path for _url, path, _body in cluster.master.client.posts]
    assert paths.index(LINKS_PATH) < paths.index(GRANT_PATH)
    cluster.coordinator.stop()


def test_removing_a_link_plans_at_once_and_the_old_lease_leaves_the_book() -> None:
    cluster, store = master_with_a_waiting_owner()
    models = LaneModels("text", cluster.master.registry.records(), MASTER, FakeCatalog())
    editor = LinkEditor("text", store, cluster.service, models)
    edit = EditRequest(Endpoint("s1", "A"), (Peer("s2", "H"),), (), acknowledge_different_weights=True)
    fired(Deferred.fromCoroutine(editor.replace(edit)))
    assert cluster.coordinator.live_lease(A_LEASE.key()) is not None
    fired(Deferred.fromCoroutine(editor.delete(Endpoint("s1", "A"))))
    assert cluster.master.polls == 2
    assert cluster.coordinator.live_lease(A_LEASE.key()) is None
    cluster.coordinator.stop()


def test_a_settings_change_plans_at_once_with_the_new_settings() -> None:
    cluster, store = master_with_a_waiting_owner()
    editor = LinkEditor("text", store, cluster.service,
                        LaneModels("text", cluster.master.registry.records(), MASTER, FakeCatalog()))
    fired(Deferred.fromCoroutine(editor.replace(
        EditRequest(Endpoint("s1", "A"), (Peer("s2", "H"),), (), acknowledge_different_weights=True))))
    settings = SettingsEditor(store, cluster.service)
    fired(Deferred.fromCoroutine(settings.set({"offload_faster_helper_slots": 3})))
    assert cluster.master.polls == 2
    lease = cluster.coordinator.live_lease(A_LEASE.key())
    assert lease is not None and lease.helper_slots == 3
    cluster.coordinator.stop()



# -- on real nodes in memory ------------------------------------------------------------------------

LINKABLE = {**TEXT, "kcpps": {"contextsize": 4096}}


def plans(node: Node) -> float:
    return node.metrics.registry.get_sample_value("routerd_lending_plan_duration_seconds_count") or 0.0


def test_a_link_saved_on_a_master_node_is_planned_with_before_the_answer(tmp_path: Path) -> None:
    """A master and its slave in memory, the refresh tick an hour away: saving a link through the
    site API plans once before it answers, and removing it plans again."""
    world = World(tmp_path)
    slave = world.node("slave", {"chat": LINKABLE}, cluster=slave_cluster())
    master = world.node("master", {"chat": LINKABLE},
                        cluster=master_cluster(scheduling_refresh_interval="1h"))
    world.start(slave, master)
    before, started = plans(master), world.clock.seconds()
    edit = {"anchor": {"node_id": "master", "model_id": "chat"},
            "lends_to": [{"node_id": "slave", "model_id": "chat"}], "acknowledge_different_weights": True}
    response, body = world.call("POST", master, "/router/v1/site/text-routing-groups", json=edit)
    assert response.code == 200, body
    assert plans(master) == before + 1
    response, body = world.call("DELETE", master,
                                "/router/v1/site/text-routing-groups?node_id=master&model_id=chat")
    assert response.code == 200, body
    assert plans(master) == before + 2
    assert world.clock.seconds() - started < 60.0  # no tick had come
