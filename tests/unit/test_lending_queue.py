"""The lane queue: admission depth, lending withdrawals, returns, borrowed work, holds, stats, listing
(spec "What is lent", "A helper's own work"; reference §3.1, §9, §10 Q/H)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from routerd.lending.queue import BorrowedReturn, Effects, HoldQuery, LaneQueue, QueueError
from routerd.wire.lending import HeldRequest, QueueStat


def image_queue(depth: int = 2, **kw: object) -> LaneQueue:
    return LaneQueue("image", depth, enrolled={"A", "B", "H"}, owners={"A", "B"}, **kw)  # type: ignore[arg-type]


def fill(q: LaneQueue, n: int, model: str = "A", start: int = 0, **kw: object) -> list[str]:
    admitted: list[str] = []
    for i in range(start, start + n):
        admitted += q.arrive(f"{model}{i}", model, now_ms=i, **kw).admit  # type: ignore[arg-type]
    return admitted


# -- admission ------------------------------------------------------------------------------------------


def test_depth_two_admits_two_and_holds_the_third() -> None:
    q = image_queue()
    assert fill(q, 3) == ["A0", "A1"]
    assert [e.request_id for e in q.pending()] == ["A2"]


def test_completion_admits_the_next_in_arrival_order() -> None:
    q = image_queue(depth=1)
    assert fill(q, 3) == ["A0"]
    assert q.finished("A0", 10).admit == ("A1",)
    assert q.finished("A1", 11).admit == ("A2",)


def test_depth_counts_the_lane_not_each_model() -> None:
    q = image_queue()
    fill(q, 1, "A")
    fill(q, 1, "B", start=1)
    assert q.arrive("A9", "A", 5).admit == ()


def test_a_raised_depth_admits_at_once() -> None:
    q = image_queue(depth=1)
    fill(q, 3)
    assert q.set_depth(3, 10).admit == ("A1", "A2")


def test_borrowed_work_for_a_model_that_is_not_enrolled_is_handed_back() -> None:
    q = image_queue()
    assert q.arrive_borrowed("x", "unlinked", 0).returned == (BorrowedReturn("x", "helper_busy_on_arrival"),)
    assert "x" not in q
    q.arrive("A0", "A", 0)
    with pytest.raises(QueueError):
        q.arrive("A0", "A", 1)  # duplicate id


def test_a_model_linked_nowhere_is_queued_in_class_order_and_never_lent() -> None:
    """Issue 23: every own request of the lane waits in this queue, linked or not (before, an
    unlinked model's arrival raised QueueError and went straight to the backend, FIFO)."""
    q = image_queue(depth=1)
    assert q.arrive("b0", "solo", 0, priority=2, key_name="bulk").admit == ("b0",)
    for i in range(1, 4):
        q.arrive(f"b{i}", "solo", i, priority=2, key_name="bulk")
    q.arrive("chat", "solo", 10, priority=0, key_name="chat")
    assert q.position("chat", 10) == 1
    assert q.finished("b0", 20).admit == ("chat",)
    assert q.withdraw_for_lending("solo", 5, 21, "h", "H") == []  # not an owner: never lent
    assert [h.priority for h in q.held_listing(21)] == ["batch"] * 3


def test_ten_requests_two_go_to_the_backend_and_eight_are_lendable() -> None:
    q = image_queue()
    assert fill(q, 10, work=(100.0,)) == ["A0", "A1"]
    assert q.stats() == [QueueStat("A", 8, (800.0,), 0, 10, (1000.0,))]
    lent = q.withdraw_for_lending("A", 2, 20, "helper", "H")
    assert len(lent) == 2
    assert len(q.admitted()) == 2
    assert q.stats()[0].pending_count == 6


# -- lending --------------------------------------------------------------------------------------------


def test_withdraw_takes_only_waiting_requests_oldest_first() -> None:
    q = image_queue(depth=1)
    fill(q, 4)  # A0 running; A1, A2, A3 waiting
    assert q.withdraw_for_lending("A", 2, 10, "helper", "H") == ["A1", "A2"]
    assert [e.request_id for e in q.pending()] == ["A3"]
    assert [e.request_id for e in q.lent("A")] == ["A1", "A2"]


def test_withdraw_never_takes_an_admitted_request() -> None:
    q = image_queue(depth=1)
    fill(q, 1)
    assert q.withdraw_for_lending("A", 2, 10, "helper", "H") == []


def test_withdraw_ignores_other_models_borrowed_streaming_and_helper_only_models() -> None:
    q = LaneQueue("text", 1, enrolled={"A", "H"}, owners={"A"})
    q.arrive_borrowed("b0", "H", 0)  # admitted (idle lane)
    q.arrive_borrowed("b1", "H", 1)  # waiting borrowed
    q.arrive("h0", "H", 2)  # helper-only native: hands b1 back, waits
    q.arrive("s0", "A", 3, streaming=True)
    q.arrive("a0", "A", 4)
    assert q.withdraw_for_lending("H", 5, 10, "x", "y") == []
    assert q.withdraw_for_lending("A", 5, 10, "x", "y") == ["a0"]


def test_withdraw_leaves_requests_too_big_for_the_helper_with_the_owner() -> None:
    q = LaneQueue("text", 1, enrolled={"A"}, owners={"A"})
    q.arrive("run", "A", 0, work=(10, 10), context=20)
    q.arrive("big", "A", 1, work=(5000, 1000), context=6000)
    q.arrive("small", "A", 2, work=(40, 10), context=50)
    q.arrive("unsized", "A", 3)
    assert q.withdraw_for_lending("A", 3, 10, "x", "y", max_context=100) == ["small", "unsized"]
    assert [e.request_id for e in q.pending()] == ["big"]


def test_a_returned_request_goes_to_the_head_keeping_its_first_arrival() -> None:
    q = image_queue(depth=1)
    fill(q, 4)
    q.withdraw_for_lending("A", 1, 10, "helper", "H")  # A1
    assert q.returned("A1", 50).admit == ()
    assert [e.request_id for e in q.pending()] == ["A1", "A2", "A3"]
    listing = q.held_listing(100)
    assert listing[0] == HeldRequest("A1", "image", "A", "queued", 99, priority="standard")


def test_a_returned_request_is_never_lent_again() -> None:
    q = image_queue(depth=1)
    fill(q, 2)
    q.withdraw_for_lending("A", 1, 10, "helper", "H")
    q.returned("A1", 20)
    assert q.withdraw_for_lending("A", 1, 30, "helper", "H") == []


def test_a_finished_lent_request_leaves_the_queue() -> None:
    q = image_queue(depth=1)
    fill(q, 2)
    q.withdraw_for_lending("A", 1, 10, "helper", "H")
    assert q.lent_count("A") == 1
    assert q.finished("A1", 20) == Effects()
    assert q.lent_count("A") == 0 and "A1" not in q


def test_returned_and_finished_reject_requests_in_the_wrong_state() -> None:
    q = image_queue(depth=1)
    fill(q, 2)
    with pytest.raises(QueueError):
        q.returned("A0", 1)
    with pytest.raises(QueueError):
        q.finished("A1", 1)
    with pytest.raises(QueueError):
        q.finished("nope", 1)


def test_a_cancelled_waiting_request_frees_its_place() -> None:
    q = image_queue(depth=1)
    fill(q, 3)
    assert q.cancel("A1", 5) == Effects()
    assert q.finished("A0", 6).admit == ("A2",)
    assert q.cancel("unknown", 7) == Effects()


def test_a_cancelled_running_request_frees_its_backend_slot() -> None:
    q = image_queue(depth=1)
    fill(q, 2)
    assert q.cancel("A0", 5).admit == ("A1",)


# -- borrowed work --------------------------------------------------------------------------------------


def test_borrowed_work_is_handed_back_while_own_work_is_queued_or_running() -> None:
    q = image_queue(depth=2)
    fill(q, 1, "H")
    assert not q.accepting_borrowed()
    assert q.arrive_borrowed("b", "H", 1).returned == (BorrowedReturn("b", "helper_busy_on_arrival"),)
    assert "b" not in q


def test_borrowed_work_is_handed_back_when_the_node_is_busy_elsewhere() -> None:
    q = image_queue()
    effects = q.arrive_borrowed("b", "H", 0, node_busy=True)
    assert effects.returned == (BorrowedReturn("b", "helper_busy_on_arrival"),)


def test_own_request_returns_waiting_borrowed_work_and_waits_behind_running_borrowed() -> None:
    q = image_queue(depth=1)
    assert q.arrive_borrowed("b0", "H", 0).admit == ("b0",)
    assert q.arrive_borrowed("b1", "H", 1).admit == ()
    effects = q.arrive("own", "H", 2)
    assert effects.returned == (BorrowedReturn("b1", "own_work_arrived"),)
    assert effects.admit == ()
    assert q.entry("own") is not None and q.entry("own").borrowed_ahead == 1  # type: ignore[union-attr]
    assert q.finished("b0", 3).admit == ("own",)


def test_borrowed_work_is_accepted_again_once_own_work_drains() -> None:
    q = image_queue()
    fill(q, 1, "H")
    q.finished("H0", 5)
    assert q.accepting_borrowed()
    assert q.arrive_borrowed("b", "H", 6).admit == ("b",)


def test_borrowed_work_is_never_counted_in_stats_or_listed() -> None:
    q = image_queue(depth=1)
    q.arrive_borrowed("b0", "H", 0, work=(5.0,))
    q.arrive_borrowed("b1", "H", 0, work=(5.0,))
    assert q.stats() == []
    assert q.held_listing(10) == []


# -- stats and listing ----------------------------------------------------------------------------------


def test_stats_count_pending_and_backlog_work() -> None:
    q = image_queue(depth=1)
    q.arrive("run", "A", 0, work=(5.0,))
    q.arrive("p1", "A", 1, work=(10.0,))
    q.arrive("p2", "A", 2, work=(20.0,))
    assert q.stats() == [QueueStat("A", 2, (30.0,), 0, 3, (35.0,))]
    assert q.stats(["B"]) == [QueueStat("B", 0, (0.0,), 0, 0, (0.0,))]


def test_text_stats_carry_both_terms_and_summed_context_and_count_streams() -> None:
    q = LaneQueue("text", 1, enrolled={"A"}, owners={"A"})
    q.arrive("run", "A", 0, work=(100, 10), context=110)
    q.arrive("s", "A", 1, work=(200, 20), context=220, streaming=True)
    q.arrive("p", "A", 2, work=(300, 30), context=330)
    assert q.stats() == [QueueStat("A", 2, (500.0, 50.0), 550, 3, (600.0, 60.0))]
    assert q.withdraw_for_lending("A", 2, 3, "x", "y") == ["p"]


def test_held_listing_marks_queued_and_lent_requests_with_their_wait() -> None:
    q = image_queue(depth=1)
    fill(q, 3)
    q.withdraw_for_lending("A", 1, 10, "helper", "H")
    assert q.held_listing(100) == [
        HeldRequest("A2", "image", "A", "queued", 98, priority="standard"),
        HeldRequest("A1", "image", "A", "lent", 99, "helper", "H", priority="standard"),
    ]


def test_has_work_counts_waiting_and_lent_requests() -> None:
    q = image_queue(depth=1)
    fill(q, 1)
    assert not q.has_work("A")
    q.arrive("A1", "A", 1)
    assert q.has_work("A")
    q.withdraw_for_lending("A", 1, 2, "helper", "H")
    assert q.has_work("A")


# -- hold for a faster helper ---------------------------------------------------------------------------


def test_the_hold_keeps_the_head_only_for_the_second_slot() -> None:
    seen: list[HoldQuery] = []

    def hold(query: HoldQuery) -> bool:
        seen.append(query)
        return True

    q = image_queue(depth=2, hold=hold)
    assert q.arrive("A0", "A", 0).admit == ("A0",)  # first slot: never held
    assert seen == []
    assert q.arrive("A1", "A", 5).admit == ()
    assert seen[-1].in_flight == 1 and seen[-1].generating_since_ms == 0
    assert q.held_listing(10)[0].state == "held"
    assert q.finished("A0", 20).admit == ("A1",)  # the owner would idle: released


def test_the_hold_is_never_asked_for_streams_returned_requests_or_behind_another_model() -> None:
    asked: list[str] = []

    def hold(query: HoldQuery) -> bool:
        asked.append(query.entry.request_id)
        return True

    q = image_queue(depth=2, hold=hold)
    q.arrive("B0", "B", 0)
    assert q.arrive("A0", "A", 1).admit == ("A0",)  # behind another model: not asked
    q = LaneQueue("text", 2, enrolled={"A"}, owners={"A"}, hold=hold)
    q.arrive("A0", "A", 0)
    assert q.arrive("s", "A", 1, streaming=True).admit == ("s",)
    q = image_queue(depth=2, hold=hold)
    fill(q, 1)
    q.arrive("A1", "A", 1)
    q.hold = None
    q.withdraw_for_lending("A", 1, 2, "helper", "H")
    q.hold = hold
    asked.clear()
    assert q.returned("A1", 3).admit == ("A1",)
    assert asked == []


def test_the_hold_is_never_asked_for_a_model_that_owns_no_link() -> None:
    """Only an owner's request can be lent, so only it is held for a helper: a helper-only or
    unlinked model's second request goes to the backend without asking."""
    asked: list[str] = []

    def hold(query: HoldQuery) -> bool:
        asked.append(query.entry.request_id)
        return True

    q = image_queue(depth=2, hold=hold)
    fill(q, 2, model="H")
    fill(q, 0)
    assert [e.request_id for e in q.admitted()] == ["H0", "H1"]
    q = image_queue(depth=2, hold=hold)
    fill(q, 2, model="X")
    assert [e.request_id for e in q.admitted()] == ["X0", "X1"]
    assert asked == []
    fill(q, 1, model="A", start=5)  # behind another model: waits without asking either
    assert asked == []


def test_generating_since_moves_to_the_last_own_completion() -> None:
    seen: list[int] = []

    def hold(query: HoldQuery) -> bool:
        seen.append(query.generating_since_ms)
        return True

    q = image_queue(depth=2, hold=hold)
    q.arrive("A0", "A", 0)
    q.arrive("A1", "A", 0)  # held
    q.hold = None
    q.pump(0)  # A1 admitted now
    q.hold = hold
    q.arrive("A2", "A", 1)  # full pipe, not asked
    q.finished("A0", 29_000)
    assert seen[-1] == 29_000


def test_pump_releases_a_held_request_when_the_hold_lapses() -> None:
    holding = True
    q = image_queue(depth=2, hold=lambda _: holding)
    fill(q, 2)
    assert q.pump(5).admit == ()
    holding = False
    assert q.pump(6).admit == ("A1",)


def test_a_lent_request_that_comes_back_hands_back_waiting_borrowed_work_like_a_native_arrival() -> None:
    """Found by the state machine: a node that lent its own request may borrow meanwhile; when its
    request comes back it is own work waiting again, so waiting borrowed entries go back (409)."""
    q = LaneQueue("text", 2, enrolled={"A", "H"}, owners={"A"})
    q.arrive_borrowed("b1", "H", 0)
    q.arrive_borrowed("b2", "H", 1)  # both admitted: the backend is full
    q.arrive("a1", "A", 2)  # own work waits
    assert q.withdraw_for_lending("A", 1, 3, "h", "H") == ["a1"]
    q.arrive_borrowed("b3", "H", 4)  # no own work waits now: accepted, waiting
    effects = q.returned("a1", 5)
    assert [(r.request_id, r.reason) for r in effects.returned] == [("b3", "own_work_arrived")]
    assert [e.request_id for e in q.pending()] == ["a1"]


# -- invariant ------------------------------------------------------------------------------------------


class QueueMachine(RuleBasedStateMachine):
    """No request is lost or duplicated, and the backend never gets more than ``depth``."""

    def __init__(self) -> None:
        super().__init__()
        self.q = LaneQueue("text", 2, enrolled={"A", "H"}, owners={"A"})
        self.now = 0
        self.next_id = 0
        self.live: set[str] = set()  # ids the queue must still hold
        self.gone: set[str] = set()

    def _apply(self, effects: Effects) -> None:
        for ret in effects.returned:
            assert ret.request_id not in self.gone
            self.live.discard(ret.request_id)
            self.gone.add(ret.request_id)

    def _new_id(self) -> str:
        self.next_id += 1
        self.now += 1
        return f"r{self.next_id}"

    @rule(model=st.sampled_from(["A", "H"]), streaming=st.booleans(), ctx=st.integers(0, 200))
    def arrive(self, model: str, streaming: bool, ctx: int) -> None:
        rid = self._new_id()
        self.live.add(rid)
        self._apply(self.q.arrive(rid, model, self.now, work=(ctx, 1), context=ctx, streaming=streaming))

    @rule(busy=st.booleans())
    def arrive_borrowed(self, busy: bool) -> None:
        rid = self._new_id()
        self.live.add(rid)
        self._apply(self.q.arrive_borrowed(rid, "H", self.now, node_busy=busy))

    @rule(n=st.integers(0, 3), limit=st.one_of(st.none(), st.integers(0, 200)))
    def withdraw(self, n: int, limit: int | None) -> None:
        taken = self.q.withdraw_for_lending("A", n, self.now, "h", "H", max_context=limit)
        assert len(taken) <= n and len(set(taken)) == len(taken)

    @precondition(lambda self: bool(self.q.lent()))
    @rule(data=st.data(), back=st.booleans())
    def settle_lent(self, data: st.DataObject, back: bool) -> None:
        entry = data.draw(st.sampled_from(self.q.lent()))
        if back:
            self._apply(self.q.returned(entry.request_id, self.now))
        else:
            self._apply(self.q.finished(entry.request_id, self.now))
            self.live.discard(entry.request_id)
            self.gone.add(entry.request_id)

    @precondition(lambda self: bool(self.q.admitted()))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        entry = data.draw(st.sampled_from(self.q.admitted()))
        self._apply(self.q.finished(entry.request_id, self.now))
        self.live.discard(entry.request_id)
        self.gone.add(entry.request_id)

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.live)))
        self._apply(self.q.cancel(rid, self.now))
        self.live.discard(rid)
        self.gone.add(rid)

    @invariant()
    def nothing_lost_or_duplicated(self) -> None:
        ids = [e.request_id for e in self.q.pending() + self.q.admitted() + self.q.lent()]
        assert len(ids) == len(set(ids))
        assert set(ids) == self.live
        assert len(self.q) == len(self.live)

    @invariant()
    def backend_never_over_depth(self) -> None:
        assert len(self.q.admitted()) <= self.q.depth

    @invariant()
    def no_idle_backend_while_work_waits(self) -> None:
        if self.q.pending():
            assert len(self.q.admitted()) == self.q.depth

    @invariant()
    def own_work_goes_ahead_of_borrowed(self) -> None:
        pending = self.q.pending()
        if any(not e.borrowed for e in pending + self.q.admitted()):
            assert not any(e.borrowed for e in pending)

    @invariant()
    def counters_agree_with_the_lists(self) -> None:
        """The queue's per-model admitted count and live borrowed count (kept so an arrival does
        not scan the backend's entries) say what the lists say."""
        admitted = self.q.admitted()
        for model_id in ("A", "H"):
            assert self.q._admitted_of.get(model_id, 0) == sum(1 for e in admitted if e.model_id == model_id)
        live = self.q.pending() + admitted + self.q.lent()
        assert self.q._borrowed_live == sum(1 for e in live if e.borrowed)

    @invariant()
    def waiting_native_counts_as_stats_does(self) -> None:
        """The arrival's bound check (``max_queued_per_model``) reads ``waiting_native``: the same
        count as ``stats``' ``pending_count``, without summing every model's work (issue 24)."""
        for model_id in ("A", "B", "H"):
            assert self.q.waiting_native(model_id) == self.q.stats([model_id])[0].pending_count


TestQueueMachine = QueueMachine.TestCase
TestQueueMachine.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
