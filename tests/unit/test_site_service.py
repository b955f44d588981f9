"""The site service (routerd.site.service): the master-only check, the here-or-there rule with its
remote-error mapping, and the fan-out's node selection, over the shipped fakes (routerd.site.testing)."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.defer import Deferred, fail, succeed

from routerd.clients.node_client import ClusterTimeout, RemoteError
from routerd.errors import HTTPError
from routerd.registry.records import NodeInfo
from routerd.site.service import SiteService
from routerd.site.testing import FakeAgent, agent_of, fake_site


def run(coroutine: Any) -> Any:
    out: list[Any] = []
    Deferred.fromCoroutine(coroutine).addBoth(out.append)
    [result] = out
    return result


def with_nodes(*names: str, unhealthy: tuple[str, ...] = ()) -> SiteService:
    site = fake_site()
    for name in names:
        agent_of(site).registry.add_node(name, healthy=name not in unhealthy)
    return site


def test_a_slave_has_no_site_and_answers_404_while_a_standalone_node_is_not_the_master() -> None:
    slave = fake_site("slave-a", role="slave")
    with pytest.raises(HTTPError) as caught:
        slave.require()
    assert (caught.value.status, caught.value.message) == (404, "site routes are served by the master only")
    assert not slave.serves
    standalone = fake_site("solo", role="standalone")
    assert standalone.require() is standalone.agent and standalone.master is None
    with pytest.raises(HTTPError) as refused:
        standalone.require_master()
    assert (refused.value.status, refused.value.code) == (409, "not_master")


@pytest.mark.parametrize("node_id", [None, "", "master"])
def test_an_operation_for_this_node_runs_here(node_id: str | None) -> None:
    site = with_nodes("slave-a")
    answer = run(site.on_node(node_id, lambda: succeed("here"), lambda info: succeed(info.node_id)))
    assert answer == "here"


def test_an_operation_for_another_node_runs_there_with_its_registered_url() -> None:
    site = with_nodes("slave-a")
    seen: list[NodeInfo] = []

    def there(info: NodeInfo) -> Deferred[Any]:
        seen.append(info)
        return succeed({"ok": True})

    assert run(site.on_node("slave-a", lambda: succeed("here"), there)) == {"ok": True}
    assert [info.node_url for info in seen] == ["http://slave-a:1"]


def test_an_unknown_or_malformed_node_is_refused_before_anything_runs() -> None:
    site = with_nodes("slave-a")
    unknown = run(site.on_node("ghost", lambda: succeed("here"), lambda info: succeed("there")))
    assert isinstance(unknown.value, HTTPError)
    assert (unknown.value.status, unknown.value.code) == (404, "node_not_found")
    malformed = run(site.on_node(7, lambda: succeed("here"), lambda info: succeed("there")))
    assert malformed.value.status == 400


def test_a_remote_nodes_error_is_answered_as_given_and_silence_as_502() -> None:
    site = with_nodes("slave-a")
    given = RemoteError(409, "invalid_request_error", "exists", "exists")
    answered = run(site.on_node("slave-a", lambda: succeed("here"), lambda info: fail(given)))
    assert (answered.value.status, answered.value.code) == (409, "exists")
    silent = run(site.on_node("slave-a", lambda: succeed("here"),
                              lambda info: fail(ClusterTimeout("no answer in 5s"))))
    assert (silent.value.status, silent.value.code) == (502, "node_unreachable")
    assert silent.value.message == "node 'slave-a' did not answer: no answer in 5s"


def test_the_fan_out_asks_healthy_known_nodes_and_names_the_others() -> None:
    site = with_nodes("slave-a", "slave-b", unhealthy=("slave-b",))
    agent: FakeAgent = agent_of(site)
    agent.client.answers["http://slave-a:1"] = {"ok": 1}
    gathered = run(site.get_all(["master", "slave-a", "slave-b", "ghost"], "/router/v1/node/state"))
    assert gathered.include_self
    assert [(info.node_id, answer) for info, answer in gathered.answers] == [("slave-a", {"ok": 1})]
    assert gathered.node_errors() == [{"node_id": "ghost", "error": "node is not known"},
                                      {"node_id": "slave-b", "error": "node is unhealthy"}]
    assert [base for base, _path, _timeout in agent.client.calls] == ["http://slave-a:1"]


def test_a_slaves_404_names_its_master_so_its_webui_can_link_there() -> None:
    """The slave's ``/ui/`` said "open the master" without saying where: the 404 names ``master_url``."""
    slave = SiteService("slave-a", None, "slave", master_url="http://10.0.0.1:8080")
    with pytest.raises(HTTPError) as caught:
        slave.require()
    assert caught.value.status == 404
    assert caught.value.message == ("site routes are served by the master only; "
                                    "this node's master is http://10.0.0.1:8080")
