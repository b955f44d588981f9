"""Decision-log and summary routes (node and site API) against a fake node through StubTreq."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import attrs
import pytest
from treq.testing import StubTreq
from twisted.internet import task
from twisted.internet.defer import Deferred

from routerd import __version__
from routerd.api.decisions_routes import DecisionsAPI
from routerd.api.dispatch import Dispatch
from routerd.clients.node_client import ClusterTimeout
from routerd.config.lending import LendingSettings
from routerd.lending.decisions import DecisionLog
from routerd.lending.follow import Cursor
from routerd.lending.reports import LendingReports
from routerd.registry.records import NodeInfo
from routerd.site.service import FANOUT, NODE_TIMEOUT_S, SiteService
from routerd.site.testing import FakeAgent, FakeRegistry
from routerd.store.store import Store

SETTINGS = LendingSettings()
#: The cursor of an answer without rows: follow from the start.
NO_CURSOR = Cursor().encode()
OTHER_SETTINGS = LendingSettings(offload_probe_idle=9.0)


# -- fakes ------------------------------------------------------------------------------------------


@attrs.define
class FakeLending:
    settings: LendingSettings = SETTINGS
    decisions: Any = None
    held: list[dict[str, Any]] = attrs.Factory(list)

    def held_requests(self) -> list[dict[str, Any]]:
        return self.held


@attrs.define
class FakeCoordinator:
    """The master's lease book: the only place live leases are known."""

    leases: list[dict[str, Any]] = attrs.Factory(list)

    def live_leases(self) -> list[dict[str, Any]]:
        return self.leases


@attrs.define
class BareLending:
    """A LendingService from before ``held_requests`` existed."""

    settings: LendingSettings = SETTINGS
    decisions: Any = None


@attrs.define
class Parts:
    """What the decision routes are built from on node ``node_id``: its site's agent (None on a
    slave), store, lending and coordinator (a master's)."""

    node_id: str = "master"
    store: Any = None
    site: FakeAgent | None = None
    lending: Any = attrs.Factory(FakeLending)
    coordinator: FakeCoordinator | None = None


def info(node_id: str, healthy: bool = True) -> NodeInfo:
    return NodeInfo(node_id=node_id, node_url=f"http://{node_id}:8080", healthy=healthy,
                    build_version="9.9.9", protocol_version=1)


def with_log(node: Parts, clock: task.Clock) -> DecisionLog:
    store = Store.open_sync(clock=clock)
    node.store = store
    node.lending.decisions = DecisionLog(store, clock, node.node_id, __version__, 3600.0)
    return node.lending.decisions  # type: ignore[no-any-return]


def routes(node: Parts) -> DecisionsAPI:
    site = SiteService(node.node_id, node.site)
    reports = LendingReports(node.node_id, node.lending, lambda: node.store, node.coordinator)
    return DecisionsAPI(site=site, reports=reports)


def get(node: Parts, path: str) -> tuple[int, Any]:
    client = StubTreq(Dispatch([routes(node)]))
    out: list[Any] = []
    client.get("http://node" + path).addCallback(
        lambda r: out.append(r.code) or r.content()).addCallback(out.append)
    client.flush()
    assert len(out) == 2, out
    return int(out[0]), json.loads(out[1])


# -- node API --------------------------------------------------------------------------------------


@pytest.mark.parametrize("query", [
    "limit=0", "limit=-1", "limit=5001", "limit=abc", "limit=1.5", "limit=%C2%B2",
    "since_ms=-5", "since_ms=soon", "lane=audio", "kind=audit", "outcome=maybe",
    "after=nope", "after=WzEsMl0", "after=WzAsW11d&since_ms=5",
])
@pytest.mark.parametrize("path", ["/router/v1/node/offload/decisions", "/router/v1/site/offload/decisions"])
def test_bad_parameters_answer_400_with_a_reason(path: str, query: str) -> None:
    node = Parts(site=FakeAgent())
    code, body = get(node, f"{path}?{query}")
    assert code == 400
    assert body["error"]["type"] == "invalid_request_error"
    assert query.split("=")[0] in body["error"]["message"]


@pytest.mark.parametrize("path", ["/router/v1/node/offload/decisions", "/router/v1/site/offload/decisions",
                                  "/router/v1/site/offload/decisions/folded"])
def test_since_ms_past_sqlites_integer_range_is_a_400_not_a_500(path: str) -> None:
    """Found by the schemathesis run: the store raised OverflowError binding it (a 500)."""
    node = Parts(site=FakeAgent())
    code, body = get(node, f"{path}?since_ms=9223372036854775808")
    assert code == 400
    assert "since_ms" in body["error"]["message"]


def test_node_decisions_flush_the_buffer_and_apply_the_filters() -> None:
    clock = task.Clock()
    node = Parts()
    log = with_log(node, clock)
    for i in range(3):
        clock.advance(1)
        log.record("dispatch", "lent", lane="image", request_id=f"i{i}", slots=1)
    log.record("helper", "borrowed_returned", lane="text", reason="own_work_arrived")
    assert log.pending == 4  # nothing written yet: the route flushes
    code, body = get(node, "/router/v1/node/offload/decisions")
    assert code == 200
    assert [r["outcome"] for r in body["records"]] == ["borrowed_returned", "lent", "lent", "lent"]
    assert body["records"][1] == {"id": 3, "recorded_at": 3000, "node_id": "master", "kind": "dispatch",
                                  "outcome": "lent", "lane": "image", "request_id": "i2", "slots": 1,
                                  "router_version": __version__}
    _, body = get(node, "/router/v1/node/offload/decisions?lane=image&kind=dispatch&outcome=lent"
                        "&limit=2&since_ms=2000&lane=text")
    assert [r["request_id"] for r in body["records"]] == ["i2", "i1"]
    _, body = get(node, "/router/v1/node/offload/decisions?since_ms=2500&lane=")
    assert len(body["records"]) == 2


def test_node_decisions_read_the_store_without_a_log_and_nothing_before_it_opens() -> None:
    node = Parts()
    assert get(node, "/router/v1/node/offload/decisions") == (200, {"records": [], "cursor": NO_CURSOR})
    store = Store.open_sync()
    store.insert_decisions([{"recorded_at": 5, "node_id": "master", "kind": "plan",
                             "outcome": "probe", "lane": "text", "trigger": "tick"}])
    node.store = store
    _, body = get(node, "/router/v1/node/offload/decisions")
    assert [r["trigger"] for r in body["records"]] == ["tick"]


@pytest.mark.parametrize("path", ["/router/v1/node/offload/decisions", "/router/v1/site/offload/decisions"])
def test_a_follower_gets_each_new_row_once_with_the_answers_cursor(path: str) -> None:
    """What ``routerd decisions --follow`` and the WebUI's live tail poll with: rows recorded in the
    same millisecond as the last one seen still come, once; nothing comes twice."""
    clock = task.Clock()
    node = Parts(site=FakeAgent())
    log = with_log(node, clock)
    clock.advance(1)
    log.record("dispatch", "lent", lane="text", request_id="r1")
    code, first = get(node, path + "?limit=5")
    assert code == 200 and [r["request_id"] for r in first["records"]] == ["r1"]
    log.record("dispatch", "lent", lane="text", request_id="r2")  # the same millisecond
    clock.advance(1)
    log.record("dispatch", "returned", lane="text", request_id="r3")
    _, second = get(node, f"{path}?limit=5&after={first['cursor']}")
    assert [r["request_id"] for r in second["records"]] == ["r3", "r2"]
    _, third = get(node, f"{path}?limit=5&after={second['cursor']}")
    assert third["records"] == [] and third["cursor"] == second["cursor"]


def test_node_summary_reports_build_fingerprint_and_held_requests() -> None:
    held = [{"request_id": "r1", "lane": "image", "model_id": "sd", "state": "queued", "waiting_ms": 10}]
    node = Parts(node_id="slave-a", lending=FakeLending(held=held))
    assert get(node, "/router/v1/node/offload/summary") == (200, {
        "node_id": "slave-a", "build_version": __version__,
        "settings_fingerprint": SETTINGS.fingerprint(), "held_requests": held})
    node.lending = BareLending()
    _, body = get(node, "/router/v1/node/offload/summary")
    assert body["held_requests"] == []


# -- site API --------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/router/v1/site/offload/decisions", "/router/v1/site/offload/summary",
                                  "/router/v1/site/offload/decisions?limit=0"])
def test_site_routes_answer_404_on_a_node_that_is_not_the_master(path: str) -> None:
    code, body = get(Parts(site=None), path)
    assert code == 404
    assert body["error"]["code"] == "not_found"


def _remote_rows(node_id: str, times: list[int]) -> Callable[[str], dict[str, Any]]:
    def answer(path: str) -> dict[str, Any]:
        limit = int(parse_qs(urlsplit(path).query)["limit"][0])
        rows = [{"id": i + 1, "recorded_at": t, "node_id": node_id, "kind": "dispatch", "outcome": "lent",
                 "lane": "image", "router_version": "0.0.9"} for i, t in enumerate(times)]
        return {"records": sorted(rows, key=lambda r: -r["recorded_at"])[:limit]}

    return answer


def _site(clock: task.Clock) -> Parts:
    master = FakeAgent(FakeRegistry(infos=[info("slave-a"), info("slave-b"), info("slave-c"),
                                      info("slave-d", healthy=False)]))
    node = Parts(site=master)
    log = with_log(node, clock)
    for at in (1.5, 4.5):
        clock.advance(at - clock.seconds())
        log.record("plan", "granted", lane="image", trigger="enqueued", slots=2)
    master.client.answers = {
        "http://slave-a:8080": _remote_rows("slave-a", [1000, 3000, 5000]),
        "http://slave-b:8080": _remote_rows("", [2000, 4500]),  # rows without a node id get one
        "http://slave-c:8080": ClusterTimeout("GET http://slave-c:8080/... timed out after 5s"),
    }
    return node


def test_site_decisions_merge_every_node_newest_first_and_report_node_errors() -> None:
    clock = task.Clock()
    node = _site(clock)
    code, body = get(node, "/router/v1/site/offload/decisions")
    assert code == 200
    merged = [(r["recorded_at"], r["node_id"]) for r in body["records"]]
    assert merged == [(5000, "slave-a"), (4500, "master"), (4500, "slave-b"), (3000, "slave-a"),
                      (2000, "slave-b"), (1500, "master"), (1000, "slave-a")]
    assert body["node_errors"] == [
        {"node_id": "slave-c", "error": "GET http://slave-c:8080/... timed out after 5s"},
        {"node_id": "slave-d", "error": "node is unhealthy"},
    ]
    assert node.site is not None
    calls = node.site.client.calls
    assert sorted(base for base, _path, _t in calls) == [
        "http://slave-a:8080", "http://slave-b:8080", "http://slave-c:8080"]
    assert all(t == NODE_TIMEOUT_S for _b, _p, t in calls)
    assert all(p == "/router/v1/node/offload/decisions?limit=500" for _b, p, _t in calls)


def test_site_decisions_forward_the_filters_truncate_and_select_nodes() -> None:
    clock = task.Clock()
    node = _site(clock)
    assert node.site is not None
    _, body = get(node, "/router/v1/site/offload/decisions?limit=3&lane=image&outcome=lent&kind=dispatch"
                        "&since_ms=10&node_id=slave-a&node_id=slave-b&node_id=ghost")
    assert [(r["recorded_at"], r["node_id"]) for r in body["records"]] == [
        (5000, "slave-a"), (4500, "slave-b"), (3000, "slave-a")]
    assert body["node_errors"] == [{"node_id": "ghost", "error": "node is not known"}]
    paths = {p for _b, p, _t in node.site.client.calls}
    assert len(paths) == 1
    query = parse_qs(urlsplit(paths.pop()).query)
    assert query == {"lane": ["image"], "outcome": ["lent"], "kind": ["dispatch"], "limit": ["3"],
                     "since_ms": ["10"]}
    node.site.client.calls.clear()
    _, body = get(node, "/router/v1/site/offload/decisions?node_id=master")
    assert {r["node_id"] for r in body["records"]} == {"master"}
    assert node.site.client.calls == [] and body["node_errors"] == []


def test_site_decisions_report_a_malformed_answer() -> None:
    node = Parts(site=FakeAgent(FakeRegistry(infos=[info("slave-a")])))
    assert node.site is not None
    node.site.client.answers = {"http://slave-a:8080": {"rows": []}}
    _, body = get(node, "/router/v1/site/offload/decisions")
    assert body == {"records": [], "cursor": NO_CURSOR,
                    "node_errors": [{"node_id": "slave-a", "error": "answer has no records list"}]}


def test_site_asks_at_most_eight_nodes_at_once() -> None:
    names = [f"slave-{i:02d}" for i in range(FANOUT + 4)]
    node = Parts(site=FakeAgent(FakeRegistry(infos=[info(n) for n in names])))
    assert node.site is not None
    pending = {f"http://{n}:8080": Deferred() for n in names}
    node.site.client.answers = dict(pending)
    client = StubTreq(Dispatch([routes(node)]))
    out: list[Any] = []
    client.get("http://node/router/v1/site/offload/decisions").addCallback(
        lambda r: out.append(r.code) or r.content()).addCallback(out.append)
    client.flush()
    assert len(node.site.client.calls) == FANOUT and not out
    for i, name in enumerate(names):
        pending[f"http://{name}:8080"].callback({"records": [
            {"id": 1, "recorded_at": i, "node_id": name, "kind": "plan", "outcome": "probe",
             "lane": "text", "router_version": ""}]})
    client.flush()
    assert len(node.site.client.calls) == len(names)
    assert out[0] == 200
    body = json.loads(out[1])
    assert [r["node_id"] for r in body["records"]] == list(reversed(names))


def test_site_summary_lists_every_node_sorted_with_sync_state_and_leases() -> None:
    lease = {"lane": "image", "owner_node_id": "slave-a", "owner_model_id": "sd",
             "helper_node_id": "master", "helper_model_id": "sd", "helper_slots": 2, "probe": False,
             "ttl_ms": 30000, "expires_in_ms": 12000}
    held = [{"request_id": "r9", "lane": "text", "model_id": "chat", "state": "lent", "waiting_ms": 5,
             "helper_node_id": "slave-a", "helper_model_id": "chat"}]
    master = FakeAgent(FakeRegistry(infos=[info("slave-b"), info("slave-a")]))
    node = Parts(site=master, coordinator=FakeCoordinator([lease]))
    master.client.answers = {
        "http://slave-a:8080": {"node_id": "slave-a", "build_version": "0.1.0",
                                "settings_fingerprint": SETTINGS.fingerprint(), "held_requests": held},
        "http://slave-b:8080": {"node_id": "slave-b", "build_version": "0.0.9",
                                "settings_fingerprint": OTHER_SETTINGS.fingerprint(),
                                "held_requests": None},
    }
    code, body = get(node, "/router/v1/site/offload/summary")
    assert code == 200
    assert body == {
        "nodes": [
            {"node_id": "master", "build_version": __version__,
             "settings_fingerprint": SETTINGS.fingerprint(), "in_sync": True, "held_requests": []},
            {"node_id": "slave-a", "build_version": "0.1.0", "settings_fingerprint": SETTINGS.fingerprint(),
             "in_sync": True, "held_requests": held},
            {"node_id": "slave-b", "build_version": "0.0.9",
             "settings_fingerprint": OTHER_SETTINGS.fingerprint(), "in_sync": False, "held_requests": []},
        ],
        "leases": [lease],
    }
    assert {(b, p, t) for b, p, t in master.client.calls} == {
        ("http://slave-a:8080", "/router/v1/node/offload/summary", NODE_TIMEOUT_S),
        ("http://slave-b:8080", "/router/v1/node/offload/summary", NODE_TIMEOUT_S)}


def test_site_summary_reports_failed_nodes_and_guards_a_bare_lending_service() -> None:
    master = FakeAgent(FakeRegistry(infos=[info("slave-a"), info("slave-b", healthy=False)]))
    master.client.answers = {"http://slave-a:8080": ConnectionRefusedError("connection refused")}
    node = Parts(site=master, lending=BareLending())
    code, body = get(node, "/router/v1/site/offload/summary")
    assert code == 200
    assert [n["node_id"] for n in body["nodes"]] == ["master"]
    assert body["leases"] == []
    assert [e["node_id"] for e in body["node_errors"]] == ["slave-a", "slave-b"]
    assert "refused" in body["node_errors"][0]["error"]


# -- folded site decisions (the WebUI Lending tab) ---------------------------------------------------


def test_site_folded_decisions_fold_every_nodes_rows_and_paginate() -> None:
    clock = task.Clock()
    node = Parts(site=FakeAgent())
    log = with_log(node, clock)
    for _ in range(3):
        clock.advance(1)
        log.record("plan", "granted", lane="text", trigger="enqueued", owner_node_id="slave-a",
                   owner_model_id="alpha",
                   helper_node_id="master", helper_model_id="beta", slots=2)
    node.site.registry.infos.append(info("slave-a"))  # type: ignore[union-attr]
    node.site.client.answers["http://slave-a:8080"] = _remote_rows("slave-a", [500, 1500, 2500, 4500])
    code, body = get(node, "/router/v1/site/offload/decisions/folded?page_size=1")
    assert code == 200
    assert (body["total_rows"], body["total_lines"], body["pages"], body["page"]) == (7, 2, 2, 0)
    [line] = body["lines"]
    assert (line["node_id"], line["outcome"], line["count"], line["first_ms"], line["last_ms"]) == \
        ("slave-a", "lent", 4, 500, 4500)
    assert line["latest"]["recorded_at"] == 4500
    _, body = get(node, "/router/v1/site/offload/decisions/folded?page_size=1&page=1")
    [line] = body["lines"]
    assert (line["node_id"], line["outcome"], line["count"], line["span_ms"]) == \
        ("master", "granted", 3, 2000)
    assert body["node_errors"] == []


def test_site_folded_decisions_gather_more_rows_than_one_node_may_return() -> None:
    node = Parts(site=FakeAgent())
    node.site.registry.infos.append(info("slave-a"))  # type: ignore[union-attr]
    node.site.client.answers["http://slave-a:8080"] = _remote_rows("slave-a", [1, 2, 3])
    code, body = get(node, "/router/v1/site/offload/decisions/folded?limit=20000")
    assert code == 200 and body["total_rows"] == 3
    asked = node.site.client.calls[0][1]  # type: ignore[union-attr]
    assert "limit=5000" in asked  # each node is asked within its own cap


@pytest.mark.parametrize("query", ["page=-1", "page=x", "page_size=0", "page_size=501", "limit=100001",
                                   "kind=audit"])
def test_site_folded_decisions_refuse_bad_parameters(query: str) -> None:
    code, body = get(Parts(site=FakeAgent()), f"/router/v1/site/offload/decisions/folded?{query}")
    assert code == 400
    assert query.split("=")[0] in body["error"]["message"]


def test_site_folded_decisions_answer_404_on_a_node_that_is_not_the_master() -> None:
    code, _ = get(Parts(site=None), "/router/v1/site/offload/decisions/folded")
    assert code == 404


# -- every node's state in one answer (the WebUI Nodes page) -----------------------------------------


def test_site_states_gather_every_nodes_state_and_name_the_ones_that_failed() -> None:
    from routerd.site.reports import site_states

    master = FakeAgent()
    master.registry.infos += [info("slave-a"), info("slave-b"), info("slave-c", healthy=False)]
    master.client.answers["http://slave-a:8080"] = {"node_id": "whatever", "runtimes": [],
                                                    "active_requests": [],
                                                    "held_requests": [{"request_id": "r"}]}
    master.client.answers["http://slave-b:8080"] = ClusterTimeout("no answer in 5s")
    own = {"node_id": "master", "runtimes": [], "active_requests": [], "held_requests": []}
    out: list[Any] = []
    Deferred.fromCoroutine(site_states(SiteService("master", master), own)).addCallback(out.append)
    [doc] = out
    assert [s["node_id"] for s in doc["states"]] == ["master", "slave-a"]
    assert doc["states"][1]["held_requests"] == [{"request_id": "r"}]
    assert [e["node_id"] for e in doc["node_errors"]] == ["slave-b", "slave-c"]
    assert "unhealthy" in doc["node_errors"][1]["error"]
