"""Per-request gates at withdrawal (spec "LLM lending" → the context gate, "Guardian models";
reference §6/§7): the lease carries the helper's context window and whether it reads images; a
queued request too big for that window, or one carrying an image for a helper without vision,
stays with the owner while later ones may still be lent.  The planner's mean-size gate stays."""

from __future__ import annotations

import json
from typing import Any

import attrs

from routerd.lending.links import LinkSet
from routerd.lending.planner import ModelFacts, PlanResult, plan
from routerd.lending.queue import LaneQueue
from routerd.routing.call import Call
from routerd.wire.lending import Costs, TokenProfile
from tests.support import FakeReply
from tests.unit.test_lending_planner import NOW, SETTINGS, facts, fit, link, node, queue
from tests.unit.test_lending_service import CHAT, LINK, MODEL_A, START, chat_route, lease
from tests.unit.test_lending_service import Node as ServiceNode

PNG = "data:image/png;base64,iVBORw0KGgo="


# -- the pure queue -------------------------------------------------------------------------------------


def text_queue() -> LaneQueue:
    return LaneQueue("text", 1, enrolled={"A"}, owners={"A"})


def test_withdrawal_keeps_a_request_too_big_for_the_helper_and_lends_later_ones() -> None:
    q = text_queue()
    q.arrive("run", "A", 0, context=50)
    q.arrive("long", "A", 1, context=9000)
    q.arrive("short", "A", 2, context=300)
    q.arrive("unsized", "A", 3, context=0)
    assert q.withdraw_for_lending("A", 5, 10, "h", "B", max_context=4096) == ["short", "unsized"]
    assert [e.request_id for e in q.pending()] == ["long"]


def test_withdrawal_lends_an_image_request_only_to_a_helper_with_vision() -> None:
    q = text_queue()
    q.arrive("run", "A", 0)
    q.arrive("picture", "A", 1, image=True)
    q.arrive("words", "A", 2)
    assert q.withdraw_for_lending("A", 5, 10, "h", "B", vision=False) == ["words"]
    assert [e.request_id for e in q.pending()] == ["picture"]
    assert q.withdraw_for_lending("A", 5, 11, "h2", "C", vision=True) == ["picture"]


# -- the planner fills the lease --------------------------------------------------------------------


def _text_plan(window: int, multimodal: bool) -> PlanResult:
    S = 1000.0
    stat = queue("A", 16, lane="text", context=100)
    owner = node("owner", lane="text", stats=[stat], fits=[fit("A", 8 * S, "text")])
    helper = node("helper", lane="text", idle_s=120, active="b.kcpps", fits=[fit("B", 8 * S, "text")],
                  loads={"b.kcpps": 19 * S})
    known = facts("text", owner__A=ModelFacts("a.kcpps", 8192, multimodal=multimodal),
                  helper__B=ModelFacts("b.kcpps", window, multimodal=multimodal))
    links = [LinkSet.build("text", [link("owner/A", "helper/B")])]
    return plan("enqueued", NOW, links, {"owner": owner, "helper": helper}, SETTINGS, known)


def test_a_text_lease_carries_the_helpers_context_window_and_vision() -> None:
    (granted,) = _text_plan(2048, multimodal=True).leases
    assert (granted.helper_context, granted.helper_multimodal) == (2048, True)
    (plain,) = _text_plan(8192, multimodal=False).leases
    assert (plain.helper_context, plain.helper_multimodal) == (8192, False)


def test_the_planners_mean_size_gate_stays() -> None:
    result = _text_plan(50, multimodal=False)  # mean queued context 100 > window 50
    assert result.leases == [] and result.rows[0].reason == "context_too_small"


# -- the owner's service applies the lease's gates ------------------------------------------------------


def call_with(rid: str, content: Any) -> Call:
    parsed = {"model": "A", "messages": [{"role": "user", "content": content}], "max_tokens": 10}
    return Call(reply=FakeReply(), route=chat_route(), path=CHAT, body=json.dumps(parsed).encode(),
                content_type="application/json", parsed=parsed, stream=False, request_id=rid,
                started=START, selector="A")


def owner_with_profile() -> ServiceNode:
    owner = ServiceNode(depth=1)
    # one byte per token: a request's required context is its body size plus its max_tokens
    owner.service.update_costs(Costs(tokens=(TokenProfile("A", 1.0, 10, 20),)))
    return owner


def serve_call(owner: ServiceNode, call: Call) -> None:
    d = owner.service.serve(call, MODEL_A, "text", None, public_id="A")
    got = owner.answers.setdefault(call.request_id, [])
    d.addBoth(got.append)


def test_a_long_request_stays_with_the_owner_while_short_ones_are_lent() -> None:
    owner = owner_with_profile()
    serve_call(owner, call_with("r0", "hi"))
    serve_call(owner, call_with("long", "x" * 3000))
    serve_call(owner, call_with("short", "hello"))
    owner.answer(0, attrs.evolve(lease(slots=2), helper_context=1000))
    assert owner.lent_ids() == ["short"]
    assert [e.request_id for e in owner.queue.pending()] == ["long"]
    owner.finish_local("r0")
    assert owner.local_calls == ["r0", "long"]  # the owner runs the long one itself


def test_an_image_request_is_never_lent_to_a_helper_without_vision() -> None:
    owner = owner_with_profile()
    serve_call(owner, call_with("r0", "hi"))
    serve_call(owner, call_with("picture", [{"type": "text", "text": "what is it"},
                                            {"type": "image_url", "image_url": {"url": PNG}}]))
    serve_call(owner, call_with("words", "what is it"))
    owner.answer(0, lease(slots=2))  # a lease without helper_multimodal: no vision
    assert owner.lent_ids() == ["words"]
    assert [e.request_id for e in owner.queue.pending()] == ["picture"]


def test_an_image_request_is_lent_to_a_helper_with_vision() -> None:
    owner = owner_with_profile()
    serve_call(owner, call_with("r0", "hi"))
    serve_call(owner, call_with("picture", [{"type": "image_url", "image_url": {"url": PNG}}]))
    owner.answer(0, attrs.evolve(lease(slots=2), helper_multimodal=True))
    assert owner.lent_ids() == ["picture"]


# -- a request the helper could never take is never held for it (reference §3.6 with §6/§7) -----------


def _image_burst(vision: bool) -> ServiceNode:
    """The hold's reference burst (test_lending_owner_clock) with r3 carrying an image."""
    owner = ServiceNode()
    for rid in ("r0", "r1", "r2"):
        serve_call(owner, call_with(rid, "hi"))
    serve_call(owner, call_with("r3", [{"type": "image_url", "image_url": {"url": PNG}}]))
    owner.clock.advance(5)
    grant = attrs.evolve(lease(1, ttl_ms=300_000), owner_job_ms=29_000.0, helper_switch_ms=6_000.0,
                         helper_service_ms=13_000.0, helper_multimodal=vision)
    owner.answer(0, grant)
    assert owner.lent_ids() == ["r2"]
    owner.clock.advance(24)
    owner.finish_local("r0")
    return owner


def test_an_image_request_is_not_held_for_a_helper_without_vision() -> None:
    owner = _image_burst(vision=False)
    assert owner.local_calls == ["r0", "r1", "r3"]  # the owner's second slot takes it at once
    assert owner.rows("held_for_helper") == []


def test_an_image_request_is_held_for_a_faster_helper_with_vision() -> None:
    owner = _image_burst(vision=True)
    assert "r3" not in owner.local_calls
    assert [r["request_id"] for r in owner.rows("held_for_helper")] == ["r3"]


def test_an_image_request_waiting_when_its_model_becomes_an_owner_is_never_lent_without_vision() -> None:
    """The body is walked for images only for an owner's request: one queued before its model owned
    a link is walked when the links make it an owner (its parsed body was dropped while held)."""
    owner = ServiceNode(depth=1, links=())
    serve_call(owner, call_with("r0", "hi"))
    serve_call(owner, call_with("picture", [{"type": "image_url", "image_url": {"url": PNG}}]))
    serve_call(owner, call_with("words", "what is it"))
    assert [e.image for e in owner.queue.pending()] == [False, False]  # not an owner: not walked
    owner.service.install_links(LinkSet.build("image", ()), LinkSet.build("text", [LINK]))
    assert [e.image for e in owner.queue.pending()] == [True, False]
    owner.service.report("text", "A", "enqueued")
    owner.answer(0, lease(slots=2))  # a lease without helper_multimodal: no vision
    assert owner.lent_ids() == ["words"]
    assert [e.request_id for e in owner.queue.pending()] == ["picture"]
