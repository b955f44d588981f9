"""The swap-avoiding order on a shared runtime (issue 33 item 2, ``scheduling.swap_batch``), as the
pure lane queue driven by a fake clock (the ``now_ms`` values) and a simulated runtime that serves
the admitted requests in admission order and loads weights when the model changes."""

from __future__ import annotations

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from routerd.lending.queue import Effects, LaneQueue
from routerd.lending.queue_entries import SwapPass

INTERACTIVE, STANDARD, BATCH = 0, 1, 2
MODELS = ("A", "B", "C")


def swap_queue(batch: int, depth: int = 1, max_wait_ms: int = 10_000, aging_ms: int = 30_000,
               loaded: str | None = "A") -> LaneQueue:
    q = LaneQueue("text", depth, enrolled=MODELS, owners=MODELS, aging_ms=aging_ms)
    q.swap.configure(batch, max_wait_ms)
    q.swap.loaded = loaded
    return q


def admitted_order(q: LaneQueue, first: list[str], now_ms: int) -> list[str]:
    """Finish the backend's requests one by one (oldest first) at ``now_ms``: ``first`` (what was
    admitted on arrival) and then the order the rest is admitted in."""
    order = list(first)
    while q.admitted():
        order += q.finished(q.admitted()[0].request_id, now_ms).admit
    return order


def a_b_a_a_c(q: LaneQueue) -> list[str]:
    """``A B A A C`` arrives while the runtime holds A, behind ``depth - 1`` more A requests that fill
    the backend (else B takes the free place at once: nothing to batch yet); the order the five are
    admitted in."""
    first: list[str] = []
    fill = [(f"a0.{n}", "A") for n in range(q.depth - 1)]
    trace = [("a1", "A"), *fill, ("b1", "B"), ("a2", "A"), ("a3", "A"), ("c1", "C")]
    for n, (rid, model) in enumerate(trace):
        first += q.arrive(rid, model, n).admit
    return [rid for rid in admitted_order(q, first, 100) if not rid.startswith("a0.")]


# -- the order -----------------------------------------------------------------------------------------


def test_a_b_a_a_c_is_served_a_a_a_b_c_with_a_batch_of_two_or_more() -> None:
    """Before (and with swap_batch 0) the runtime switched A → B → A → C: three switches; with a
    batch of 2 it switches A → B → C."""
    for batch in (2, 3, 50):
        for depth in (1, 2):
            assert a_b_a_a_c(swap_queue(batch, depth)) == ["a1", "a2", "a3", "b1", "c1"], (batch, depth)


def test_a_batch_of_one_serves_one_more_then_switches() -> None:
    assert a_b_a_a_c(swap_queue(1)) == ["a1", "a2", "b1", "a3", "c1"]


def test_swap_batch_zero_is_today_s_order() -> None:
    assert a_b_a_a_c(swap_queue(0)) == ["a1", "b1", "a2", "a3", "c1"]
    assert a_b_a_a_c(LaneQueue("text", 1)) == ["a1", "b1", "a2", "a3", "c1"]


def test_with_nothing_loaded_nothing_is_passed_over() -> None:
    """Nothing in the backend and the runtime empty (a failed load, an unload): whatever comes next
    loads, so the class order stands."""
    q = swap_queue(5, loaded=None)
    assert q.arrive("x", "B", 0).admit == ("x",)
    q.arrive("a1", "A", 1)
    q.arrive("b2", "B", 2)
    assert admitted_order(q, [], 10) == ["a1", "b2"]


def test_the_backend_s_last_request_decides_else_what_the_runtime_holds() -> None:
    """While the backend holds requests, the last one admitted is what the runtime will hold (it runs
    them in admission order), whatever it holds now; with nothing admitted, the model the node says
    its runtime holds or is loading decides."""
    q = swap_queue(3, depth=2, loaded="B")
    q.arrive("a1", "A", 0)
    q.arrive("a2", "A", 1)  # the backend: a1 running, a2 behind it
    q.arrive("b1", "B", 2)
    q.arrive("a3", "A", 3)
    assert q.finished("a1", 10).admit == ("a3",)  # a2 (A) is last in the backend: A next, not B
    for loaded, first in (("A", "a2"), ("B", "b1")):
        q1 = swap_queue(3, depth=1, loaded=None)
        q1.arrive("a1", "A", 0)
        q1.arrive("b1", "B", 1)
        q1.arrive("a2", "A", 2)
        q1.swap.loaded = loaded  # the node: A loading for a1, or an explicit load of B meanwhile
        assert q1.finished("a1", 10).admit == (first,)


def test_a_pass_is_reported_with_the_request_passed_over_and_the_switches_spared() -> None:
    """Each pass names the request passed over, its model and wait, the model kept loaded, and how
    many switches the queue's order was spared: A B A A C spares one (A → B → A → C → 3 switches,
    A → B → C → 2)."""
    q = swap_queue(2)
    q.arrive("a1", "A", 0)
    for n, (rid, model) in enumerate([("b1", "B"), ("a2", "A"), ("a3", "A"), ("c1", "C")], start=1):
        q.arrive(rid, model, n)
    first = q.finished("a1", 100)
    second = q.finished("a2", 200)
    assert first.passed == (SwapPass("a2", "b1", "A", "B", 99, 0),)
    assert second.passed == (SwapPass("a3", "b1", "A", "B", 199, 1),)
    assert q.finished("a3", 300).passed == ()  # b1 now: a switch
    assert q.swap.tally == {"A": (2, 1)}


def test_interleaved_models_spare_a_switch_per_request_pulled_forward() -> None:
    """B A C A D A with A loaded: FIFO switches 6 times, A A A B C D (a batch of 3) 3 times."""
    q = swap_queue(3)
    q.arrive("a0", "A", 0)
    for n, model in enumerate("BACADA", start=1):
        q.arrive(f"{model.lower()}{n}", model, n)
    order = admitted_order(q, ["a0"], 100)
    assert order == ["a0", "a2", "a4", "a6", "b1", "c3", "d5"]
    assert q.swap.tally == {"A": (3, 3)}


def test_a_higher_class_is_never_passed_over() -> None:
    """The loaded model's request goes first only within the class of the one passed over."""
    q = swap_queue(5)
    q.arrive("a1", "A", 0, priority=STANDARD, key_name="k")
    q.arrive("b1", "B", 1, priority=INTERACTIVE, key_name="chat")
    q.arrive("a2", "A", 2, priority=STANDARD, key_name="k")
    assert admitted_order(q, ["a1"], 10) == ["a1", "b1", "a2"]
    q2 = swap_queue(5)
    q2.arrive("a1", "A", 0, priority=STANDARD, key_name="k")
    q2.arrive("b1", "B", 1, priority=BATCH, key_name="bulk")
    q2.arrive("a2", "A", 2, priority=BATCH, key_name="k")
    assert admitted_order(q2, ["a1"], 10) == ["a1", "a2", "b1"]


def test_a_request_overtaken_its_bound_ago_stops_the_batch() -> None:
    """The bound runs from the first time a request is overtaken (here at 500 ms, when b1 was the
    one the class order would admit), never past queue.aging."""
    q = swap_queue(50, max_wait_ms=1000)
    q.arrive("a1", "A", 0)
    q.arrive("b1", "B", 1)
    for n in range(2, 10):
        q.arrive(f"a{n}", "A", n)
    assert q.finished("a1", 500).admit == ("a2",)
    assert q.pending()[0].overtaken_ms == 500
    assert q.finished("a2", 1499).admit == ("a3",)  # overtaken 999 ms ago
    assert q.finished("a3", 1500).admit == ("b1",)  # 1000 ms: its bound
    q2 = swap_queue(50, max_wait_ms=60_000, aging_ms=700)
    q2.arrive("a1", "A", 0)
    q2.arrive("b1", "B", 1)
    q2.arrive("a2", "A", 2)
    q2.arrive("a3", "A", 3)
    assert q2.finished("a1", 600).admit == ("a2",)
    assert q2.finished("a2", 1300).admit == ("b1",)


def test_what_waits_ahead_of_the_request_served_first_is_overtaken_too_what_waits_behind_is_not() -> None:
    """b2, behind a3, is not delayed by it: its bound does not hold the batch back."""
    q = swap_queue(5, depth=1, max_wait_ms=1000)
    q.arrive("a1", "A", 0)
    for n, (rid, model) in enumerate([("b1", "B"), ("c1", "C"), ("a2", "A"), ("b2", "B"), ("a3", "A")],
                                     start=1):
        q.arrive(rid, model, n)
    assert q.finished("a1", 100).admit == ("a2",)
    overtaken = {e.request_id: e.overtaken_ms for e in q.pending()}
    assert overtaken == {"b1": 100, "c1": 100, "b2": None, "a3": None}
    assert q.finished("a2", 600).admit == ("a3",)
    assert {e.request_id: e.overtaken_ms for e in q.pending()} == {"b1": 100, "c1": 100, "b2": 600}


def test_configure_reads_the_settings_of_a_reload() -> None:
    q = swap_queue(0)
    assert q.swap.limit == 0
    q.swap.configure(4, 2500)
    assert (q.swap.limit, q.swap.max_wait_ms, q.swap.bound_ms(30_000), q.swap.bound_ms(1000)) == \
        (4, 2500, 2500, 1000)
    q.swap.configure(-1, -5)
    assert (q.swap.limit, q.swap.max_wait_ms) == (0, 0)


# -- a simulated runtime: properties -------------------------------------------------------------------


@attrs.define
class Run:
    order: list[str]
    arrived: dict[str, int]
    started: dict[str, int]
    admitted_at: dict[str, int]
    model_of: dict[str, str]
    loads: int
    passes: list[tuple[int, SwapPass, list[tuple[str, str, int | None]]]]


def simulate(q: LaneQueue, trace: list[tuple[int, str]], job_ms: int, load_ms: int,
             priorities: list[int] | None = None) -> Run:
    """Arrivals ``(gap after the previous one, model)``; the runtime runs admitted requests one at a
    time in admission order, loading ``load_ms`` first when the model changes (and telling the
    queue what it holds, as the node does)."""
    arrivals = []
    t = 0
    for n, (gap, model) in enumerate(trace):
        t += gap
        arrivals.append((t, f"r{n}", model, STANDARD if priorities is None else priorities[n]))
    run = Run([], {}, {}, {}, {}, 0, [])
    backend: list[str] = []  # admitted, in admission order; the first runs once started
    busy_until: int | None = None  # when the running one finishes
    loaded = q.swap.loaded

    def take(effects: Effects, now: int, before: list[tuple[str, str, int | None]]) -> None:
        for p in effects.passed:
            run.passes.append((now, p, before))
        for rid in effects.admit:
            run.order.append(rid)
            run.admitted_at[rid] = now
            backend.append(rid)

    def snapshot(now: int) -> list[tuple[str, str, int | None]]:
        return [(e.request_id, e.model_id, e.overtaken_ms) for e in q.pending()]

    i = 0
    now = 0
    while i < len(arrivals) or backend:
        if backend and busy_until is None:  # start the head of the backend
            rid = backend[0]
            model = run.model_of[rid]
            cost = job_ms
            if model != loaded:
                loaded = model
                run.loads += 1
                cost += load_ms
            q.swap.loaded = loaded
            run.started[rid] = now
            busy_until = now + cost
        next_arrival = arrivals[i][0] if i < len(arrivals) else None
        if busy_until is not None and (next_arrival is None or busy_until <= next_arrival):
            now = busy_until
            busy_until = None
            done = backend.pop(0)
            before = snapshot(now)
            take(q.finished(done, now), now, before)
        else:
            assert next_arrival is not None
            now, rid, model, priority = arrivals[i]
            i += 1
            run.arrived[rid] = now
            run.model_of[rid] = model
            before = snapshot(now)
            take(q.arrive(rid, model, now, priority=priority, key_name="k"), now, before)
    return run


traces = st.lists(st.tuples(st.integers(0, 900), st.sampled_from(MODELS)), min_size=1, max_size=60)


@settings(max_examples=200, deadline=None)
@given(traces, st.integers(1, 8), st.integers(1, 2), st.integers(0, 3000), st.integers(1, 40_000))
def test_no_request_is_overtaken_once_it_was_first_overtaken_its_bound_ago(
        trace: list[tuple[int, str]], batch: int, depth: int, max_wait_ms: int, aging_ms: int) -> None:
    """Every pass happens while every request it overtakes (of another model, ahead of the one
    admitted) was first overtaken less than the bound ago (swap_max_wait, never past queue.aging),
    and at most ``batch`` passes follow one another for a model before the runtime switches."""
    q = swap_queue(batch, depth, max_wait_ms, aging_ms, loaded=None)
    run = simulate(q, trace, 500, 300)
    assert sorted(run.order) == sorted(run.arrived)  # nobody starves
    bound = min(max_wait_ms, aging_ms)
    streak: dict[str, int] = {}
    for now, p, before in run.passes:
        ahead = next(n for n, (rid, _, _) in enumerate(before) if rid == p.served)
        overtaken = [since for _, model, since in before[:ahead] if model != p.model_id]
        assert overtaken and all(since is None or now - since < bound for since in overtaken), (p, before)
    # passes of one model between two switches (in admission order) are at most `batch`
    passed_served = {p.served for _, p, _ in run.passes}
    current = None
    for rid in run.order:
        model = run.model_of[rid]
        if model != current:
            current, streak = model, {}
        if rid in passed_served:
            streak[model] = streak.get(model, 0) + 1
            assert streak[model] <= batch


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 2), st.floats(1.1, 10), st.integers(50, 900), st.floats(0, 0.9),
       st.integers(1_000, 60_000))
def test_a_request_passed_over_waits_at_most_its_bound_plus_one_job(
        depth: int, jobs_of_wait: float, job_ms: int, offset: float, aging_ms: int) -> None:
    """While the loaded model's requests keep coming faster than the runtime serves them (the case
    that would starve the other model), a request of another model is admitted at most
    swap_max_wait (never past queue.aging) plus the one job admitted last before then after it was
    first passed over, which is at most one job after it arrived (when the running job ended)."""
    max_wait_ms = int(jobs_of_wait * job_ms)
    q = swap_queue(100_000, depth, max_wait_ms, aging_ms)
    trace = [(0, "A")] * depth + [(int(offset * job_ms), "B"), (1, "A")]
    trace += [(job_ms // 2, "A")] * (4 * (max_wait_ms // job_ms + 4))
    run = simulate(q, trace, job_ms, 200)
    b = f"r{depth}"
    assert run.model_of[b] == "B"
    bound = min(max_wait_ms, aging_ms)
    first_passed = min(now for now, p, _ in run.passes if p.passed == b)  # FIFO: admitted then
    assert first_passed - run.arrived[b] <= job_ms
    assert run.admitted_at[b] - first_passed <= bound + job_ms


@settings(max_examples=200, deadline=None)
@given(traces, st.integers(1, 8), st.integers(1, 2), st.integers(0, 3))
def test_each_model_keeps_its_own_order_so_lending_takes_the_request_waiting_longest(
        trace: list[tuple[int, str]], batch: int, depth: int, finished: int) -> None:
    """The swap-avoiding order moves a model's requests forward as a block: within every model the
    admission order is the arrival order, as with swap_batch 0; so whatever it has passed over,
    lending (which takes from one model) still takes that model's requests oldest first: the ones
    waiting longest, and the ones the model would serve first."""
    run = simulate(swap_queue(batch, depth), trace, 500, 300)
    for model in MODELS:
        mine = [rid for rid in run.order if run.model_of[rid] == model]
        assert mine == sorted(mine, key=lambda r: (run.arrived[r], int(r[1:])))
    q = swap_queue(batch, depth)
    for n, (_, model) in enumerate(trace):
        q.arrive(f"r{n}", model, n)
    for _ in range(finished):  # some passes happen
        if q.admitted():
            q.finished(q.admitted()[0].request_id, 1000)
    for model in MODELS:
        waiting = [e for e in q.pending() if e.model_id == model]
        oldest_first = [e.request_id for e in sorted(waiting, key=lambda e: e.arrived_ms)]
        assert q.withdraw_for_lending(model, len(waiting), 1000, "h", model) == oldest_first


@settings(max_examples=100, deadline=None)
@given(traces, st.integers(1, 2))
def test_one_model_only_is_today_s_order(trace: list[tuple[int, str]], depth: int) -> None:
    """With one model there is never a switch to avoid: the order is FIFO, as with swap_batch 0."""
    solo = [(gap, "A") for gap, _ in trace]
    on = simulate(swap_queue(4, depth), solo, 500, 300)
    off = simulate(swap_queue(0, depth), solo, 500, 300)
    assert on.order == off.order and on.passes == []


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 400), st.sampled_from(MODELS)), min_size=10, max_size=60),
       st.integers(2, 8), st.integers(1, 2), st.integers(1000, 60_000))
def test_the_batch_never_loads_more_often_than_fifo_on_a_burst(
        trace: list[tuple[int, str]], batch: int, depth: int, max_wait_ms: int) -> None:
    """A burst (arrivals faster than the runtime serves) on a shared runtime: never more loads than
    FIFO (checked with 3,000 examples too)."""
    on = simulate(swap_queue(batch, depth, max_wait_ms), trace, 500, 2000)
    off = simulate(swap_queue(0, depth, max_wait_ms), trace, 500, 2000)
    assert on.loads <= off.loads
