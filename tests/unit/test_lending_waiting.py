"""The record a request waits as in a lane queue (issue 24, ``routerd.lending.waiting``): woken by a
callback, answered exactly once, cancellable while it waits and while its ticket's work runs."""

from __future__ import annotations

import json
from typing import Any

import pytest
from twisted.internet.defer import CancelledError, Deferred
from twisted.python.failure import Failure

from routerd.lending.waiting import ARRIVING, DONE, RUNNING, WAITING, WaitingRequest
from routerd.routing.call import Call
from routerd.routing.classify import classify
from tests.support import FakeReply


class Steward:
    """Runs each ticket as a Deferred the test fires; counts cancellations of waiting requests."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, Deferred[bytes | None]]] = []
        self.cancelled: list[WaitingRequest[Any]] = []
        self.canceller: Any = None  # the work's canceller (default: fail with CancelledError)

    def run_ticket(self, held: WaitingRequest[Any], ticket: str) -> Deferred[bytes | None]:
        d: Deferred[bytes | None] = Deferred(self.canceller)
        self.runs.append((ticket, d))
        return d

    def cancel_waiting(self, held: WaitingRequest[Any]) -> None:
        self.cancelled.append(held)


def _held(steward: Steward) -> WaitingRequest[str]:
    route = classify("POST", "/v1/chat/completions")
    assert route is not None
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    call = Call(reply=FakeReply(), route=route, path="/v1/chat/completions", body=body,
                content_type="application/json", parsed=json.loads(body), stream=False, request_id="r1",
                started=0.0, selector="m")
    model: Any = None  # never read by the record
    return WaitingRequest(steward, call, model, "text", "m", "m", lambda *_: Deferred(), True)


def _outcome(d: Deferred[bytes]) -> list[Any]:
    seen: list[Any] = []
    d.addBoth(seen.append)
    return seen


def test_a_request_woken_while_arriving_runs_its_ticket_once_it_waits_and_keeps_its_parsed_body() -> None:
    steward = Steward()
    held = _held(steward)
    held.wake("admit")  # the arrival's own effects admit it at once
    assert steward.runs == [] and held.state == ARRIVING  # the arrival's bookkeeping comes first
    held.wait()
    assert [t for t, _ in steward.runs] == ["admit"] and held.state == RUNNING
    assert held.call.parsed is not None  # never shed: it did not wait
    seen = _outcome(held.result)
    steward.runs[0][1].callback(b"answer")
    assert seen == [b"answer"] and held.state == DONE


def test_a_held_request_drops_its_parsed_body_and_gets_it_back_when_woken() -> None:
    steward = Steward()
    held = _held(steward)
    held.wait()
    assert held.state == WAITING and held.call.parsed is None and steward.runs == []
    held.wake("admit")
    assert held.call.parsed == {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    seen = _outcome(held.result)
    steward.runs[0][1].callback(b"ok")
    assert seen == [b"ok"]


def test_the_failure_of_the_tickets_work_fails_the_result_once() -> None:
    steward = Steward()
    held = _held(steward)
    held.wait()
    held.wake("lend")
    seen = _outcome(held.result)
    steward.runs[0][1].errback(Failure(ValueError("relay broke")))
    assert len(seen) == 1 and isinstance(seen[0], Failure) and seen[0].check(ValueError)
    held.wake("admit")  # a stray ticket after the end starts nothing
    assert len(steward.runs) == 1


def test_a_request_back_from_a_lend_waits_again_and_a_ticket_meanwhile_runs_after_the_work_returned() -> None:
    steward = Steward()
    held = _held(steward)
    held.wait()
    held.wake("lend")
    lend = steward.runs[0][1]
    held.park_again()  # the helper handed it back: re-queued, and the queue admits it at once
    held.wake("admit")
    assert len(steward.runs) == 1, "nothing runs until the lend's work has returned"
    lend.callback(None)
    assert [t for t, _ in steward.runs] == ["lend", "admit"] and held.state == RUNNING
    seen = _outcome(held.result)
    steward.runs[1][1].callback(b"served here")
    assert seen == [b"served here"]


def test_a_request_back_from_a_lend_with_no_ticket_waits_again_without_its_parsed_body() -> None:
    steward = Steward()
    held = _held(steward)
    held.wait()
    held.wake("lend")
    held.park_again()
    steward.runs[0][1].callback(None)
    assert held.state == WAITING and held.call.parsed is None and not held.result.called


def test_cancelling_a_waiting_request_frees_its_place_once_and_fails_with_cancelled() -> None:
    steward = Steward()
    held = _held(steward)
    held.wait()
    seen = _outcome(held.result)
    held.result.cancel()
    assert steward.cancelled == [held] and held.state == DONE
    assert len(seen) == 1 and seen[0].check(CancelledError)
    assert held.call.parsed is not None  # the caller's bookkeeping may read it
    held.wake("admit")  # too late: nothing runs
    assert steward.runs == []


def test_cancelling_a_running_request_cancels_its_work_not_its_queue_place() -> None:
    steward = Steward()
    held = _held(steward)
    held.wait()
    held.wake("admit")
    work = steward.runs[0][1]
    seen = _outcome(held.result)
    held.result.cancel()
    assert work.called and steward.cancelled == []  # the work's own cleanup frees its place
    assert len(seen) == 1 and seen[0].check(CancelledError)


def test_work_that_answers_when_cancelled_answers_once() -> None:
    steward = Steward()
    steward.canceller = lambda d: d.callback(b"answered anyway")  # the work catches its cancellation
    held = _held(steward)
    held.wait()
    held.wake("admit")
    seen = _outcome(held.result)
    held.result.cancel()
    assert seen == [b"answered anyway"]


@pytest.mark.parametrize("ticket", ["admit", "lend", "returned"])
def test_every_ticket_is_handed_to_the_steward_unchanged(ticket: str) -> None:
    steward = Steward()
    held = _held(steward)
    held.wait()
    held.wake(ticket)
    assert [t for t, _ in steward.runs] == [ticket]
