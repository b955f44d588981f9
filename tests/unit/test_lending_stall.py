"""The master's stall check of lent requests (spec: "If a helper shows no change in the requests
lent to it for cluster.offload_lent_stall_timeout ... the master asks the helper"): the pure
tracker, and the coordinator's relay that performs it on a fake clock."""

from __future__ import annotations

from typing import Any

import attrs
from twisted.internet.defer import Deferred, fail, succeed

from routerd.clients.node_client import ClusterTimeout, RemoteError
from routerd.config.lending import LendingSettings
from routerd.lending.stall import StallTracker
from routerd.lending.stall_check import HelperGone, borrowed_ids
from routerd.paths import BORROWED_PATH
from routerd.routing.forward import CameBack, Outbound
from routerd.site.testing import FakeClient
from tests.support import FakeReply, fired
from tests.unit.test_lending_coordinator import Cluster, failed_with, helper_status, owner_status

TIMEOUT = 180.0


def lend(tracker: StallTracker, now: float, rid: str, helper: str = "h1") -> Any:
    return tracker.lent(now, rid, "text", "o1", "A", helper, "H")


# -- the pure tracker ----------------------------------------------------------------------------------


def test_a_helper_is_due_only_after_the_timeout_with_no_change() -> None:
    tracker = StallTracker()
    lend(tracker, 0.0, "r1")
    lend(tracker, 100.0, "r2")  # a new lent request is a change
    assert tracker.next_due(TIMEOUT) == 280.0
    assert tracker.due(279.9, TIMEOUT) == []
    (ask,) = tracker.due(280.0, TIMEOUT)
    assert ask.helper_node_id == "h1" and ask.request_ids() == {"r1", "r2"}


def test_a_finished_request_is_a_change_and_an_idle_helper_is_never_asked() -> None:
    tracker = StallTracker()
    first = lend(tracker, 0.0, "r1")
    lend(tracker, 0.0, "r2")
    tracker.over(150.0, first)
    assert tracker.next_due(TIMEOUT) == 330.0
    (second,) = tracker.outstanding("h1")
    tracker.over(200.0, second)
    assert tracker.next_due(TIMEOUT) is None
    assert tracker.due(10_000.0, TIMEOUT) == []


def test_a_helper_being_asked_is_not_asked_twice() -> None:
    tracker = StallTracker()
    lend(tracker, 0.0, "r1")
    assert len(tracker.due(180.0, TIMEOUT)) == 1
    assert tracker.next_due(TIMEOUT) is None
    assert tracker.due(500.0, TIMEOUT) == []


def test_a_helper_that_still_lists_one_of_them_keeps_all_and_the_wait_restarts() -> None:
    tracker = StallTracker()
    lend(tracker, 0.0, "r1")
    lend(tracker, 0.0, "r2")
    (ask,) = tracker.due(180.0, TIMEOUT)
    assert tracker.answered(181.0, ask, ["r2", "someone-else"]) == []
    assert tracker.next_due(TIMEOUT) == 361.0
    assert {r.request_id for r in tracker.outstanding("h1")} == {"r1", "r2"}


def test_a_helper_that_lists_none_of_them_loses_every_one_at_once() -> None:
    tracker = StallTracker()
    lend(tracker, 0.0, "r1")
    lend(tracker, 0.0, "r2")
    lend(tracker, 0.0, "r3", helper="h2")
    asks = tracker.due(180.0, TIMEOUT)
    assert [a.helper_node_id for a in asks] == ["h1", "h2"]
    lost = tracker.answered(181.0, asks[0], ["unrelated"])
    assert sorted(r.request_id for r in lost) == ["r1", "r2"]
    assert {r.request_id for r in tracker.outstanding("h2")} == {"r3"}  # another helper is untouched


def test_a_helper_whose_build_cannot_answer_counts_as_busy() -> None:
    tracker = StallTracker()
    lend(tracker, 0.0, "r1")
    (ask,) = tracker.due(180.0, TIMEOUT)
    assert tracker.answered(181.0, ask, None) == []
    assert tracker.next_due(TIMEOUT) == 361.0


def test_requests_lent_while_the_question_is_out_are_not_reclaimed_with_it() -> None:
    tracker = StallTracker()
    lend(tracker, 0.0, "r1")
    (ask,) = tracker.due(180.0, TIMEOUT)
    lend(tracker, 180.5, "r-new")
    lost = tracker.answered(181.0, ask, [])
    assert [r.request_id for r in lost] == ["r1"]


def test_requests_that_finished_while_the_question_was_out_are_not_reclaimed() -> None:
    tracker = StallTracker()
    first = lend(tracker, 0.0, "r1")
    lend(tracker, 0.0, "r2")
    (ask,) = tracker.due(180.0, TIMEOUT)
    tracker.over(180.5, first)
    assert [r.request_id for r in tracker.answered(181.0, ask, [])] == ["r2"]


def test_the_borrowed_answer_is_read_by_request_id_and_a_malformed_one_is_refused() -> None:
    assert borrowed_ids({"borrowed": [{"request_id": "a", "state": "running"}, {"lane": "text"}]}) == ["a"]
    failed_with(Deferred.fromCoroutine(_raises(lambda: borrowed_ids({"nope": 1}))), HelperGone)


async def _raises(f: Any) -> Any:
    return f()


# -- the coordinator performs it --------------------------------------------------------------------------


@attrs.define
class HangingForwarder:
    """Sends that never answer until cancelled (a helper that has stalled)."""

    sent: list[Outbound] = attrs.Factory(list)
    pending: list[Deferred[tuple[int, bytes]]] = attrs.Factory(list)

    async def send(self, request: Any, out: Outbound) -> tuple[int, bytes]:
        self.sent.append(out)
        d: Deferred[tuple[int, bytes]] = Deferred()
        self.pending.append(d)
        return await d


@attrs.define
class AskingClient(FakeClient):
    gets: list[tuple[str, str]] = attrs.Factory(list)
    answer: Any = attrs.Factory(lambda: {"borrowed": []})

    def get_json(self, base: str, path: str, *, timeout: float | None = None) -> Deferred[Any]:
        self.gets.append((base, path))
        if isinstance(self.answer, Exception):
            return fail(self.answer)
        return succeed(self.answer)


def stalled_cluster(timeout: str = "3m") -> tuple[Cluster, HangingForwarder, AskingClient]:
    cluster = Cluster(settings=LendingSettings.from_texts({"offload_lent_stall_timeout": timeout}))
    forwarder = HangingForwarder()
    client = AskingClient()
    cluster.coordinator.forwarder = forwarder  # type: ignore[assignment]
    cluster.master.client = client
    cluster.master.status = {"s1": owner_status("s1", "A"), "s2": helper_status("s2", "H")}
    cluster.plan("tick")
    return cluster, forwarder, client


def relay_n(cluster: Cluster, n: int) -> list[Deferred[bytes]]:
    from routerd.lending.offload import RelayRequest
    from tests.unit.test_lending_coordinator import CHAT, make_call

    return [Deferred.fromCoroutine(cluster.coordinator.relay(
        FakeReply(), RelayRequest("text", "s1", "A", CHAT), make_call("A", f"req-{i}"),
        rewrite_to=None, returns_raise=False)) for i in range(n)]


def test_a_stalled_helper_that_no_longer_has_them_loses_every_lent_request_to_their_owners() -> None:
    cluster, forwarder, client = stalled_cluster()
    relays = relay_n(cluster, 2)
    cluster.clock.advance(179.0)
    assert client.gets == []
    cluster.clock.advance(1.0)
    assert client.gets == [("http://s2:1", BORROWED_PATH)]
    # both come back as returns (409 offload_returned at the relay route), so the owners serve them
    for d in relays:
        failed_with(d, CameBack)
    rows = cluster.rows(kind="dispatch", outcome="stall_reclaimed")
    assert sorted(r["request_id"] for r in rows) == ["req-0", "req-1"]
    assert all((r["owner_node_id"], r["owner_model_id"], r["helper_node_id"], r["helper_model_id"],
                r["lent_out"], r["wait_ms"]) == ("s1", "A", "s2", "H", 2, 180_000) for r in rows)
    assert all(d.called for d in forwarder.pending)  # the outgoing sends were cancelled
    assert cluster.coordinator.stall.tracker.next_due(180.0) is None


def test_a_helper_that_still_runs_them_keeps_them_and_is_asked_again_a_timeout_later() -> None:
    cluster, forwarder, client = stalled_cluster()
    relays = relay_n(cluster, 2)
    client.answer = {"borrowed": [{"request_id": "req-1", "state": "running"}]}
    cluster.clock.advance(180.0)
    assert len(client.gets) == 1
    assert not any(d.called for d in relays)
    cluster.clock.advance(179.0)
    assert len(client.gets) == 1
    cluster.clock.advance(1.0)
    assert len(client.gets) == 2
    assert cluster.rows(outcome="stall_reclaimed") == []
    forwarder.pending[0].callback((200, b"done"))
    assert fired(relays[0]) == b"done"


def test_a_helper_build_without_the_endpoint_counts_as_busy() -> None:
    cluster, _forwarder, client = stalled_cluster()
    relays = relay_n(cluster, 1)
    client.answer = RemoteError(404, "not_found", "not_found", "no such route")
    cluster.clock.advance(180.0)
    assert len(client.gets) == 1
    assert not relays[0].called
    assert cluster.rows(outcome="stall_reclaimed") == []


def test_a_helper_that_cannot_be_asked_loses_its_requests_with_reason_helper_unreachable() -> None:
    cluster, _forwarder, client = stalled_cluster()
    relays = relay_n(cluster, 1)
    client.answer = ClusterTimeout("no answer in 10 s")
    cluster.clock.advance(180.0)
    failed_with(relays[0], CameBack)
    assert [r["reason"] for r in cluster.rows(outcome="stall_reclaimed")] == ["helper_unreachable"]


def test_every_change_in_lent_requests_restarts_the_helpers_wait() -> None:
    cluster, forwarder, client = stalled_cluster()
    relay_n(cluster, 2)
    cluster.clock.advance(100.0)
    forwarder.pending[0].callback((200, b"done"))  # one finished: a change at +100 s
    cluster.clock.advance(179.0)
    assert client.gets == []
    cluster.clock.advance(1.0)
    assert len(client.gets) == 1


def test_the_stall_timeout_setting_applies_and_a_stopped_coordinator_asks_nothing() -> None:
    cluster, _forwarder, client = stalled_cluster("5s")
    relays = relay_n(cluster, 1)
    cluster.clock.advance(5.0)
    failed_with(relays[0], CameBack)
    cluster2, _f2, client2 = stalled_cluster("5s")
    relay_n(cluster2, 1)
    cluster2.coordinator.stop()
    cluster2.clock.advance(60.0)
    assert client2.gets == [] and cluster2.clock.getDelayedCalls() == []


def test_a_reclaimed_in_process_send_is_cancelled_when_the_master_itself_does_not_hold_it() -> None:
    from routerd.wire.lending import Endpoint, Link
    from tests.unit.test_lending_coordinator import MASTER

    link = Link(Endpoint("s1", "A"), Endpoint(MASTER, "H"), False, True)
    settings = LendingSettings.from_texts({"offload_lent_stall_timeout": "5s"})
    cluster = Cluster(links=(link,), settings=settings)
    served: list[Deferred[bytes]] = []

    def serve_borrowed(_reply: Any, _incoming: Any, _borrowed: Any) -> Deferred[bytes]:
        d: Deferred[bytes] = Deferred()
        served.append(d)
        return d

    cluster.coordinator.serve_borrowed = serve_borrowed
    cluster.master.status = {"s1": owner_status("s1", "A"), MASTER: helper_status(MASTER, "H")}
    cluster.plan("tick")
    (relay,) = relay_n(cluster, 1)
    cluster.clock.advance(5.0)
    failed_with(relay, CameBack)
    assert served[0].called  # nothing but the reclaim's cancel fires it
