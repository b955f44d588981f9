"""The lending service's direct path against the full arrival (park, queue, wake, run).

An own request of a model owning no link, arriving while no lane holds waiting or borrowed work,
is queued without handing anything back and, admitted at once, runs without being parked; the lane
queue takes a short branch for an arrival into an idle lane.  Both must leave exactly what the full
path leaves.  Two services on their own fake clocks are driven through the same random steps
(arrivals of owner, helper-only and unlinked models, borrowed arrivals, finishes, cancellations,
the master's answers, lent requests answered or returned, time passing); in one, the queues never
report themselves idle, so every arrival takes the full path.  After each step the queues, the
runs started, the lent requests, the events sent, the answers, each request's queue position and
the decision rows must be the same.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.python.failure import Failure

from routerd.lending.links import LinkSet
from routerd.lending.offload import Returned
from routerd.lending.queue import LaneQueue
from routerd.wire.lending import LANES, Endpoint, Lane, Link
from tests.unit.test_lending_service import BORROWED, LINK, MODEL_A, OWNER, Node, lease, make_call, text_model

MODEL_G = text_model("G")  # a helper model on this node (enrolled, owns no link)
MODEL_Z = text_model("Z")  # linked nowhere
MODELS = {"A": MODEL_A, "G": MODEL_G, "Z": MODEL_Z}
HELPING = Link(Endpoint("other", "B"), Endpoint(OWNER, "G"), True, False)
LINKS = (LINK, HELPING)


class FullPathQueue(LaneQueue):
    """A lane queue that never reports itself idle: every arrival takes the full path."""

    def idle(self) -> bool:
        return False


class Pair:
    """One node as it is, and one whose arrivals all take the full path."""

    def __init__(self, depth: int, shared: bool) -> None:
        self.direct = Node(depth=depth, links=LINKS)
        self.full = Node(depth=depth, links=LINKS)
        for node in self.both():
            # G helps in both lanes; with ``shared`` both lanes run in one process (KoboldCpp)
            node.service.install_links(LinkSet.build("image", [HELPING]), LinkSet.build("text", LINKS))
            if shared:
                node.service.shared_lanes = lambda _kind, _model: ("image", "text")
        for lane in LANES:
            self.full.service.queues[lane].__class__ = FullPathQueue
        self.calls: dict[str, list[Any]] = {}
        self.n = 0

    def both(self) -> tuple[Node, Node]:
        return self.direct, self.full

    def arrive(self, model: str, stream: bool, priority: str, borrowed: bool, lane: Lane = "text") -> None:
        self.n += 1
        rid = f"r{self.n}"
        self.calls[rid] = []
        for node in self.both():
            call = make_call(rid, model, stream=stream)
            call.priority = priority  # type: ignore[assignment]
            self.calls[rid].append(call)
            d = node.service.serve(call, MODELS[model], lane, BORROWED if borrowed else None,
                                   public_id=model)
            node.serving[rid] = d
            got = node.answers.setdefault(rid, [])
            d.addBoth(got.append)
            d.addErrback(lambda f: None)

    def observe(self, node: Node) -> dict[str, Any]:
        now = node.service._now_ms()
        queues = {}
        for lane in LANES:
            q = node.service.queues[lane]
            queues[lane] = ([(e.request_id, e.state, e.holding, e.borrowed_ahead, e.image, e.work, e.context)
                             for e in q.pending() + q.admitted() + q.lent()],
                            q.stats(), q.held_listing(now), q.accepting_borrowed())
        answers = {rid: [_answer(a) for a in got] for rid, got in node.answers.items()}
        rows = [{k: v for k, v in row.items() if k != "id"} for row in node.rows()]
        return {"queues": queues, "local": list(node.local_calls), "lent": node.lent_ids(),
                "events": [(e.lane, e.model_id, e.trigger, e.answer.called) for e in node.events],
                "answers": answers, "rows": rows, "busy": node.service.node_busy(),
                "statuses": node.service.lane_statuses(), "held": node.service.held_requests()}

    def check(self) -> None:
        assert self.observe(self.direct) == self.observe(self.full)
        for rid, (a, b) in self.calls.items():
            assert a.queue_position == b.queue_position, rid


def _answer(result: bytes | Failure) -> object:
    if isinstance(result, Failure):
        return (type(result.value).__name__, str(result.value))
    return result


STEP = st.one_of(
    st.tuples(st.just("arrive"), st.sampled_from(["A", "G", "Z"]), st.booleans(),
              st.sampled_from(["interactive", "standard", "batch"])),
    st.tuples(st.just("borrowed"), st.sampled_from(["image", "text"])),
    st.tuples(st.just("finish"), st.integers(0, 7)),
    st.tuples(st.just("cancel"), st.integers(0, 15)),
    st.tuples(st.just("answer"), st.integers(0, 3), st.booleans()),
    st.tuples(st.just("lent_done"), st.integers(0, 3), st.booleans()),
    st.tuples(st.just("advance"), st.integers(1, 40_000)),
)


def _step(pair: Pair, step: tuple[Any, ...]) -> None:
    kind = step[0]
    direct, full = pair.both()
    if kind == "arrive":
        pair.arrive(step[1], step[2], step[3], borrowed=False)
    elif kind == "borrowed":
        pair.arrive("G", False, "standard", borrowed=True, lane=step[1])
    elif kind == "finish" and direct.running:
        rid = sorted(direct.running)[step[1] % len(direct.running)]
        for node in (direct, full):
            node.finish_local(rid)
    elif kind == "cancel":
        live = sorted(rid for rid, got in direct.answers.items() if not got)
        if live:
            rid = live[step[1] % len(live)]
            for node in (direct, full):
                node.serving[rid].cancel()
    elif kind == "answer":
        waiting = [i for i, e in enumerate(direct.events) if not e.answer.called]
        if waiting:
            index = waiting[step[1] % len(waiting)]
            for node in (direct, full):
                node.answer(index, lease(2) if step[2] else None)
    elif kind == "lent_done":
        waiting = [i for i, lent in enumerate(direct.lent) if not lent.answer.called]
        if waiting:
            index = waiting[step[1] % len(waiting)]
            for node in (direct, full):
                answer = node.lent[index].answer
                if step[2]:
                    answer.callback(b"lent answer")
                else:
                    answer.errback(Failure(Returned("busy")))
    elif kind == "advance":
        for node in (direct, full):
            node.clock.advance(step[1] / 1000.0)


@settings(max_examples=150, deadline=None)
@given(depth=st.integers(1, 3), shared=st.booleans(), steps=st.lists(STEP, max_size=40))
def test_the_direct_path_leaves_what_the_full_arrival_leaves(depth: int, shared: bool,
                                                             steps: list[tuple[Any, ...]]) -> None:
    pair = Pair(depth, shared)
    pair.check()
    for step in steps:
        _step(pair, step)
        pair.check()


def test_an_unlinked_request_arriving_at_an_idle_node_runs_without_being_parked() -> None:
    """The direct path is taken: nothing is left in the service's table of parked requests, and
    the request runs at once with queue position 0."""
    node = Node(links=LINKS)
    call = make_call("z1", "Z")
    d = node.service.serve(call, MODEL_Z, "text", None, public_id="Z")
    assert node.local_calls == ["z1"] and call.queue_position == 0
    assert node.service._waiters == {}
    node.finish_local("z1")
    assert d.called and node.service.queues["text"].idle()
