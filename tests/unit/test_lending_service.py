"""LendingService on a fake clock: enrollment, the router queue, queue events, leases, lending,
returns, borrowed work on a helper, cancellation and settings (spec "Backlog lending" through
"A helper's own work", "Decision log").

No reactor: a ``task.Clock``, hand-fired fakes for the event and lend senders and for each
request's backend run, and a real ``DecisionLog`` over an in-memory store.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs
import pytest
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from routerd.catalog.model import Capabilities, ModelConfig
from routerd.config.keys import PriorityClass
from routerd.config.lending import LendingSettings
from routerd.errors import HTTPError
from routerd.lending.decisions import DecisionLog
from routerd.lending.links import LinkSet
from routerd.lending.offload import OFFLOAD_RETURNED, Borrowed, Returned
from routerd.lending.service import LendingService
from routerd.routing.call import Call
from routerd.routing.classify import Route, classify
from routerd.store.store import Store
from routerd.wire.lending import Costs, Endpoint, Lane, Lease, Link, TokenProfile, Trigger
from tests.support import FakeReply, fired

OWNER = "owner"
HELPER = "helper"
START = 1000.0  # the clock's reading when a harness is built (seconds)
CHAT = "/v1/chat/completions"


def chat_route() -> Route:
    route = classify("POST", CHAT)
    assert route is not None
    return route


def text_model(local_id: str) -> ModelConfig:
    return ModelConfig(local_id=local_id, filename=f"{local_id}.kcpps", path=f"/models/{local_id}.kcpps",
                       backend_mode="llama_sdcpp", capabilities=Capabilities(llm=True, context=4096),
                       config_hash=f"cfg-{local_id}")


MODEL_A = text_model("A")  # owner model on node "owner"
MODEL_H = text_model("H")  # helper model on node "helper"
MODEL_Z = text_model("Z")  # linked nowhere
LINK = Link(Endpoint(OWNER, "A"), Endpoint(HELPER, "H"), True, False)


def lease(slots: int = 2, *, ttl_ms: int = 30_000, owner_node: str = OWNER, owner_model: str = "A") -> Lease:
    return Lease(lane="text", owner_node_id=owner_node, owner_model_id=owner_model, helper_node_id=HELPER,
                 helper_model_id="H", load_helper_model=True, restore_helper_model=False,
                 helper_slots=slots, probe=False, ttl_ms=ttl_ms)


def make_call(request_id: str, model: str = "A", *, stream: bool = False) -> Call:
    parsed: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    if stream:
        parsed["stream"] = True
    return Call(reply=FakeReply(), route=chat_route(), path=CHAT,
                body=json.dumps(parsed).encode(), content_type="application/json", parsed=parsed,
                stream=stream, request_id=request_id, started=START, selector=model)


@attrs.define
class Event:
    lane: Lane
    model_id: str
    trigger: Trigger
    answer: Deferred[Lease | None]


@attrs.define
class Lent:
    request_id: str
    lease: Lease
    model_id: str
    answer: Deferred[bytes]


class Node:
    """One node's LendingService with hand-fired senders and per-request backend runs."""

    def __init__(self, node_id: str = OWNER, *, depth: int = 2, links: Sequence[Link] = (LINK,)) -> None:
        self.clock = Clock()
        self.clock.advance(START)
        self.log = DecisionLog(Store.open_sync(clock=self.clock), self.clock, node_id)
        settings = LendingSettings(scheduling_backend_depth=depth)
        self.busy = False
        self.settings_seen: list[LendingSettings] = []
        self.lend_with: Callable[[Call, Lease, str], Awaitable[bytes]] = self._send_lent
        self.service = LendingService(node_id=node_id, settings=settings, clock=self.clock, transport=self,
                                      decisions=self.log, own_busy=lambda: self.busy,
                                      on_settings=(self.settings_seen.append,), run_local=self._run_local)
        self.service.install_links(LinkSet.build("image", ()), LinkSet.build("text", links))
        self.events: list[Event] = []
        self.lent: list[Lent] = []
        self.local_calls: list[str] = []  # run_local invocations, in order
        self.running: dict[str, Deferred[bytes]] = {}
        self.answers: dict[str, list[bytes | Failure]] = {}
        self.serving: dict[str, Deferred[bytes]] = {}
        self.answering: dict[str, Callable[[], None] | None] = {}

    @property
    def queue(self) -> Any:
        return self.service.queues["text"]

    # the LendingTransport this node's service is built with
    async def event(self, lane: Lane, model_id: str, trigger: Trigger) -> Lease | None:
        return await self._send_event(lane, model_id, trigger)

    async def lend(self, call: Call, lent_lease: Lease, model_id: str, *,
                   answering: Callable[[], None] | None = None) -> bytes:
        self.answering[call.request_id] = answering
        return await self.lend_with(call, lent_lease, model_id)

    async def push(self) -> None:
        return None

    async def _send_event(self, lane: Lane, model_id: str, trigger: Trigger) -> Lease | None:
        d: Deferred[Lease | None] = Deferred()
        self.events.append(Event(lane, model_id, trigger, d))
        return await d

    async def _send_lent(self, call: Call, lent_lease: Lease, model_id: str) -> bytes:
        d: Deferred[bytes] = Deferred()
        self.lent.append(Lent(call.request_id, lent_lease, model_id, d))
        return await d

    def serve(self, rid: str, model: ModelConfig = MODEL_A, borrowed: Borrowed | None = None,
              *, stream: bool = False, priority: PriorityClass = "standard",
              key_name: str = "") -> Deferred[bytes]:
        call = make_call(rid, model.local_id, stream=stream)
        call.priority, call.key_name = priority, key_name

        d = self.service.serve(call, model, "text", borrowed, public_id=model.local_id)
        got = self.answers.setdefault(rid, [])
        d.addBoth(lambda result: got.append(result))
        self.serving[rid] = d
        return d

    def _run_local(self, call: Call, _model: ModelConfig, _public_id: str) -> Deferred[bytes]:
        rid = call.request_id
        d: Deferred[bytes] = Deferred()
        self.local_calls.append(rid)
        self.running[rid] = d
        return d

    def serve_many(self, n: int, prefix: str = "r", model: ModelConfig = MODEL_A) -> list[str]:
        rids = [f"{prefix}{i}" for i in range(n)]
        for rid in rids:
            self.serve(rid, model)
        return rids

    def finish_local(self, rid: str) -> None:
        self.running.pop(rid).callback(f"local {rid}".encode())

    def answer(self, index: int, answer: Lease | None) -> None:
        self.events[index].answer.callback(answer)

    def lent_ids(self) -> list[str]:
        return [lent.request_id for lent in self.lent]

    def triggers(self) -> list[str]:
        return [event.trigger for event in self.events]

    def rows(self, outcome: str | None = None) -> list[dict[str, Any]]:
        """Decision rows written so far, oldest first."""
        newest_first: list[dict[str, Any]] = fired(self.log.query(outcome=outcome))
        return newest_first[::-1]

    def answered(self, rid: str) -> bytes | Failure:
        got = self.answers[rid]
        assert len(got) == 1, f"{rid} answered {len(got)} times: {got}"
        return got[0]


def helper_node(depth: int = 2) -> Node:
    return Node(HELPER, depth=depth)


BORROWED = Borrowed(load_allowed=True, restore=False)


def returned_409(result: bytes | Failure) -> HTTPError:
    assert isinstance(result, Failure), result
    error = result.value
    assert isinstance(error, HTTPError)
    assert (error.status, error.code, error.type) == (409, OFFLOAD_RETURNED, OFFLOAD_RETURNED)
    return error


# -- enrollment ---------------------------------------------------------------------------------------


def test_install_links_enrolls_owners_and_helpers_but_not_unlinked_models() -> None:
    owner, helper = Node(OWNER), helper_node()
    assert owner.service.enrolled("text", "A") and owner.queue.is_owner("A")
    assert helper.service.enrolled("text", "H") and not helper.queue.is_owner("H")  # helper-only
    assert not owner.service.enrolled("text", "Z")
    assert not owner.service.enrolled("text", "H")  # the helper's model lives on another node
    assert not owner.service.enrolled("image", "A")  # links are per lane
    assert not owner.service.enrolled(None, "A")  # a route with no lane is never queued


def test_install_links_replaces_enrollment_for_the_next_request() -> None:
    node = Node(OWNER)
    node.service.install_links(LinkSet.build("image", [LINK]), LinkSet.build("text", ()))
    assert node.service.enrolled("image", "A")
    assert not node.service.enrolled("text", "A")


def test_an_unlinked_model_is_untouched_even_on_a_node_with_links() -> None:
    node = Node(OWNER)
    assert not node.service.enrolled("text", "Z")
    assert len(node.queue) == 0 and node.events == [] and node.rows() == []


# -- the ten-request flow -----------------------------------------------------------------------------


def test_ten_arrivals_with_depth_two_admit_two_and_hold_eight() -> None:
    node = Node(depth=2)
    node.serve_many(10)
    assert node.local_calls == ["r0", "r1"]
    assert [e.request_id for e in node.queue.pending()] == [f"r{i}" for i in range(2, 10)]
    held = node.service.held_requests()
    assert len(held) == 8 and {h["state"] for h in held} == {"queued"}
    # one event in flight, the other nine coalesced behind it
    assert node.triggers() == ["enqueued"]
    assert node.lent == []  # nothing is lent before the master answers


@pytest.mark.parametrize("slots", [1, 2])
def test_a_lease_lends_exactly_its_slot_count_of_held_requests(slots: int) -> None:
    node = Node(depth=2)
    node.serve_many(10)
    granted = lease(slots)
    node.answer(0, granted)
    assert node.lent_ids() == [f"r{i}" for i in range(2, 2 + slots)]  # oldest held first
    assert all(lent.lease == granted and lent.model_id == "A" for lent in node.lent)
    assert node.local_calls == ["r0", "r1"]  # the two in A's pipe never move
    assert len(node.queue.pending()) == 8 - slots
    assert [r["outcome"] for r in node.rows()] == ["lease_updated"] + ["lent"] * slots


def test_lending_takes_batch_work_first_and_its_row_names_class_and_key() -> None:
    """The owner lends what it would serve last (before, the oldest: ``chat``); the
    decision row names the class and the key's name."""
    node = Node(depth=2)
    node.serve_many(2)
    node.serve("chat", priority="interactive", key_name="alice")
    node.serve("job", priority="batch", key_name="nightly")
    node.answer(0, lease(1))
    assert node.lent_ids() == ["job"]
    lent_row = next(r for r in node.rows() if r["outcome"] == "lent")
    assert (lent_row["priority"], lent_row["key_name"]) == ("batch", "nightly")


def test_ten_request_flow_tops_up_the_owner_and_lends_only_on_answers() -> None:
    node = Node(depth=2)
    node.serve_many(10)
    granted = lease(2)
    node.answer(0, granted)
    assert node.lent_ids() == ["r2", "r3"]
    assert node.triggers() == ["enqueued", "enqueued"]  # the coalesced follow-up went out

    node.answer(1, granted)  # the same lease again: both slots are busy, nothing more is lent
    assert node.lent_ids() == ["r2", "r3"]

    node.finish_local("r0")  # the owner is topped back up from the held requests
    assert node.answered("r0") == b"local r0"
    assert node.local_calls == ["r0", "r1", "r4"]
    assert node.triggers()[-1] == "completed"
    node.answer(2, granted)
    assert node.lent_ids() == ["r2", "r3"]

    node.lent[0].answer.callback(b"from helper")  # a lent job finished ...
    assert node.answered("r2") == b"from helper"
    assert node.triggers()[-1] == "borrowed_completed"
    assert node.lent_ids() == ["r2", "r3"]  # ... but nothing more is lent until the master answers
    node.answer(3, granted)
    assert node.lent_ids() == ["r2", "r3", "r5"]
    assert node.queue.lent_count("A") == 2  # held never exceeds the lease's slots
    assert node.local_calls == ["r0", "r1", "r4"]  # the helper's finish does not admit locally


def test_each_finish_reports_completed_or_borrowed_completed_while_work_remains() -> None:
    node = Node(depth=1)
    node.serve_many(4)  # r0 admitted at once (nothing waits: no event), r1..r3 wait
    node.answer(0, lease(1))  # r1 lent, r2 r3 held
    node.answer(1, lease(1))  # the coalesced "enqueued"
    assert node.triggers() == ["enqueued", "enqueued"]
    node.finish_local("r0")  # r2 admitted, r3 still waits
    assert node.triggers() == ["enqueued", "enqueued", "completed"]
    node.answer(2, lease(1))
    node.lent[0].answer.callback(b"ok")  # r3 still waits
    assert node.triggers() == ["enqueued", "enqueued", "completed", "borrowed_completed"]


def test_no_event_is_sent_once_nothing_of_the_owners_native_work_waits_or_is_lent() -> None:
    """Reference §3.3: an event goes out only while the owner model has native work waiting in the
    router or requests lent out; otherwise there is nothing a plan could lend."""
    node = Node(depth=1)
    node.serve("r0")  # admitted at once: nothing waits, no event
    assert node.triggers() == []
    node.serve("r1")
    assert node.triggers() == ["enqueued"]
    node.answer(0, lease(1))  # r1 lent
    node.finish_local("r0")  # r1 is still lent out: worth a plan
    assert node.triggers() == ["enqueued", "completed"]
    node.answer(1, lease(1))
    node.lent[0].answer.callback(b"ok")  # the last lent request: nothing waits or is lent now
    assert node.answered("r1") == b"ok"
    assert node.triggers() == ["enqueued", "completed"]
    node.serve("r2")  # admitted at once again
    node.finish_local("r2")  # the last own job completed with nothing left
    assert node.triggers() == ["enqueued", "completed"]


def test_a_queued_follow_up_event_is_dropped_when_no_work_remains_by_its_turn() -> None:
    node = Node(depth=1)
    node.serve_many(2)  # r0 admitted, r1 waits: "enqueued" in flight
    node.service.report("text", "A", "completed")  # queued behind it
    node.serving["r1"].cancel()  # the waiting client goes away ...
    node.finish_local("r0")  # ... and the owner finishes: nothing waits or is lent
    node.answer(0, None)
    assert node.triggers() == ["enqueued"]


def test_a_lease_answer_with_slots_one_lends_one_even_with_a_deep_backlog() -> None:
    node = Node(depth=2)
    node.serve_many(10)
    node.answer(0, lease(1))
    node.answer(1, lease(1))
    assert node.lent_ids() == ["r2"]


# -- a lent request that comes back -------------------------------------------------------------------


def test_a_returned_request_goes_to_the_head_is_never_lent_again_and_is_served_locally_once() -> None:
    node = Node(depth=2)
    node.serve_many(5)  # r0, r1 admitted; r2, r3, r4 held
    node.answer(0, lease(1))
    assert node.lent_ids() == ["r2"]
    first_arrival = node.queue.entry("r2").arrived_ms

    node.clock.advance(5)
    node.lent[0].answer.errback(Failure(Returned("409 offload_returned")))
    assert [e.request_id for e in node.queue.pending()] == ["r2", "r3", "r4"]  # back at the head
    entry = node.queue.entry("r2")
    assert entry.arrived_ms == first_arrival and entry.returned
    listed = {h["request_id"]: h for h in node.service.held_requests()}
    assert listed["r2"]["state"] == "queued" and listed["r2"]["waiting_ms"] == 5000
    assert [r["outcome"] for r in node.rows("returned")] == ["returned"]

    node.answer(1, lease(2))  # room for two: r2 is skipped, r3 and r4 go
    assert node.lent_ids() == ["r2", "r3", "r4"]
    assert [e.request_id for e in node.queue.pending()] == ["r2"]

    node.finish_local("r0")  # the returned request is the next one the owner runs
    assert node.local_calls == ["r0", "r1", "r2"]
    node.finish_local("r2")
    assert node.answered("r2") == b"local r2"  # exactly one answer, from the owner
    assert node.lent_ids().count("r2") == 1 and node.local_calls.count("r2") == 1
    assert "r2" not in node.queue


def test_a_request_returned_at_once_by_the_sender_goes_back_and_runs_locally() -> None:
    node = Node(depth=1)
    node.serve_many(3)  # r0 admitted; r1, r2 held

    async def bounce(call: Call, lent_lease: Lease, model_id: str) -> bytes:
        node.lent.append(Lent(call.request_id, lent_lease, model_id, Deferred()))
        raise Returned("no live lease")

    node.lend_with = bounce
    node.answer(0, lease(2))
    assert node.lent_ids() == ["r1", "r2"]
    assert sorted(e.request_id for e in node.queue.pending()) == ["r1", "r2"]
    assert node.queue.lent_count("A") == 0
    node.finish_local("r0")
    node.finish_local(node.local_calls[-1])
    node.finish_local(node.local_calls[-1])
    assert sorted(node.local_calls) == ["r0", "r1", "r2"]
    assert node.answered("r1") == b"local r1" and node.answered("r2") == b"local r2"
    assert len(node.queue) == 0


def test_a_lent_request_whose_sender_fails_unexpectedly_does_not_stay_lent() -> None:
    node = Node(depth=2)
    node.serve_many(3)  # r2 held
    node.answer(0, lease(1))
    assert node.lent_ids() == ["r2"]
    node.lent[0].answer.errback(Failure(ConnectionError("helper stream broke mid-answer")))
    assert isinstance(node.answered("r2"), Failure)  # the client gets the error
    # the request is over: nothing may still count against the lease's slots
    assert "r2" not in node.queue
    assert node.queue.lent_count("A") == 0


# -- leases: cleared, refused, expired ----------------------------------------------------------------


def test_an_answer_with_no_lease_clears_a_held_lease() -> None:
    node = Node()
    node.serve_many(4)  # r2's "enqueued" in flight, r3's coalesced behind it
    node.answer(0, lease(1))
    assert node.service.live_lease("text", "A") == lease(1)
    node.answer(1, None)
    assert node.service.live_lease("text", "A") is None
    cleared = node.rows("lease_cleared")
    assert len(cleared) == 1
    assert cleared[0]["owner_model_id"] == "A" and cleared[0]["trigger"] == "enqueued"


def test_an_answer_with_no_lease_and_none_held_writes_nothing() -> None:
    node = Node()
    node.service.receive_lease(None, "text", "A", "completed")
    assert node.rows() == []


def test_a_lease_for_a_model_this_node_does_not_own_is_refused() -> None:
    node = Node()
    node.serve_many(4)
    node.service.receive_lease(lease(2, owner_model="Z"), "text", "Z", "grant")
    assert node.lent == []
    refused = node.rows("lease_refused")
    assert len(refused) == 1
    assert refused[0]["reason"] == "not_an_owner" and refused[0]["owner_model_id"] == "Z"


def test_a_lease_naming_another_owner_node_is_refused() -> None:
    node = Node()
    node.serve_many(4)
    node.service.receive_lease(lease(2, owner_node="elsewhere"), "text", "A", "grant")
    assert node.lent == [] and node.service.live_lease("text", "A") is None
    assert [r["reason"] for r in node.rows("lease_refused")] == ["not_an_owner"]


def test_a_helper_only_model_never_lends_and_refuses_a_lease_naming_it() -> None:
    node = helper_node(depth=1)
    node.serve_many(4, model=MODEL_H)  # its own requests: queued, never reported
    assert node.events == []
    helper_lease = Lease(lane="text", owner_node_id=HELPER, owner_model_id="H", helper_node_id=OWNER,
                         helper_model_id="A", load_helper_model=True, restore_helper_model=False,
                         helper_slots=2, probe=False, ttl_ms=30_000)
    node.service.receive_lease(helper_lease, "text", "H", "grant")
    assert node.lent == [] and node.service.live_lease("text", "H") is None
    assert [r["reason"] for r in node.rows("lease_refused")] == ["not_an_owner"]


def test_a_lease_expires_on_the_owners_clock() -> None:
    node = Node()
    node.clock.advance(500)  # the owner's clock, whatever the master's says
    node.service.receive_lease(lease(1, ttl_ms=30_000), "text", "A", "grant")
    node.clock.advance(29.999)
    assert node.service.live_lease("text", "A") == lease(1, ttl_ms=30_000)
    node.clock.advance(0.001)
    assert node.service.live_lease("text", "A") is None


def test_an_expired_lease_lends_nothing() -> None:
    node = Node()
    node.serve_many(4)
    node.service.receive_lease(lease(2, ttl_ms=0), "text", "A", "grant")  # already over on arrival
    assert node.service.live_lease("text", "A") is None
    assert node.lent == []
    assert len(node.queue.pending()) == 2


# -- coalescing ---------------------------------------------------------------------------------------


def test_a_burst_while_an_event_is_in_flight_sends_exactly_one_more_with_the_latest_trigger() -> None:
    node = Node()
    node.serve_many(3)  # two admitted, r2 waits: its "enqueued" is in flight
    burst: list[Trigger] = ["completed", "enqueued", "completed", "enqueued", "borrowed_completed"]
    for trigger in burst:
        node.service.report("text", "A", trigger)
    assert node.triggers() == ["enqueued"]
    node.answer(0, None)
    assert node.triggers() == ["enqueued", "borrowed_completed"]
    node.answer(1, None)
    assert len(node.events) == 2


def test_a_failed_event_does_not_block_the_queued_one() -> None:
    node = Node()
    node.serve_many(3)  # r2 waits: "enqueued" in flight
    node.service.report("text", "A", "completed")
    node.events[0].answer.errback(Failure(ConnectionError("master away")))
    assert node.triggers() == ["enqueued", "completed"]
    node.answer(1, None)
    node.service.report("text", "A", "enqueued")  # nothing in flight: goes out at once
    assert len(node.events) == 3


def test_events_of_a_model_that_is_not_an_owner_are_never_reported() -> None:
    node = helper_node()
    node.service.report("text", "H", "enqueued")
    node.service.report("text", "Z", "enqueued")
    assert node.events == []


# -- borrowed work on a helper ------------------------------------------------------------------------


def test_borrowed_work_is_accepted_when_the_helper_is_idle() -> None:
    node = helper_node()
    node.serve("b0", MODEL_H, BORROWED)
    assert node.local_calls == ["b0"]
    node.finish_local("b0")
    assert node.answered("b0") == b"local b0"
    assert node.events == [] and len(node.queue) == 0


def test_borrowed_work_is_handed_back_when_the_node_is_busy_with_its_own_work() -> None:
    node = helper_node()
    node.busy = True
    node.serve("b0", MODEL_H, BORROWED)
    returned_409(node.answered("b0"))
    assert node.local_calls == [] and len(node.queue) == 0
    rows = node.rows("borrowed_returned")
    assert [(r["kind"], r["reason"], r["request_id"]) for r in rows] == [
        ("helper", "helper_busy_on_arrival", "b0")]
    assert node.service.lane_statuses()["text"].accepting_borrowed is False


def test_borrowed_work_is_handed_back_while_native_work_is_in_the_lane() -> None:
    node = helper_node()
    node.serve("n0", MODEL_H)
    assert node.service.lane_statuses()["text"].accepting_borrowed is False
    node.serve("b0", MODEL_H, BORROWED)
    returned_409(node.answered("b0"))
    assert node.local_calls == ["n0"]
    node.finish_local("n0")
    assert node.service.lane_statuses()["text"].accepting_borrowed is True


def test_an_own_request_returns_waiting_borrowed_work_and_admitted_borrowed_work_finishes() -> None:
    node = helper_node(depth=2)
    for rid in ("b0", "b1", "b2", "b3"):
        node.serve(rid, MODEL_H, BORROWED)
    assert node.local_calls == ["b0", "b1"]

    node.serve("n0", MODEL_H)
    returned_409(node.answered("b2"))
    returned_409(node.answered("b3"))
    rows = node.rows("borrowed_returned")
    assert [(r["request_id"], r["reason"]) for r in rows] == [("b2", "own_work_arrived"),
                                                              ("b3", "own_work_arrived")]
    assert node.local_calls == ["b0", "b1"]  # n0 waits behind the two admitted borrowed jobs

    node.clock.advance(2)
    node.finish_local("b0")
    assert node.answered("b0") == b"local b0"
    assert node.local_calls == ["b0", "b1", "n0"]
    waited = node.rows("native_waited_behind_borrowed")
    assert len(waited) == 1
    assert waited[0]["kind"] == "helper" and waited[0]["request_id"] == "n0"
    assert waited[0]["borrowed_ahead"] == 2 and waited[0]["wait_ms"] == 2000

    node.finish_local("b1")
    assert node.answered("b1") == b"local b1"
    node.finish_local("n0")
    assert node.answered("n0") == b"local n0"
    assert len(node.queue) == 0
    assert node.events == []  # a helper-only model's own work is never reported


def test_borrowed_work_is_listed_with_its_owner_until_it_ends() -> None:
    node = helper_node(depth=1)
    owner_info = Borrowed(load_allowed=True, restore=False, owner_node_id=OWNER, owner_model_id="A")
    node.serve("b0", MODEL_H, owner_info)
    node.clock.advance(1)
    node.serve("b1", MODEL_H, owner_info)
    listed = {b["request_id"]: b for b in node.service.borrowed_requests()}
    assert listed["b0"] == {"request_id": "b0", "lane": "text", "owner_node_id": OWNER,
                            "owner_model_id": "A", "started_ms": 1_000_000, "state": "running"}
    assert listed["b1"]["state"] == "queued" and listed["b1"]["started_ms"] == 1_001_000
    node.serve("n0", MODEL_H)  # b1 is handed back
    node.finish_local("b0")
    assert node.service.borrowed_requests() == []


def test_an_own_request_with_no_borrowed_work_ahead_writes_no_wait_row() -> None:
    node = helper_node()
    node.serve("n0", MODEL_H)
    node.serve("n1", MODEL_H)
    node.serve("n2", MODEL_H)
    node.finish_local("n0")
    assert node.rows("native_waited_behind_borrowed") == []


# -- cancellation ---------------------------------------------------------------------------------------


def test_cancelling_a_held_request_frees_its_queue_entry() -> None:
    node = Node(depth=1)
    node.serve_many(3)  # r0 admitted; r1, r2 held
    node.serving["r1"].cancel()
    cancelled = node.answered("r1")
    assert isinstance(cancelled, Failure) and cancelled.check(CancelledError)
    assert "r1" not in node.queue
    node.finish_local("r0")
    assert node.local_calls == ["r0", "r2"]  # the cancelled one is skipped
    node.finish_local("r2")
    assert len(node.queue) == 0
    assert node.service._waiters == {}


def test_cancelling_a_lent_request_frees_its_slot() -> None:
    node = Node(depth=1)
    node.serve_many(3)
    node.answer(0, lease(1))
    assert node.lent_ids() == ["r1"]
    node.serving["r1"].cancel()
    cancelled = node.answered("r1")
    assert isinstance(cancelled, Failure) and cancelled.check(CancelledError)
    assert "r1" not in node.queue and node.queue.lent_count("A") == 0


def test_cancelling_a_request_in_the_backend_frees_its_entry_and_admits_the_next() -> None:
    node = Node(depth=1)
    node.serve_many(2)
    node.serving["r0"].cancel()
    assert "r0" not in node.queue
    assert node.local_calls == ["r0", "r1"]


# -- settings -----------------------------------------------------------------------------------------


def test_apply_settings_changes_the_depth_at_once() -> None:
    node = Node(depth=1)
    node.serve_many(5)
    assert node.local_calls == ["r0"]
    seen = node.settings_seen
    raised = LendingSettings(scheduling_backend_depth=3)
    node.service.apply_settings(raised)
    assert node.local_calls == ["r0", "r1", "r2"]
    assert node.service.settings == raised and seen == [raised]


def test_a_lower_depth_recalls_nothing_and_admits_only_below_it() -> None:
    node = Node(depth=3)
    node.serve_many(5)
    node.service.apply_settings(LendingSettings(scheduling_backend_depth=1))
    assert node.local_calls == ["r0", "r1", "r2"]
    node.finish_local("r0")
    node.finish_local("r1")
    assert node.local_calls == ["r0", "r1", "r2"]
    node.finish_local("r2")
    assert node.local_calls == ["r0", "r1", "r2", "r3"]


# -- streaming ----------------------------------------------------------------------------------------


def test_a_streaming_request_is_queued_but_never_lent() -> None:
    node = Node(depth=1)
    node.serve("r0")
    node.serve("s1", stream=True)
    node.serve("r2")
    node.answer(0, lease(2))
    assert node.lent_ids() == ["r2"]
    node.finish_local("r0")
    assert node.local_calls == ["r0", "s1"]


# -- size estimates ---------------------------------------------------------------------------------


def body_call(path: str, parsed: dict[str, Any]) -> Call:
    route = classify("POST", path)
    assert route is not None
    return Call(reply=FakeReply(), route=route, path=path, body=json.dumps(parsed).encode(),
                content_type="application/json", parsed=parsed, stream=False, request_id="x",
                started=START, selector="A")


@pytest.mark.parametrize(("path", "limit_fields"), [
    ("/api/chat", {"options": {"num_predict": 77, "temperature": 0.2}}),  # Ollama
    ("/api/generate", {"options": {"num_predict": 77}}),
    ("/v1/chat/completions", {"max_output_tokens": 77}),  # Responses-API style
    ("/v1/chat/completions", {"max_tokens": 77, "options": {"num_predict": 5}}),  # the first key wins
    ("/v1/completions", {"max_completion_tokens": 77}),
])
def test_the_text_estimate_takes_the_clients_output_limit_in_every_dialect(
        path: str, limit_fields: dict[str, Any]) -> None:
    node = Node()
    node.service.update_costs(Costs(tokens=(TokenProfile("A", 4.0, 300, 5),)))
    parsed = {"model": "A", "messages": [{"role": "user", "content": "hi"}], **limit_fields}
    call = body_call(path, parsed)
    prompt = -(-len(call.body) // 4)
    assert node.service.work_hint(call, MODEL_A, "text") == ((float(prompt), 77.0), prompt + 77)


def test_without_a_client_limit_the_text_estimate_reserves_the_measured_output() -> None:
    node = Node()
    node.service.update_costs(Costs(tokens=(TokenProfile("A", 4.0, 300, 5),)))
    call = body_call("/api/chat", {"model": "A", "messages": [], "options": {"num_predict": -1}})
    prompt = -(-len(call.body) // 4)
    reserve = max(300, node.service.settings.scheduling_context_reserve)
    expected = ((float(prompt), float(reserve)), prompt + reserve)
    assert node.service.work_hint(call, MODEL_A, "text") == expected


def test_the_backend_is_topped_back_up_when_a_higher_class_window_lapses_not_at_the_next_completion() -> None:
    """Issue 31 row 9: while an interactive request has arrived within the last ``queue.aging``,
    batch work goes to the backend one at a time (the second-place class rule); when that window
    lapses the backend's second place is filled at that instant, on the queue's own timer.  Before,
    nothing woke admission then: the place stayed empty until the running job ended (here 30 s on)."""
    node = Node(depth=2, links=())
    node.serve("i0", MODEL_Z, priority="interactive", key_name="chat")
    node.clock.advance(0.1)
    node.running["i0"].callback(b"done")
    for n in range(3):
        node.serve(f"b{n}", MODEL_Z, priority="batch", key_name="bulk")
    assert node.local_calls == ["i0", "b0"]  # b1 kept out of the backend's waiting place
    node.clock.advance(29.8)
    assert node.local_calls == ["i0", "b0"]  # the interactive window (30 s from i0) is still open
    node.clock.advance(0.2)
    assert node.local_calls == ["i0", "b0", "b1"]  # b0 still runs: the place filled on the timer
    node.running["b0"].callback(b"done")
    assert node.local_calls == ["i0", "b0", "b1", "b2"]


def test_with_a_fit_the_place_behind_a_running_job_opens_in_its_last_fifth_whatever_the_class() -> None:
    """Issue 31 row 9: with a higher class about, the second-place class rule kept batch work out of
    the backend's waiting place for the whole running job, so the backend idled a round trip between
    jobs (the owner alone, a flood with an interactive request every 3 jobs: 1.35-1.40x the makespan
    of the same requests in one class on this loaded machine).  With a cost fit, the place opens for
    the running job's last fifth (predicted 1 s here: at 0.8 s) and the backend has its next job in
    hand as it finishes."""
    from routerd.wire.lending import ModelCost

    node = Node(depth=2, links=())
    node.service.update_costs(Costs(models=(ModelCost("Z", "llm", 1000.0, (), 5),)))
    node.serve("i0", MODEL_Z, priority="interactive", key_name="chat")
    node.clock.advance(0.1)
    node.running["i0"].callback(b"done")
    for n in range(3):
        node.serve(f"b{n}", MODEL_Z, priority="batch", key_name="bulk")
    assert node.local_calls == ["i0", "b0"]
    node.clock.advance(0.79)
    assert node.local_calls == ["i0", "b0"]  # b0 (1 s predicted) has more than a fifth to go
    node.clock.advance(0.01)
    assert node.local_calls == ["i0", "b0", "b1"]  # its last fifth: b1 waits in the backend behind it
