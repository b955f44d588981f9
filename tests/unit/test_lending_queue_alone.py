"""A lane queue's arrival into an idle lane against the general arrival (line, then pump).

An own arrival while nothing waits and nothing is borrowed is admitted without passing through the
waiting line when it fits and no hold check can keep it (``LaneQueue._arrive_alone``).  Two queues
are driven through the same random steps (own arrivals of owner, helper and unlinked models in
every class, of two keys, several concurrencies, streaming or not; borrowed arrivals; finishes;
cancellations; lending and what comes back; depth changes; time passing); in one, the queue never
reports itself idle, so every arrival lines up and is pumped.  Each call must answer the same
effects, the hold check must be asked the same questions while the same entries wait, and the
entries, stats and held listings must be the same after every step.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from routerd.lending.queue import Effects, HoldQuery, LaneQueue


class LinedUpQueue(LaneQueue):
    """A lane queue that never reports itself idle: every arrival lines up and is pumped."""

    def idle(self) -> bool:
        return False


class Side:
    """One queue with a recording hold check (it holds on some instants, as a lease would)."""

    def __init__(self, cls: type[LaneQueue], depth: int) -> None:
        self.asked: list[tuple[Any, ...]] = []
        self.q = cls("text", depth, enrolled=("H",), owners=("A",), hold=self._hold, aging_ms=1_000)

    def _hold(self, query: HoldQuery) -> bool:
        waiting = [e.request_id for e in self.q.pending()]
        self.asked.append((query.entry.request_id, query.in_flight, query.generating_since_ms,
                           query.now_ms, waiting))
        return (query.now_ms // 300) % 2 == 0

    def observe(self, now: int) -> tuple[Any, ...]:
        q = self.q
        entries = [(e.request_id, e.state, e.holding, e.borrowed_ahead, e.admitted_ms, e.lent_ms, e.image,
                    e.concurrency, e.priority, e.key_name, e.work, e.context)
                   for e in q.pending() + q.admitted() + q.lent()]
        return (entries, q.stats(), q.held_listing(now), q.serving_order(now), q.accepting_borrowed(),
                q.borrowed_in_backend(), self.asked, q.order._served)


ARRIVE = st.tuples(st.just("arrive"), st.sampled_from(["A", "H", "Z"]), st.integers(0, 2),
                   st.sampled_from(["", "k1", "k2"]), st.sampled_from([1.0, 2.0, 0.5]), st.integers(1, 3),
                   st.booleans(), st.booleans(), st.integers(0, 2))
STEP = st.one_of(
    ARRIVE,
    ARRIVE,  # twice as likely as any other step: idle lanes with work admitted are met often
    st.tuples(st.just("borrowed"), st.booleans()),
    st.tuples(st.just("finish"), st.integers(0, 7)),
    st.tuples(st.just("cancel"), st.integers(0, 15)),
    st.tuples(st.just("lend"), st.integers(0, 3)),
    st.tuples(st.just("lent_back"), st.integers(0, 3), st.booleans()),
    st.tuples(st.just("depth"), st.integers(1, 3)),
    st.tuples(st.just("advance"), st.integers(1, 2_500)),
)


@settings(max_examples=600, deadline=None)
@given(depth=st.integers(1, 3), steps=st.lists(STEP, max_size=40))
def test_an_arrival_into_an_idle_lane_leaves_what_lining_up_and_pumping_leaves(
        depth: int, steps: list[tuple[Any, ...]]) -> None:
    alone, lined = Side(LaneQueue, depth), Side(LinedUpQueue, depth)
    now, n = 0, 0
    for step in steps:
        kind = step[0]
        answers: list[Effects | list[str]] = []
        for side in (alone, lined):
            q = side.q
            if kind == "arrive":
                _, model, priority, key, weight, concurrency, streaming, image, ahead = step
                answers.append(q.arrive(f"r{n}", model, now, work=(float(priority + 1),),
                                        context=priority * 10, streaming=streaming, image=image,
                                        also_ahead=ahead, priority=priority, key_name=key, weight=weight,
                                        concurrency=concurrency))
            elif kind == "borrowed":
                answers.append(q.arrive_borrowed(f"r{n}", "H", now, node_busy=step[1]))
            elif kind == "finish" and q.admitted():
                admitted = q.admitted()
                answers.append(q.finished(admitted[step[1] % len(admitted)].request_id, now))
            elif kind == "cancel" and len(q):
                live = sorted(e.request_id for e in q.pending() + q.admitted() + q.lent())
                answers.append(q.cancel(live[step[1] % len(live)], now))
            elif kind == "lend":
                answers.append(q.withdraw_for_lending("A", step[1], now, "helper", "H"))
            elif kind == "lent_back" and q.lent():
                lent = q.lent()
                rid = lent[step[1] % len(lent)].request_id
                answers.append(q.returned(rid, now) if step[2] else q.finished(rid, now))
            elif kind == "depth":
                answers.append(q.set_depth(step[1], now))
        if kind == "advance":
            now += step[1]
        n += 1
        assert answers[:1] == answers[1:]
        assert alone.observe(now) == lined.observe(now)
