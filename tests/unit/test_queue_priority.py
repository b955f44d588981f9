"""The router queue's order under priority classes, aging and per-key fair share (issue 23), as a
pure object driven by a fake clock (the ``now_ms`` values)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routerd.lending.priority import FairOrder, PriorityError, effective_rank, requested_class
from routerd.lending.queue import LaneQueue

INTERACTIVE, STANDARD, BATCH = 0, 1, 2


def queue(depth: int = 1, aging_ms: int = 30_000) -> LaneQueue:
    return LaneQueue("text", depth, enrolled={"A", "B"}, owners={"A", "B"}, aging_ms=aging_ms)


def drain(q: LaneQueue, now_ms: int) -> list[str]:
    """Finish the running entries one by one at ``now_ms``: the order the rest is admitted in."""
    order: list[str] = []
    while q.admitted():
        rid = q.admitted()[0].request_id
        order += q.finished(rid, now_ms).admit
    return order


# -- classes -----------------------------------------------------------------------------------------


def test_an_interactive_request_passes_a_batch_flood() -> None:
    """Before classes the interactive request waited behind all 50 batch jobs."""
    q = queue()
    for i in range(50):
        q.arrive(f"b{i}", "A", i, priority=BATCH, key_name="flood")
    q.arrive("chat", "A", 60, priority=INTERACTIVE, key_name="user")
    assert q.finished("b0", 100).admit == ("chat",)


def test_behind_the_backend_s_work_a_lower_class_waits_while_a_higher_one_is_about() -> None:
    """Depth 2: a batch request admitted behind a running one waits inside the backend, where an
    interactive request arriving next cannot pass it (p99 ≈ 1.27 J before).  While interactive
    work has arrived within the last aging period, batch work takes the second place no more;
    the interactive request takes it and waits for the running job only.  Once the period is over,
    batch work fills both places again."""
    q = LaneQueue("text", 2, aging_ms=30_000)
    assert q.arrive("i0", "solo", 0, priority=INTERACTIVE, key_name="chat").admit == ("i0",)
    assert q.finished("i0", 100).admit == ()
    admitted = [rid for n in range(4) for rid in q.arrive(f"b{n}", "solo", 200 + n, priority=BATCH,
                                                          key_name="bulk").admit]
    assert admitted == ["b0"]  # before: ["b0", "b1"], b1 waiting in the backend
    assert q.arrive("i1", "solo", 250, priority=INTERACTIVE, key_name="chat").admit == ("i1",)
    assert q.finished("b0", 300).admit == ()  # i1 runs; b1 waits here, not in the backend
    assert q.finished("i1", 400).admit == ("b1",)
    assert q.finished("b1", 30_300).admit == ("b2", "b3")  # no interactive arrival for 30 s: both places


def test_the_queue_says_when_the_class_rule_lapses_so_the_backend_is_topped_back_up() -> None:
    """When only the second-place class rule keeps the head out of the backend, admission's
    answer carries the instant it lapses (the higher class's window ends, or the head ages up a
    class sooner): pumped a moment before, nothing is admitted; pumped then, the place fills."""
    q = LaneQueue("text", 2, aging_ms=30_000)
    assert q.arrive("i0", "solo", 0, priority=INTERACTIVE, key_name="chat").admit == ("i0",)
    q.finished("i0", 100)
    assert q.arrive("b0", "solo", 200, priority=BATCH, key_name="bulk").admit == ("b0",)
    effects = q.arrive("b1", "solo", 300, priority=BATCH, key_name="bulk")
    assert (effects.admit, effects.recheck_ms) == ((), 30_000)  # i0's window: 0 + 30 s
    assert q.pump(29_999).admit == ()
    assert q.pump(30_000).admit == ("b1",)
    # several windows and the head's own aging: the earliest of them each time
    q2 = LaneQueue("text", 2, aging_ms=30_000)
    assert q2.arrive("s0", "solo", 0, priority=STANDARD, key_name="a").admit == ("s0",)
    assert q2.arrive("b0", "solo", 20_000, priority=BATCH, key_name="b").recheck_ms == 30_000
    assert q2.arrive("i0", "solo", 25_000, priority=INTERACTIVE, key_name="c").admit == ("i0",)
    assert q2.finished("s0", 26_000).recheck_ms == 30_000  # the standard window (s0 at 0)
    assert q2.pump(30_000).recheck_ms == 50_000  # then b0 ages up to standard (20 s + 30 s)
    assert q2.pump(50_000).recheck_ms == 55_000  # still below interactive: until i0's window ends
    assert q2.pump(55_000).admit == ("b0",)


def test_with_predictions_the_waiting_place_opens_for_the_running_job_s_last_fifth() -> None:
    """With a predicted job time (the node's fits), the place behind the running job opens to a
    lower class for that job's last fifth (admitted at 200, predicted 1,000 ms: from 1,000), the
    instant admission asks to be pumped again; without a prediction the class rule alone decides."""
    q = LaneQueue("text", 2, aging_ms=30_000)
    q.predict_ms = lambda entry: 1000.0
    q.arrive("i0", "solo", 0, priority=INTERACTIVE, key_name="chat")
    q.finished("i0", 100)
    assert q.arrive("b0", "solo", 200, priority=BATCH, key_name="bulk").admit == ("b0",)
    assert q.arrive("b1", "solo", 300, priority=BATCH, key_name="bulk").recheck_ms == 1000
    assert q.pump(999).admit == ()
    assert q.pump(1000).admit == ("b1",)
    q.predict_ms = lambda entry: None  # a model the fits cannot price: no opening
    q.arrive("i1", "solo", 1200, priority=INTERACTIVE, key_name="chat")
    assert q.finished("b0", 1300).admit == ("i1",)  # b1 waited behind b0: i1 behind b1
    q.finished("b1", 1400)
    q.arrive("b2", "solo", 1500, priority=BATCH, key_name="bulk")
    assert q.arrive("b3", "solo", 1600, priority=BATCH, key_name="bulk").recheck_ms == 31_200  # i1's window


def test_the_place_behind_another_model_s_job_does_not_open_early() -> None:
    """Behind another model's work the runtime must switch first: the place stays the class rule's."""
    q = LaneQueue("text", 2, aging_ms=30_000)
    q.predict_ms = lambda entry: 1000.0
    q.arrive("i0", "solo", 0, priority=INTERACTIVE, key_name="chat")
    assert q.arrive("b0", "other", 100, priority=BATCH, key_name="bulk").recheck_ms == 30_000
    assert q.pump(950).admit == ()


def test_a_full_backend_asks_for_no_timer() -> None:
    """Only a place the class rule keeps empty asks for a timer; a full backend's next completion
    pumps anyway (no timer per arrival under a flood)."""
    q = LaneQueue("text", 2, aging_ms=30_000)
    q.arrive("i0", "solo", 0, priority=INTERACTIVE, key_name="chat")
    q.arrive("i1", "solo", 1, priority=INTERACTIVE, key_name="chat")
    assert q.arrive("b0", "solo", 2, priority=BATCH, key_name="bulk").recheck_ms is None


def test_with_one_class_both_places_fill_as_before() -> None:
    q = LaneQueue("text", 2, aging_ms=30_000)
    admitted = [rid for n in range(3) for rid in q.arrive(f"b{n}", "solo", n, priority=BATCH).admit]
    assert admitted == ["b0", "b1"]


@pytest.mark.parametrize("depth", [1, 2])
def test_a_parallel_model_linked_nowhere_gets_its_parallel_places_plus_depth_minus_one(depth: int) -> None:
    """A model that serves 4 requests at once (``parallel`` 4, linked nowhere) got all 4 at once
    before the router queue took it; the lane's cap for it is ``depth + 4 - 1``, so its backend is
    as busy as before with ``depth - 1`` waiting behind (before this fix: ``depth`` admitted, the
    backend's other places idle).  A one-at-a-time model of the same lane still gets ``depth``."""
    q = LaneQueue("text", depth, aging_ms=30_000)
    admitted = [rid for n in range(8) for rid in q.arrive(f"p{n}", "wide", n, priority=BATCH,
                                                          concurrency=4).admit]
    assert admitted == [f"p{n}" for n in range(4 + depth - 1)]
    assert q.finished("p0", 100).admit == (f"p{4 + depth - 1}",)  # one out, one in: the cap holds
    serial = LaneQueue("text", depth, aging_ms=30_000)
    admitted = [rid for n in range(8) for rid in serial.arrive(f"s{n}", "solo", n, priority=BATCH).admit]
    assert admitted == [f"s{n}" for n in range(depth)]


def test_a_lower_class_takes_a_free_running_place_while_a_higher_class_is_about() -> None:
    """The second-place rule keeps batch work only out of places where it would *wait* in the
    backend: with ``parallel`` 4 and interactive work about, batch work still fills the model's
    free running places (before this fix: none, the backend ran one request of its four), and
    only the place beyond them (depth 2: one waiting place) is kept for the interactive class."""
    q = LaneQueue("text", 2, aging_ms=30_000)
    assert q.arrive("i0", "wide", 0, priority=INTERACTIVE, key_name="chat", concurrency=4).admit == ("i0",)
    admitted = [rid for n in range(6) for rid in q.arrive(f"b{n}", "wide", 100 + n, priority=BATCH,
                                                          key_name="bulk", concurrency=4).admit]
    assert admitted == ["b0", "b1", "b2"]  # four running; b3 would wait in the backend: kept here
    assert q.arrive("i1", "wide", 200, priority=INTERACTIVE, key_name="chat", concurrency=4).admit == ("i1",)
    assert q.finished("b0", 300).admit == ()  # i1 takes the running place; b3 would still wait
    assert q.finished("i0", 400).admit == ("b3",)  # a running place came free: batch takes it
    assert q.finished("b1", 30_300).admit == ("b4", "b5")  # no interactive arrival for 30 s: all places


def test_a_lower_class_does_not_take_a_place_behind_another_model_while_a_higher_class_is_about() -> None:
    """A free place of its model's concurrency is no free running place while the backend holds
    another model's work (the runtime must switch first): the rule still keeps batch work out."""
    q = LaneQueue("text", 2, aging_ms=30_000)
    assert q.arrive("i0", "solo", 0, priority=INTERACTIVE, key_name="chat").admit == ("i0",)
    assert q.arrive("b0", "wide", 100, priority=BATCH, key_name="bulk", concurrency=4).admit == ()
    assert q.finished("i0", 200).admit == ("b0",)


def test_classes_are_served_highest_first_then_in_arrival_order() -> None:
    q = queue()
    q.arrive("run", "A", 0)
    q.arrive("b1", "A", 1, priority=BATCH)
    q.arrive("s1", "A", 2, priority=STANDARD)
    q.arrive("i1", "A", 3, priority=INTERACTIVE)
    q.arrive("s2", "A", 4, priority=STANDARD)
    q.arrive("b2", "A", 5, priority=BATCH)
    assert drain(q, 10) == ["i1", "s1", "s2", "b1", "b2"]


def test_aging_lifts_a_waiting_request_one_class_per_period() -> None:
    """A batch request that has waited one aging period ranks with standard work (arrival order
    then puts it first); before aging it stayed behind every standard request."""
    q = queue(aging_ms=1000)
    q.arrive("run", "A", 0)
    q.arrive("old-batch", "A", 0, priority=BATCH)
    q.arrive("s1", "A", 500, priority=STANDARD)
    assert q.finished("run", 999).admit == ("s1",)
    q.arrive("s2", "A", 1000, priority=STANDARD)
    assert q.finished("s1", 1000).admit == ("old-batch",)


def test_effective_rank_never_rises_above_interactive() -> None:
    assert effective_rank(BATCH, 0, 10_000, 1000) == INTERACTIVE
    assert effective_rank(BATCH, 0, 1999, 1000) == STANDARD
    assert effective_rank(BATCH, 0, 10_000, 0) == BATCH  # aging off


def test_priority_header_may_lower_never_raise_and_refuses_unknown_values() -> None:
    assert requested_class("interactive", "batch") == "batch"
    assert requested_class("standard", "Standard") == "standard"
    assert requested_class("batch", "interactive") == "batch"
    assert requested_class("standard", "") == "standard"
    with pytest.raises(PriorityError):
        requested_class("standard", "urgent")


# -- fair share --------------------------------------------------------------------------------------


def test_a_second_keys_single_request_waits_one_job_not_the_whole_burst() -> None:
    """Same class: key ``solo`` arrives behind 20 of ``burst`` and is admitted after one of them."""
    q = queue()
    for i in range(20):
        q.arrive(f"burst{i}", "A", i, priority=BATCH, key_name="burst")
    q.arrive("solo", "A", 30, priority=BATCH, key_name="solo")
    order = drain(q, 40)
    assert order.index("solo") <= 1


def test_keys_in_one_class_alternate_round_robin() -> None:
    q = queue()
    q.arrive("run", "A", 0, key_name="x")
    for i in range(3):
        q.arrive(f"a{i}", "A", 1 + i, key_name="a")
    for i in range(3):
        q.arrive(f"b{i}", "A", 10 + i, key_name="b")
    assert drain(q, 20) == ["a0", "b0", "a1", "b1", "a2", "b2"]


def test_weights_share_a_class_in_proportion() -> None:
    q = queue()
    q.arrive("run", "A", 0, key_name="x")
    for i in range(6):
        q.arrive(f"h{i}", "A", 1 + i, key_name="heavy", weight=2.0)
        q.arrive(f"l{i}", "A", 1 + i, key_name="light", weight=1.0)
    first_six = drain(q, 20)[:6]
    assert sum(r.startswith("h") for r in first_six) == 4


def test_an_idle_key_banks_no_credit() -> None:
    """Key ``b`` served nothing while ``a`` ran 10 jobs: when ``b`` sends a burst it shares evenly
    with ``a`` from then on instead of taking the next 10 slots."""
    q = queue()
    for i in range(12):
        q.arrive(f"a{i}", "A", i, key_name="a")
    for i in range(10):
        q.finished(f"a{i}", 100 + i)
    for i in range(4):
        q.arrive(f"b{i}", "A", 200 + i, key_name="b")
    order = drain(q, 300)
    assert order[:3] in (["a11", "b0", "b1"], ["b0", "a11", "b1"])


# -- lending -----------------------------------------------------------------------------------------


def test_lending_takes_batch_before_interactive() -> None:
    """Before classes lending took the oldest (the interactive one here)."""
    q = queue()
    q.arrive("run", "A", 0)
    q.arrive("chat", "A", 1, priority=INTERACTIVE)
    q.arrive("job", "A", 2, priority=BATCH)
    assert q.withdraw_for_lending("A", 1, 3, "helper", "H") == ["job"]


def test_the_request_held_for_the_faster_helper_is_the_one_lent() -> None:
    """The hold keeps the head of the serving order (here an interactive request) waiting *for* the
    helper; lending takes that request, then the lowest class.  Before, lending took the batch
    request and the interactive one stayed held, waiting for a helper that got other work."""
    q = LaneQueue("text", 2, enrolled={"A"}, owners={"A"}, hold=lambda query: True)
    assert q.arrive("run", "A", 0).admit == ("run",)
    q.arrive("job", "A", 1, priority=BATCH)
    q.arrive("chat", "A", 2, priority=INTERACTIVE)
    assert [(h.request_id, h.state) for h in q.held_listing(3)] == [("job", "queued"), ("chat", "held")]
    assert q.withdraw_for_lending("A", 1, 3, "helper", "H") == ["chat"]
    assert q.withdraw_for_lending("A", 1, 4, "helper", "H") == ["job"]


def test_a_held_request_the_helper_cannot_take_leaves_lending_in_class_order() -> None:
    q = LaneQueue("text", 2, enrolled={"A"}, owners={"A"}, hold=lambda query: True)
    q.arrive("run", "A", 0)
    q.arrive("job", "A", 1, priority=BATCH, context=100)
    q.arrive("chat", "A", 2, priority=INTERACTIVE, context=9000)
    assert q.withdraw_for_lending("A", 1, 3, "helper", "H", max_context=4096) == ["job"]


def test_queue_position_follows_the_class_order() -> None:
    q = queue()
    q.arrive("run", "A", 0)
    for i in range(5):
        q.arrive(f"b{i}", "A", 1 + i, priority=BATCH)
    q.arrive("chat", "A", 10, priority=INTERACTIVE)
    assert q.position("chat", 10) == 1
    assert q.position("b0", 10) == 2
    assert q.position("run", 10) == 0


def test_held_listing_shows_class_and_key_name() -> None:
    q = queue()
    q.arrive("run", "A", 0)
    q.arrive("chat", "A", 1, priority=INTERACTIVE, key_name="alice")
    held = q.held_listing(5)
    assert (held[0].priority, held[0].key_name) == ("interactive", "alice")


# -- properties --------------------------------------------------------------------------------------

arrivals = st.lists(
    st.tuples(st.integers(0, 2), st.sampled_from(["k1", "k2", "k3"]), st.integers(0, 5000)),
    min_size=1, max_size=30)


def _run(q: LaneQueue, plan: list[tuple[int, str, int]], job_ms: int,
         one_class: bool, one_key: bool,
         model: str = "A") -> tuple[list[str], dict[str, int], dict[str, int]]:
    """Arrivals at increasing times, each admitted job running ``job_ms``; answers the admission
    order, each request's arrival and admission time."""
    now = 0
    arrived: dict[str, int] = {}
    admitted_at: dict[str, int] = {}
    order: list[str] = []
    events = sorted((t, i) for i, (_, _, t) in enumerate(plan))
    pending = list(events)
    running: list[tuple[int, str]] = []

    def take(effects_admit: tuple[str, ...], at: int) -> None:
        for rid in effects_admit:
            order.append(rid)
            admitted_at[rid] = at
            running.append((at + job_ms, rid))

    while pending or running:
        next_arrival = pending[0][0] if pending else None
        running.sort()
        next_finish = running[0][0] if running else None
        if next_finish is not None and (next_arrival is None or next_finish <= next_arrival):
            now, rid = running.pop(0)
            take(q.finished(rid, now).admit, now)
        else:
            assert next_arrival is not None
            now, i = pending.pop(0)
            cls, key, _ = plan[i]
            rid = f"r{i}"
            arrived[rid] = now
            take(q.arrive(rid, model, now, priority=STANDARD if one_class else cls,
                          key_name="k" if one_key else key).admit, now)
    return order, arrived, admitted_at


@settings(max_examples=200, deadline=None)
@given(arrivals, st.integers(1, 3))
def test_one_class_one_key_is_exactly_fifo(plan: list[tuple[int, str, int]], depth: int) -> None:
    """With every request in one class (and of one key) the admission order is arrival order:
    today's FIFO."""
    q = queue(depth=depth)
    order, arrived, _ = _run(q, plan, 700, one_class=True, one_key=True)
    assert order == sorted(order, key=lambda r: (arrived[r], int(r[1:])))


@settings(max_examples=200, deadline=None)
@given(arrivals, st.integers(1, 3))
def test_a_model_linked_nowhere_keeps_exactly_fifo_with_one_class_and_one_key(
        plan: list[tuple[int, str, int]], depth: int) -> None:
    """A standalone node's queue (nothing enrolled) takes its model's requests (before, the arrival
    raised: they went straight to the backend) and, with one class and one key, admits them in
    arrival order, as the backend's own first come, first served did; with classes it serves the
    highest first."""
    q = LaneQueue("text", depth)
    order, arrived, _ = _run(q, plan, 700, one_class=True, one_key=True, model="solo")
    assert order == sorted(order, key=lambda r: (arrived[r], int(r[1:])))
    mixed = LaneQueue("text", depth)
    order, arrived, admitted_at = _run(mixed, plan, 700, one_class=False, one_key=True, model="solo")
    plan_of = {f"r{i}": p for i, p in enumerate(plan)}
    for n, rid in enumerate(order):  # (no aging within 5 s) nothing of a lower class passed a waiting one
        waiting = [later for later in order[n + 1:] if arrived[later] < admitted_at[rid]]
        assert all(plan_of[later][0] >= plan_of[rid][0] for later in waiting), (rid, waiting)


@settings(max_examples=200, deadline=None)
@given(arrivals, st.integers(1, 3))
def test_no_request_waits_beyond_its_aging_bound(plan: list[tuple[int, str, int]], depth: int) -> None:
    """Once a request has waited its class's aging bound (rank × aging) it is served like an
    interactive one: no request that arrived after it and is of its key is admitted before it,
    and a later request of another key passes it only in that key's fair turns — at most one
    more time than its own key (its older requests) is served meanwhile."""
    aging = 1000
    q = queue(depth=depth, aging_ms=aging)
    plan_of = {f"r{i}": p for i, p in enumerate(plan)}
    order, arrived, admitted_at = _run(q, plan, 700, one_class=False, one_key=False)
    assert sorted(order) == sorted(plan_of)  # nobody starves
    keys = {p[1] for p in plan}
    for rid in order:
        cls, key, _ = plan_of[rid]
        bound = arrived[rid] + cls * aging
        meanwhile = [o for o in order[:order.index(rid)] if admitted_at[o] >= bound]
        passed_by = [o for o in meanwhile if arrived[o] > arrived[rid]]
        assert not [o for o in passed_by if plan_of[o][1] == key]
        own_turns = sum(plan_of[o][1] == key for o in meanwhile)
        for other in keys - {key}:
            assert sum(plan_of[o][1] == other for o in passed_by) <= own_turns + 1


class _E:
    def __init__(self, priority: int, key_name: str, arrived_ms: int, weight: float) -> None:
        self.priority, self.key_name, self.arrived_ms, self.weight = priority, key_name, arrived_ms, weight


_KEY_WEIGHTS = {"a": 1.0, "b": 2.0, "c": 0.5}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from(sorted(_KEY_WEIGHTS)), st.integers(0, 3000)),
                max_size=25),
       st.dictionaries(st.sampled_from(sorted(_KEY_WEIGHTS)), st.floats(0, 5)), st.integers(0, 4000))
def test_fair_order_service_order_matches_successive_picks(
        plan: list[tuple[int, str, int]], served: dict[str, float], now: int) -> None:
    """The fast simulated order (queue position, lending) is exactly what successive pick+charge
    calls give, whatever the counters, classes, ages and weights."""
    entries = [_E(rank, key, at, _KEY_WEIGHTS[key]) for rank, key, at in plan]
    order = FairOrder(1000)
    order._served.update(served)
    simulated = [entries[i] for i in order.service_order(entries, now)]
    live = list(entries)
    picked = []
    while live:
        i = order.pick(live, now)
        assert i is not None
        picked.append(live[i])
        order.charge(live.pop(i))
    assert simulated == picked
