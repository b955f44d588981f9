"""The master's Coordinator on a fake clock: plans on events and probes, the lease book, grants,
plan rows, pushes of links and settings, and the relay of lent requests (spec "Who decides",
"Probes", "Decision log").

The master is a fake (registry, runtime statuses, a recording client); the planner is the real one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, cast

import attrs
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from routerd.catalog.model import Capabilities
from routerd.config.lending import LendingSettings
from routerd.lending.coordinator import Coordinator
from routerd.lending.decisions import DecisionLog
from routerd.lending.links import LinkSet
from routerd.lending.offload import Borrowed, RelayRequest, relay_from_headers, relay_headers
from routerd.lending.service import LendingService
from routerd.paths import INFERENCE_PREFIX
from routerd.routing.call import Call, Incoming
from routerd.routing.classify import classify
from routerd.routing.forward import CameBack, Outbound, Unreachable
from routerd.site.testing import FakeAgent
from routerd.store.store import Store
from routerd.wire.lending import Endpoint, Lane, Lease, Link, Trigger, to_json
from routerd.wire.records import ModelRecord
from routerd.wire.status import RuntimeStatus, parse_status
from tests.support import FakeReply, fired

MASTER = "master"
START = 1000.0
CHAT = "/v1/chat/completions"
GRANT_PATH = "/router/v1/node/offload/grant"
# Per request: 100 prompt tokens and 200 output tokens.
WORK = (100.0, 200.0)
# Owner fit 1000 + 1·p + 10·o: one job 3100 ms; helper fit 500 + 1·p + 5·o: one job 1600 ms.
OWNER_FIT = {"base_ms": 1000.0, "slopes_ms": [1.0, 10.0], "samples": 20}
HELPER_FIT = {"base_ms": 500.0, "slopes_ms": [1.0, 5.0], "samples": 20}

A_TO_H = Link(Endpoint("s1", "A"), Endpoint("s2", "H"), True, False)
B_TO_K = Link(Endpoint("s3", "B"), Endpoint("s4", "K"), False, True)


def failed_with(d: Deferred[Any], kind: type[BaseException]) -> BaseException:
    results: list[Any] = []
    d.addBoth(results.append)
    assert results and isinstance(results[0], Failure), results
    assert results[0].check(kind), results[0]
    return cast(BaseException, results[0].value)


def record(node_id: str, local_id: str) -> ModelRecord:
    return ModelRecord(local_id=local_id, public_id=local_id, filename=f"{local_id}.kcpps", node_id=node_id,
                       node_url=f"http://{node_id}:1", config_hash=f"cfg-{local_id}",
                       capabilities=Capabilities(llm=True, context=4096))


def owner_status(node_id: str, model: str, *, pending: int = 8, admitted: int = 2, priced: bool = True,
                 ) -> RuntimeStatus:
    """An owner with ``pending`` held requests of ``model`` (the contract's status shape)."""
    backlog = pending + admitted
    queue = [{"model_id": model, "pending_count": pending,
              "pending_work": [WORK[0] * pending, WORK[1] * pending], "pending_context": 0,
              "backlog_count": backlog, "backlog_work": [WORK[0] * backlog, WORK[1] * backlog]}]
    models = [{"model_id": model, "section": "llm", **OWNER_FIT}] if priced else []
    return parse_status(dict(node_id=node_id, backend_mode="llama_sdcpp",
                             lanes={"text": {"accepting_borrowed": False, "active_config": f"{model}.kcpps",
                                             "queue": queue if pending else []}},
                             costs={"models": models, "loads": [], "tokens": []}))


def helper_status(node_id: str, model: str, *, idle_ms: int = 60_000, accepting: bool = True,
                  active_config: str | None = None, backend_mode: str = "llama_sdcpp",
                  loads: Sequence[tuple[str, float]] = (), active_stt_config: str | None = "",
                  ) -> RuntimeStatus:
    return parse_status(dict(node_id=node_id, backend_mode=backend_mode, idle_for_ms=idle_ms,
                             active_stt_config=active_stt_config,
                             lanes={"text": {"accepting_borrowed": accepting,
                                             "active_config": f"{model}.kcpps" if active_config is None
                                             else active_config,
                                             "queue": []}},
                             costs={"models": [{"model_id": model, "section": "llm", **HELPER_FIT}],
                                    "loads": [{"config_filename": name, "load_ms": ms, "samples": 3}
                                              for name, ms in loads],
                                    "tokens": []}))


@attrs.define
class FakeForwarder:
    sent: list[Outbound] = attrs.Factory(list)
    error: Exception | None = None

    async def send(self, request: Any, out: Outbound) -> tuple[int, bytes]:
        self.sent.append(out)
        if self.error is not None:
            raise self.error
        return 200, b"helper answer"


def make_call(model: str = "A", request_id: str = "req-1") -> Call:
    route = classify("POST", CHAT)
    assert route is not None
    parsed = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    return Call(reply=FakeReply(), route=route, path=CHAT, body=json.dumps(parsed).encode(),
                content_type="application/json", parsed=parsed, stream=False, request_id=request_id,
                started=START, selector=model)


class Cluster:
    """A Coordinator over a fake master, with the real service, planner and decision log."""

    def __init__(self, links: Sequence[Link] = (A_TO_H, B_TO_K),
                 settings: LendingSettings | None = None) -> None:
        self.clock = Clock()
        self.clock.advance(START)
        self.master = FakeAgent()
        self.log = DecisionLog(Store.open_sync(clock=self.clock), self.clock, MASTER)
        self.service = LendingService(node_id=MASTER, settings=settings or LendingSettings(),
                                      clock=self.clock, role="master", decisions=self.log)
        self.service.install_links(LinkSet.build("image", ()), LinkSet.build("text", links))
        self.forwarder = FakeForwarder()
        self.borrowed: list[tuple[str, bytes, str, Borrowed]] = []
        self.coordinator = Coordinator(node_id=MASTER, master=cast(Any, self.master), service=self.service,
                                       clock=self.clock, forwarder=cast(Any, self.forwarder),
                                       serve_borrowed=self._serve_borrowed)
        for link in links:
            for end in (link.owner, link.helper):
                if end.node_id != MASTER and self.master.registry.node(end.node_id) is None:
                    self.master.registry.add_node(end.node_id)
                self.master.registry.models.append(record(end.node_id, end.model_id))

    def _serve_borrowed(self, reply: Any, incoming: Incoming, borrowed: Borrowed) -> Deferred[bytes]:
        self.borrowed.append((incoming.path, incoming.body, incoming.content_type, borrowed))
        return succeed(b"served here")

    def standard_statuses(self) -> None:
        self.master.status = {"s1": owner_status("s1", "A"), "s2": helper_status("s2", "H"),
                              "s3": owner_status("s3", "B"), "s4": helper_status("s4", "K")}

    def event(self, lane: Lane, owner: str, model: str, trigger: Trigger = "enqueued") -> Lease | None:
        return fired(Deferred.fromCoroutine(self.coordinator.event(lane, owner, model, trigger)))

    def plan(self, trigger: Trigger = "tick") -> Lease | None:
        return fired(Deferred.fromCoroutine(self.coordinator.plan(trigger)))

    def relay(self, owner: str = "s1", model: str = "A", request: FakeReply | None = None,
              ) -> Deferred[bytes]:
        return Deferred.fromCoroutine(self.coordinator.relay(
            request or FakeReply(), RelayRequest("text", owner, model, CHAT), make_call(model),
            rewrite_to=None, returns_raise=False))

    def rows(self, kind: str | None = None, outcome: str | None = None) -> list[dict[str, Any]]:
        newest_first: list[dict[str, Any]] = fired(self.log.query(kind=kind, outcome=outcome))
        return newest_first[::-1]


def expected_lease(owner: str, model: str, helper: str, helper_model: str, *, load: bool = True,
                   restore: bool = False) -> Lease:
    return Lease(lane="text", owner_node_id=owner, owner_model_id=model, helper_node_id=helper,
                 helper_model_id=helper_model, load_helper_model=load, restore_helper_model=restore,
                 helper_slots=2, probe=False, ttl_ms=30_000, owner_job_ms=3100.0, helper_switch_ms=0.0,
                 helper_service_ms=1600.0, helper_context=4096)


A_LEASE = expected_lease("s1", "A", "s2", "H")
B_LEASE = expected_lease("s3", "B", "s4", "K", load=False, restore=True)


# -- planning on an event -----------------------------------------------------------------------------


def test_an_event_plans_and_answers_the_asking_owners_lease() -> None:
    cluster = Cluster()
    cluster.standard_statuses()
    assert cluster.event("text", "s1", "A") == A_LEASE
    assert cluster.master.polls == 1


def test_an_event_pushes_grants_to_the_other_owners_only() -> None:
    cluster = Cluster()
    cluster.standard_statuses()
    cluster.event("text", "s1", "A")
    assert cluster.master.client.to(GRANT_PATH) == [("http://s3:1", to_json(B_LEASE))]


def test_an_owner_with_no_lease_is_answered_with_none() -> None:
    cluster = Cluster()
    cluster.standard_statuses()
    cluster.master.status["s1"] = owner_status("s1", "A", pending=0)
    assert cluster.event("text", "s1", "A", "completed") is None
    assert cluster.master.client.to(GRANT_PATH) == [("http://s3:1", to_json(B_LEASE))]


def test_a_plan_writes_one_plan_row_per_owner_and_helper_pair() -> None:
    cluster = Cluster()
    cluster.standard_statuses()
    cluster.event("text", "s1", "A", "borrowed_completed")
    rows = cluster.rows(kind="plan")
    assert [(r["owner_node_id"], r["helper_node_id"], r["outcome"]) for r in rows] == [
        ("s1", "s2", "granted"), ("s3", "s4", "granted")]
    first = rows[0]
    assert first["trigger"] == "borrowed_completed" and first["lane"] == "text"
    assert first["pending_count"] == 8 and first["backlog_count"] == 10
    assert first["keep_ms"] == 31_000.0 and first["owner_job_ms"] == 3100.0
    assert first["service_ms"] == 1600.0 and first["service_source"] == "helper"
    assert first["helper_idle_ms"] == 60_000 and first["slots"] == 2


def test_each_plan_replaces_the_whole_lease_book() -> None:
    cluster = Cluster()
    cluster.standard_statuses()
    cluster.plan("tick")
    assert set(cluster.coordinator.book) == {A_LEASE.key(), B_LEASE.key()}
    cluster.master.status["s3"] = owner_status("s3", "B", pending=0)
    cluster.plan("tick")
    assert set(cluster.coordinator.book) == {A_LEASE.key()}
    assert cluster.coordinator.live_lease(B_LEASE.key()) is None
    assert [lease["owner_model_id"] for lease in cluster.coordinator.live_leases()] == ["A"]


def test_book_entries_expire_after_their_ttl_on_the_masters_clock() -> None:
    cluster = Cluster()
    cluster.standard_statuses()
    cluster.plan("tick")
    cluster.clock.advance(29.5)
    assert cluster.coordinator.live_lease(A_LEASE.key()) == A_LEASE
    assert cluster.coordinator.live_leases()[0]["expires_in_ms"] == 500
    cluster.clock.advance(0.5)
    assert cluster.coordinator.live_lease(A_LEASE.key()) is None
    assert cluster.coordinator.live_leases() == []


def test_a_lease_for_the_masters_own_model_is_granted_in_process() -> None:
    link = Link(Endpoint(MASTER, "M"), Endpoint("s2", "H"), True, False)
    cluster = Cluster(links=(link,))
    cluster.master.status = {MASTER: owner_status(MASTER, "M"), "s2": helper_status("s2", "H")}
    assert cluster.plan("tick") is None  # a tick answers nobody
    held = cluster.service.live_lease("text", "M")
    assert held is not None and held.helper_node_id == "s2"
    assert cluster.master.client.posts == []
    updated = cluster.rows(kind="dispatch", outcome="lease_updated")
    assert len(updated) == 1 and updated[0]["trigger"] == "grant"


def test_a_failed_grant_push_is_only_logged() -> None:
    cluster = Cluster()
    cluster.standard_statuses()
    cluster.master.client.failing.add("http://s3:1")
    assert cluster.event("text", "s1", "A") == A_LEASE
    assert len(cluster.master.client.to(GRANT_PATH)) == 1


def test_plans_run_one_at_a_time() -> None:
    cluster = Cluster()
    cluster.standard_statuses()
    gate: Deferred[None] = Deferred()
    cluster.master.gate = gate
    first = Deferred.fromCoroutine(cluster.coordinator.event("text", "s1", "A", "enqueued"))
    second = Deferred.fromCoroutine(cluster.coordinator.event("text", "s3", "B", "enqueued"))
    assert cluster.master.polls == 1  # the second plan waits for the lock
    cluster.master.gate = None
    gate.callback(None)
    assert fired(first) == A_LEASE and fired(second) == B_LEASE
    assert cluster.master.polls == 2


# -- probes -------------------------------------------------------------------------------------------


def probe_cluster() -> Cluster:
    """Owner s1/A is unpriced; helper s2/H is loaded but idle for only 1 s (probe bar: 5 s)."""
    cluster = Cluster(links=(A_TO_H,))
    cluster.master.status = {"s1": owner_status("s1", "A", priced=False),
                             "s2": helper_status("s2", "H", idle_ms=1000)}
    return cluster


def test_a_probe_timer_is_armed_when_the_planner_names_a_due_time_and_replans_then() -> None:
    cluster = probe_cluster()
    assert cluster.event("text", "s1", "A") is None
    skipped = cluster.rows(kind="plan")
    assert [(r["outcome"], r["reason"]) for r in skipped] == [("skipped", "owner_unpriced")]

    cluster.clock.advance(3.9)
    assert cluster.master.polls == 1  # not yet due
    cluster.master.status["s2"] = helper_status("s2", "H", idle_ms=5000)
    cluster.clock.advance(0.1)
    assert cluster.master.polls == 2
    probe_rows = [r for r in cluster.rows(kind="plan") if r["trigger"] == "probe_due"]
    assert [(r["outcome"], r["reason"], r["slots"]) for r in probe_rows] == [("probe", "owner_unpriced", 1)]
    (base, body), = cluster.master.client.to(GRANT_PATH)
    assert base == "http://s1:1" and body["probe"] is True and body["helper_slots"] == 1


def test_a_new_plan_rearms_the_probe_timer_instead_of_adding_one() -> None:
    cluster = probe_cluster()
    cluster.event("text", "s1", "A")
    cluster.clock.advance(2)
    cluster.event("text", "s1", "A", "completed")  # helper still idle 1 s: due 4 s from now
    assert cluster.master.polls == 2
    cluster.clock.advance(2)
    assert cluster.master.polls == 2  # the first timer was cancelled
    cluster.clock.advance(2)
    assert cluster.master.polls == 3
    assert cluster.rows(kind="plan")[-1]["trigger"] == "probe_due"


def test_no_probe_timer_when_a_lease_is_granted() -> None:
    cluster = Cluster()
    cluster.standard_statuses()
    cluster.event("text", "s1", "A")
    assert cluster.clock.getDelayedCalls() == []


# -- the relay ----------------------------------------------------------------------------------------


def test_relay_with_no_live_lease_comes_back_and_logs_relay_refused() -> None:
    cluster = Cluster()
    failed_with(cluster.relay(), CameBack)
    refused = cluster.rows(kind="dispatch", outcome="relay_refused")
    assert len(refused) == 1
    assert refused[0]["reason"] == "no_live_lease"
    assert (refused[0]["owner_node_id"], refused[0]["owner_model_id"]) == ("s1", "A")
    assert cluster.forwarder.sent == []


def test_relay_after_the_lease_expired_comes_back() -> None:
    cluster = Cluster()
    cluster.standard_statuses()
    cluster.plan("tick")
    cluster.clock.advance(31)
    failed_with(cluster.relay(), CameBack)
    assert [r["reason"] for r in cluster.rows(outcome="relay_refused")] == ["no_live_lease"]


def test_relay_to_an_unknown_helper_node_logs_helper_unreachable() -> None:
    cluster = Cluster()
    cluster.standard_statuses()
    cluster.plan("tick")
    cluster.master.registry.remove_node("s2")
    failed_with(cluster.relay(), CameBack)
    refused = cluster.rows(outcome="relay_refused")
    assert [(r["reason"], r["helper_node_id"], r["helper_model_id"]) for r in refused] == [
        ("helper_unreachable", "s2", "H")]
    assert cluster.forwarder.sent == []


def test_relay_forwards_to_the_helper_with_its_model_id_and_the_lease_flags() -> None:
    cluster = Cluster()
    cluster.standard_statuses()
    cluster.plan("tick")
    request = FakeReply()
    assert fired(cluster.relay(request=request)) == b"helper answer"
    (out,) = cluster.forwarder.sent
    assert out.url == "http://s2:1" + INFERENCE_PREFIX + CHAT
    assert json.loads(out.body)["model"] == "H"  # rewritten to the helper's own model ID
    assert (b"x-routerd-offload", b"1") in out.headers
    assert (b"x-routerd-offload-owner", b"s1") in out.headers
    assert (b"x-routerd-offload-owner-model", b"A") in out.headers
    assert (b"x-routerd-offload-load", b"1") in out.headers
    assert not any(name == b"x-routerd-offload-restore" for name, _ in out.headers)
    assert out.request_id == "req-1"
    assert request.headers[b"x-routerd-lent-to"] == b"s2/H"
    assert cluster.rows(outcome="relay_refused") == []


def test_relay_that_cannot_reach_the_helper_logs_forward_failed() -> None:
    cluster = Cluster()
    cluster.standard_statuses()
    cluster.plan("tick")
    cluster.forwarder.error = Unreachable("connection refused")
    failed_with(cluster.relay(), CameBack)
    assert [r["reason"] for r in cluster.rows(outcome="relay_refused")] == ["forward_failed"]


def test_relay_to_the_master_itself_serves_in_process() -> None:
    link = Link(Endpoint("s1", "A"), Endpoint(MASTER, "H"), False, True)
    cluster = Cluster(links=(link,))
    cluster.master.status = {"s1": owner_status("s1", "A"), MASTER: helper_status(MASTER, "H")}
    cluster.plan("tick")
    request = FakeReply()
    assert fired(cluster.relay(request=request)) == b"served here"
    (path, body, content_type, borrowed), = cluster.borrowed
    assert path == CHAT and json.loads(body)["model"] == "H" and content_type == "application/json"
    assert borrowed == Borrowed(load_allowed=False, restore=True, owner_node_id="s1", owner_model_id="A")
    assert request.headers[b"x-routerd-lent-to"] == b"master/H"
    assert cluster.forwarder.sent == []


# -- pushes -------------------------------------------------------------------------------------------


def test_push_sends_links_and_settings_to_every_healthy_node() -> None:
    settings = LendingSettings(scheduling_backend_depth=3)
    cluster = Cluster(settings=settings)
    cluster.master.registry.add_node("s3", healthy=False)
    fired(Deferred.fromCoroutine(cluster.coordinator.push()))
    links = {"image": [], "text": [to_json(A_TO_H), to_json(B_TO_K)], "guardians": []}
    pushed_settings: dict[str, Any] = {"values": settings.texts(), "fingerprint": settings.fingerprint()}
    assert sorted(cluster.master.client.to("/router/v1/node/offload/links")) == [
        ("http://s1:1", links), ("http://s2:1", links), ("http://s4:1", links)]
    assert sorted(cluster.master.client.to("/router/v1/node/offload/settings")) == [
        ("http://s1:1", pushed_settings), ("http://s2:1", pushed_settings), ("http://s4:1", pushed_settings)]
    assert pushed_settings["values"]["scheduling_backend_depth"] == "3"


def test_a_failed_push_does_not_stop_the_others() -> None:
    cluster = Cluster()
    cluster.master.client.failing.add("http://s1:1")
    fired(Deferred.fromCoroutine(cluster.coordinator.push()))
    assert len(cluster.master.client.posts) == 8  # 4 healthy nodes × (links, settings)


def test_the_refresh_tick_pushes_then_plans() -> None:
    cluster = Cluster(settings=LendingSettings(scheduling_refresh_interval=10.0))
    cluster.standard_statuses()
    cluster.coordinator.start()
    cluster.clock.advance(9.9)
    assert cluster.master.polls == 0 and cluster.master.client.posts == []
    cluster.clock.advance(0.1)
    assert cluster.master.polls == 1
    assert len(cluster.master.client.to("/router/v1/node/offload/links")) == 4
    assert {r["trigger"] for r in cluster.rows(kind="plan")} == {"tick"}
    cluster.coordinator.stop()
    assert cluster.clock.getDelayedCalls() == []


# -- kobold helpers: the speech config a node reports ---------------------------------------------------


def kobold_cluster(active_stt_config: str | None) -> Cluster:
    """s2 is a kobold node holding X.kcpps (not the linked H.kcpps); both loads are measured."""
    cluster = Cluster(links=(A_TO_H,))
    cluster.master.status = {
        "s1": owner_status("s1", "A"),
        "s2": helper_status("s2", "H", idle_ms=20_000, active_config="X.kcpps", backend_mode="kobold",
                            loads=[("H.kcpps", 2000.0), ("X.kcpps", 3000.0)],
                            active_stt_config=active_stt_config)}
    return cluster


def test_a_kobold_helper_with_no_speech_config_is_priced_with_its_restore() -> None:
    cluster = kobold_cluster("")
    lease = cluster.event("text", "s1", "A")
    assert lease is not None and lease.helper_switch_ms == 2000.0
    (row,) = cluster.rows(kind="plan")
    assert row["outcome"] == "granted" and row["restore_ms"] == 3000.0


def test_a_kobold_helper_reporting_a_null_speech_config_is_priced_the_same() -> None:
    cluster = kobold_cluster(None)  # what a node with no STT model loaded reports
    lease = cluster.event("text", "s1", "A")
    (row,) = cluster.rows(kind="plan")
    assert row.get("reason") != "restore_unpriced"
    assert lease is not None and row["outcome"] == "granted" and row["restore_ms"] == 3000.0


def test_a_failing_tick_does_not_stop_the_refresh_tick() -> None:
    cluster = Cluster(settings=LendingSettings(scheduling_refresh_interval=10.0))
    cluster.standard_statuses()
    cluster.master.failures = 1
    cluster.coordinator.start()
    cluster.clock.advance(10)  # the first tick's plan fails
    assert cluster.master.polls == 1
    cluster.clock.advance(10)  # the next tick must still run
    assert cluster.master.polls == 2
    cluster.coordinator.stop()


def test_the_relay_follows_the_helper_named_by_the_lease_the_owner_lent_under() -> None:
    """Issue 21 §3: the owner lent under a lease naming s2/H; the master's book has since moved the
    owner to s5/J.  The request goes to s2/H (with that link's flags), so the owner's ``lent`` row,
    its held list and ``X-Routerd-Lent-To`` all name the helper that served it."""
    a_to_j = Link(Endpoint("s1", "A"), Endpoint("s5", "J"), True, False)
    a_to_h = Link(Endpoint("s1", "A"), Endpoint("s2", "H"), False, True)
    cluster = Cluster(links=(a_to_h, a_to_j))
    cluster.master.status = {"s1": owner_status("s1", "A"), "s5": helper_status("s5", "J")}
    cluster.plan("tick")
    assert cluster.coordinator.live_lease(("text", "s1", "A")).helper_node_id == "s5"  # type: ignore[union-attr]
    request = FakeReply()
    relay = RelayRequest("text", "s1", "A", CHAT, helper_node_id="s2", helper_model_id="H")
    answer = Deferred.fromCoroutine(cluster.coordinator.relay(request, relay, make_call("A"), rewrite_to=None,
                                                              returns_raise=False))
    assert fired(answer) == b"helper answer"
    (out,) = cluster.forwarder.sent
    assert out.url == "http://s2:1" + INFERENCE_PREFIX + CHAT
    assert json.loads(out.body)["model"] == "H"
    assert (b"x-routerd-offload-restore", b"1") in out.headers  # s2/H's own link flags
    assert not any(name == b"x-routerd-offload-load" for name, _ in out.headers)
    assert request.headers[b"x-routerd-lent-to"] == b"s2/H"


def test_a_relay_naming_a_helper_the_owner_does_not_link_to_goes_to_the_masters_lease() -> None:
    cluster = Cluster()
    cluster.standard_statuses()
    cluster.plan("tick")
    relay = RelayRequest("text", "s1", "A", CHAT, helper_node_id="s4", helper_model_id="K")  # B's helper
    request = FakeReply()
    fired(Deferred.fromCoroutine(cluster.coordinator.relay(request, relay, make_call("A"), rewrite_to=None,
                                                           returns_raise=False)))
    assert cluster.forwarder.sent[0].url == "http://s2:1" + INFERENCE_PREFIX + CHAT
    assert request.headers[b"x-routerd-lent-to"] == b"s2/H"


def owners_relay(cluster: Cluster, helper: str = "s2", helper_model: str = "H",
                 request: FakeReply | None = None) -> Deferred[bytes]:
    """s1/A's lent request, naming the helper of the lease s1 lent it under."""
    relay = RelayRequest("text", "s1", "A", CHAT, helper_node_id=helper, helper_model_id=helper_model)
    return Deferred.fromCoroutine(cluster.coordinator.relay(request or FakeReply(), relay, make_call("A"),
                                                            rewrite_to=None, returns_raise=False))


def test_a_relay_under_the_owners_live_lease_goes_through_after_the_masters_record_expired() -> None:
    """The owner times its lease on its own clock: the master's record having run out (or a newer
    plan having left the owner without a lease) does not refuse a request the owner lends under its
    lease; it goes to the helper that lease names, with the flags of the owner's link to it."""
    cluster = Cluster()
    cluster.standard_statuses()
    cluster.plan("tick")
    cluster.clock.advance(31)  # the master's record of s1/A's lease has expired
    assert cluster.coordinator.live_lease(("text", "s1", "A")) is None
    request = FakeReply()
    assert fired(owners_relay(cluster, request=request)) == b"helper answer"
    (out,) = cluster.forwarder.sent
    assert out.url == "http://s2:1" + INFERENCE_PREFIX + CHAT
    assert json.loads(out.body)["model"] == "H"
    assert (b"x-routerd-offload-load", b"1") in out.headers  # A_TO_H loads if unloaded
    assert request.headers[b"x-routerd-lent-to"] == b"s2/H"
    assert cluster.rows(outcome="relay_refused") == []


def test_a_relay_to_a_helper_node_a_newer_plan_gave_another_owner_is_refused_helper_claimed() -> None:
    """A helper node serves one owner per lane: once a plan leases s2 to s3/B, s1/A's request lent
    under its older lease on s2 comes back (row ``relay_refused``, reason ``helper_claimed``) and
    its owner runs it; nothing reaches s2 beside B's work."""
    b_to_h = Link(Endpoint("s3", "B"), Endpoint("s2", "H"), True, False)
    cluster = Cluster(links=(A_TO_H, b_to_h))
    cluster.master.status = {"s1": owner_status("s1", "A", pending=0), "s2": helper_status("s2", "H"),
                             "s3": owner_status("s3", "B")}
    cluster.plan("tick")
    assert cluster.coordinator.live_lease(("text", "s3", "B")).helper_node_id == "s2"  # type: ignore[union-attr]
    failed_with(owners_relay(cluster), CameBack)
    refused = cluster.rows(outcome="relay_refused")
    assert [(r["owner_node_id"], r["reason"]) for r in refused] == [("s1", "helper_claimed")]
    assert cluster.forwarder.sent == []


def test_a_relay_naming_no_helper_still_needs_the_masters_live_lease() -> None:
    cluster = Cluster()
    cluster.standard_statuses()
    cluster.plan("tick")
    assert fired(cluster.relay()) == b"helper answer"
    cluster.clock.advance(31)
    failed_with(cluster.relay(), CameBack)
    assert [r["reason"] for r in cluster.rows(outcome="relay_refused")] == ["no_live_lease"]


def test_relay_headers_carry_the_helper_of_the_owners_lease() -> None:
    relay = RelayRequest("image", "s1", "A", "/v1/images/generations", helper_node_id="s2",
                         helper_model_id="H")
    headers = dict((k.decode(), v.decode()) for k, v in relay_headers(relay))
    assert relay_from_headers(lambda name: headers.get(name, "")) == relay
    older = {k: v for k, v in headers.items() if "helper" not in k}  # an owner of an older build
    assert relay_from_headers(lambda name: older.get(name, "")) == attrs.evolve(relay, helper_node_id="",
                                                                                 helper_model_id="")
