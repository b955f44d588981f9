"""The owner's clock-driven rules on a LendingService: holding a request for a faster helper
(reference §3.6, scenarios 15-21) and the lent cut-off (§3.7, scenario 48).

Same harness as ``test_lending_service``: a ``task.Clock``, hand-fired event answers, lent sends
and backend runs, and a real ``DecisionLog``.
"""

from __future__ import annotations

import attrs
from twisted.internet.defer import CancelledError, Deferred
from twisted.python.failure import Failure

from routerd.config.lending import LendingSettings
from routerd.lending.offload import Returned
from routerd.routing.call import Call
from routerd.wire.lending import Lease
from tests.unit.test_lending_service import START, Node, lease

S = 1000  # ms


def measured(*, job: float = 29 * S, switch: float = 6 * S, service: float = 13 * S, slots: int = 1,
             probe: bool = False, ttl_ms: int = 300_000) -> Lease:
    return attrs.evolve(lease(slots, ttl_ms=ttl_ms), probe=probe, owner_job_ms=job, helper_switch_ms=switch,
                        helper_service_ms=service)


def at(node: Node, seconds: float) -> None:
    """Advance the node's clock to START + ``seconds``."""
    node.clock.advance(START + seconds - node.clock.seconds())


def reference_burst(grant: Lease | None = None) -> Node:
    """Four requests at 0 (r0, r1 in the backend); a 1-slot lease at +5 s lends r2; at +29 s the
    owner finishes r0 and r3 is judged for the second slot."""
    node = Node()
    node.serve_many(4)
    at(node, 5)
    node.answer(0, grant if grant is not None else measured())
    assert node.lent_ids() == ["r2"]
    at(node, 29)
    node.finish_local("r0")
    return node


def state_of(node: Node, rid: str) -> str:
    return next(h["state"] for h in node.service.held_requests() if h["request_id"] == rid)


# -- hold -------------------------------------------------------------------------------------------


def test_the_reference_burst_keeps_request_three_for_the_helper_and_logs_one_row() -> None:
    node = reference_burst()
    assert "r3" not in node.local_calls
    assert state_of(node, "r3") == "held"
    rows = node.rows("held_for_helper")
    assert len(rows) == 1
    row = rows[0]
    assert (row["reason"], row["request_id"], row["owner_job_ms"]) == ("helper_finishes_sooner", "r3", 29 * S)
    assert (row["keep_ms"], row["switch_ms"], row["service_ms"]) == (58 * S, 6 * S, 13 * S)
    assert (row["slots"], row["lent_out"], row["wait_ms"]) == (1, 1, 29 * S)
    assert (row["helper_node_id"], row["helper_model_id"]) == ("helper", "H")
    node.service.queues["text"].pump(node.clock.seconds() * 1000)  # judged again: no second row
    assert len(node.rows("held_for_helper")) == 1


def test_when_the_lent_job_finishes_and_the_master_regrants_the_held_request_is_lent() -> None:
    node = reference_burst()
    at(node, 30)
    node.lent[0].answer.callback(b"helper r2")
    assert "r3" not in node.local_calls  # still held: no backend slot came free
    node.answer(len(node.events) - 1, measured())
    assert node.lent_ids() == ["r2", "r3"]
    assert "r3" not in node.local_calls


def test_with_mixed_classes_the_request_held_for_the_helper_is_the_one_the_next_lease_lends() -> None:
    """An interactive request is the head of the serving order, so it is the one held for the faster
    helper; a batch request waits behind it.  When the helper's slot frees and the master regrants,
    the held interactive request is lent (lending's lowest-class-first order took the batch request
    before, and the interactive one stayed held for a helper busy with other work)."""
    node = Node()
    node.serve_many(3)
    at(node, 5)
    node.answer(0, measured())
    assert node.lent_ids() == ["r2"]
    at(node, 6)
    node.serve("job", priority="batch")
    node.serve("chat", priority="interactive")
    at(node, 29)
    node.finish_local("r0")
    assert state_of(node, "chat") == "held" and state_of(node, "job") == "queued"
    assert [r["request_id"] for r in node.rows("held_for_helper")] == ["chat"]
    at(node, 30)
    node.lent[0].answer.callback(b"helper r2")
    node.answer(len(node.events) - 1, measured())
    assert node.lent_ids() == ["r2", "chat"]
    assert "chat" not in node.local_calls


def test_an_answer_without_a_lease_admits_the_held_request() -> None:
    node = reference_burst()
    node.answer(len(node.events) - 1, None)
    assert node.rows("lease_cleared")
    assert node.local_calls[-1] == "r3"


def test_when_the_owner_would_idle_the_held_request_goes_to_the_owner() -> None:
    node = reference_burst()
    at(node, 40)
    node.finish_local("r1")
    assert node.local_calls[-1] == "r3"


def test_a_slow_helper_probe_or_unmeasured_lease_never_holds() -> None:
    for grant in (measured(service=60 * S), measured(probe=True), measured(job=0)):
        node = reference_burst(grant)
        assert node.local_calls[-1] == "r3"
        assert node.rows("held_for_helper") == []


def test_with_the_setting_off_nothing_is_held_and_switching_it_off_releases_at_once() -> None:
    node = Node()
    node.service.apply_settings(LendingSettings(offload_hold_for_faster_helper=False))
    node.serve_many(4)
    at(node, 5)
    node.answer(0, measured())
    at(node, 29)
    node.finish_local("r0")
    assert node.local_calls[-1] == "r3"

    node = reference_burst()
    assert "r3" not in node.local_calls
    node.service.apply_settings(LendingSettings(offload_hold_for_faster_helper=False))
    assert node.local_calls[-1] == "r3"


def test_the_hold_releases_itself_when_the_lent_request_overruns_without_another_event() -> None:
    """Overrun = predicted finish plus one owner job (spec; issue 24): lent at 5 s + switch 6 s +
    13 s service + 29 s = 53 s.  At 37 s (the reference's switch + 2 x service) the helper is one
    service late: r3 stays held (it was released there before), and is released at 53 s."""
    node = reference_burst()
    events = len(node.events)
    at(node, 37.001)
    assert "r3" not in node.local_calls  # one service late: still held for the helper
    at(node, 53)
    assert "r3" not in node.local_calls
    at(node, 53.001)
    assert node.local_calls[-1] == "r3"
    assert len(node.events) == events  # released by the owner's own alarm, not by an event


def test_the_hold_releases_itself_when_the_lease_expires() -> None:
    node = reference_burst(measured(ttl_ms=31_000))  # granted at +5 s: expires at +36 s
    at(node, 35.999)
    assert "r3" not in node.local_calls
    at(node, 36)
    assert node.local_calls[-1] == "r3"


def test_a_request_behind_a_full_pipe_is_queued_and_a_held_one_keeps_its_first_arrival() -> None:
    node = Node()
    node.serve_many(5)
    assert state_of(node, "r2") == "queued"
    at(node, 5)
    node.answer(0, measured())
    at(node, 29)
    node.finish_local("r0")
    listing = {h["request_id"]: h for h in node.service.held_requests()}
    assert listing["r3"]["state"] == "held" and listing["r4"]["state"] == "queued"
    assert listing["r2"]["state"] == "lent" and listing["r2"]["waiting_ms"] == 29 * S


# -- cut-off ----------------------------------------------------------------------------------------

# switch 1 s + service 2 s: give-up = 3 x 3 s + 30 s = 39 s after lending
QUICK = measured(job=2 * S, switch=1 * S, service=2 * S, slots=1)


def lend_one(grant: Lease = QUICK) -> Node:
    node = Node(depth=1)
    node.service.apply_settings(LendingSettings(scheduling_backend_depth=1))
    node.serve_many(2)  # r0 in the backend, r1 waits
    node.answer(0, grant)
    assert node.lent_ids() == ["r1"]
    return node


def test_a_lent_request_with_no_answer_is_cut_off_at_the_bound_and_served_by_the_owner() -> None:
    node = lend_one()
    at(node, 38.999)
    assert not node.lent[0].answer.called
    at(node, 39)
    assert isinstance(node.answers["r1"], list) and node.answers["r1"] == []
    assert node.lent[0].answer.called  # the outgoing request was cancelled
    rows = node.rows("returned")
    assert len(rows) == 1 and rows[0]["request_id"] == "r1" and rows[0]["helper_node_id"] == "helper"
    assert node.service.queues["text"].entry("r1").returned  # type: ignore[union-attr]
    node.finish_local("r0")
    assert node.local_calls == ["r0", "r1"]
    node.finish_local("r1")
    assert node.answered("r1") == b"local r1"
    waiting = node.service.queues["text"]
    assert len(waiting) == 0


def test_a_cut_off_request_keeps_its_first_arrival_and_goes_to_the_head() -> None:
    node = lend_one()
    node.serve("late")
    at(node, 39)
    pending = node.service.queues["text"].pending()
    assert [e.request_id for e in pending] == ["r1", "late"]
    assert pending[0].arrived_ms == START * 1000


def test_once_the_helper_started_answering_the_body_may_take_as_long_as_it_needs() -> None:
    node = lend_one()
    at(node, 10)
    answering = node.answering["r1"]
    assert answering is not None
    answering()
    at(node, 500)
    assert not node.lent[0].answer.called
    node.lent[0].answer.callback(b"helper r1")
    assert node.answered("r1") == b"helper r1"
    assert node.rows("returned") == []


def test_probe_leases_are_never_cut_off() -> None:
    node = lend_one(measured(probe=True, ttl_ms=3_600_000))
    at(node, 3000)
    assert not node.lent[0].answer.called
    assert node.rows("returned") == []


def _lending_through_a_transport_that_reports_a_cancel_as_a_return() -> Node:
    """Depth 1, two requests, the second lent by a transport that turns a cancel into a return."""
    node = Node(depth=1)

    async def unreachable_on_cancel(call: Call, grant: Lease, model_id: str) -> bytes:
        try:
            return await node._send_lent(call, grant, model_id)
        except CancelledError:
            raise Returned("ResponseNeverReceived") from None

    node.lend_with = unreachable_on_cancel
    node.service.apply_settings(LendingSettings(scheduling_backend_depth=1))
    node.serve_many(2)
    node.answer(0, QUICK)
    return node


def test_a_transport_that_reports_the_cancel_as_a_return_still_counts_as_cut_off() -> None:
    node = _lending_through_a_transport_that_reports_a_cancel_as_a_return()
    at(node, 39)
    assert len(node.rows("returned")) == 1
    node.finish_local("r0")
    node.finish_local("r1")
    assert node.answered("r1") == b"local r1"


def test_the_client_going_away_cancels_the_lent_request_and_nothing_reruns_it() -> None:
    node = _lending_through_a_transport_that_reports_a_cancel_as_a_return()
    node.serving["r1"].cancel()
    assert node.lent[0].answer.called
    result = node.answered("r1")
    assert isinstance(result, Failure) and result.check(CancelledError)
    assert "r1" not in node.service.queues["text"]
    assert node.rows("returned") == []
    at(node, 100)  # no timer is left to fire
    node.finish_local("r0")
    assert node.local_calls == ["r0"]


def test_a_lent_answer_before_the_bound_leaves_no_timer_behind() -> None:
    node = lend_one()
    pending_calls = len(node.clock.getDelayedCalls())
    d: Deferred[bytes] = node.lent[0].answer
    d.callback(b"helper r1")
    assert node.answered("r1") == b"helper r1"
    assert len(node.clock.getDelayedCalls()) == pending_calls - 1


def test_the_same_settings_pushed_again_while_a_lent_slot_awaits_its_next_lease_keep_the_hold() -> None:
    """Issue 24, lending (f): the master pushes its settings again at every registration.  Pushed
    between a lent answer and the master's next lease (the lent slot momentarily free), unchanged
    settings re-ran admission, the hold was judged then, released, and the owner took the held
    request into its second slot; now the held request is lent on the master's next answer."""
    node = reference_burst()
    at(node, 30)
    node.lent[0].answer.callback(b"helper r2")
    node.service.apply_settings(attrs.evolve(node.service.settings))  # equal, a new object
    assert "r3" not in node.local_calls
    node.answer(len(node.events) - 1, measured())
    assert node.lent_ids() == ["r2", "r3"]
    node.service.apply_settings(attrs.evolve(node.service.settings, offload_hold_for_faster_helper=False))
    assert node.service.settings.offload_hold_for_faster_helper is False  # a change still applies


def _lent_answered_before_the_owner_finishes() -> Node:
    """r2 lent at +5 s comes back at +28 s (its slot free until the master answers the owner's
    event); at +29 s the owner finishes r0 and r3 is judged for the second slot."""
    node = Node()
    node.serve_many(4)
    at(node, 5)
    node.answer(0, measured())
    assert node.lent_ids() == ["r2"]
    at(node, 28)
    node.lent[0].answer.callback(b"helper r2")
    at(node, 29)
    node.finish_local("r0")
    return node


def test_a_lent_slot_freed_while_the_masters_answer_is_on_its_way_still_holds() -> None:
    """Issue 24, lending (f): the owner's second slot came free between a lent answer and the
    master's next lease; "every lent slot busy" failed for that instant and the owner took the
    request the helper would finish sooner.  It now waits for that answer, which lends it."""
    node = _lent_answered_before_the_owner_finishes()
    assert "r3" not in node.local_calls and state_of(node, "r3") == "held"
    node.answer(len(node.events) - 1, measured())
    assert node.lent_ids() == ["r2", "r3"] and "r3" not in node.local_calls


def test_when_the_awaited_answer_fails_the_held_request_is_judged_again_and_released() -> None:
    node = _lent_answered_before_the_owner_finishes()
    assert "r3" not in node.local_calls
    waiting = [e for e in node.events if not e.answer.called]
    while waiting:  # the event in flight fails, then the one queued behind it
        waiting[0].answer.errback(Failure(RuntimeError("master unreachable")))
        assert "r3" not in node.local_calls or not [e for e in node.events if not e.answer.called]
        waiting = [e for e in node.events if not e.answer.called]
    assert node.local_calls[-1] == "r3"
