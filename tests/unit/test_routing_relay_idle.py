"""The idle-stream timer of a relayed answer (issue 24): an answer that is complete when its body
is asked for arms no timer (a forwarded or local answer read whole used to arm one and cancel it
at once, on every request); one still arriving is watched from then on, and its silence ends it."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone

from routerd.routing.relay import Idle, StreamIdle, collect


class CountingClock(Clock):
    def __init__(self) -> None:
        super().__init__()
        self.armed = 0

    def callLater(self, delay: float, callable: Any, *args: Any, **kw: Any) -> Any:  # noqa: A002, N802
        self.armed += 1
        return super().callLater(delay, callable, *args, **kw)


class Stopper:
    def __init__(self) -> None:
        self.stopped = False

    def stopProducing(self) -> None:  # noqa: N802 - Twisted's name
        self.stopped = True


class Answer:
    """A response whose body is delivered at once (``whole``) or later, by hand."""

    def __init__(self, whole: bytes | None) -> None:
        self.whole = whole
        self.protocol: Any = None
        self.transport = Stopper()

    def deliverBody(self, protocol: Any) -> None:  # noqa: N802 - Twisted's name
        self.protocol = protocol
        protocol.makeConnection(self.transport)
        if self.whole is not None:
            protocol.dataReceived(self.whole)
            protocol.connectionLost(Failure(ResponseDone()))


def outcome(d: Deferred[Any]) -> list[Any]:
    out: list[Any] = []
    d.addBoth(out.append)
    return out


def test_an_answer_complete_when_its_body_is_asked_for_arms_no_idle_timer() -> None:
    clock = CountingClock()
    got = outcome(ensureDeferred(collect(Answer(b'{"a": 1}'), Idle(clock, 5))))
    assert got == [b'{"a": 1}']
    assert clock.armed == 0 and clock.getDelayedCalls() == []


def test_an_answer_still_arriving_is_watched_and_its_silence_ends_it() -> None:
    clock = CountingClock()
    answer = Answer(None)
    got = outcome(ensureDeferred(collect(answer, Idle(clock, 5))))
    assert clock.armed == 1 and got == []
    clock.advance(4)
    answer.protocol.dataReceived(b"part")  # data puts the deadline off again
    clock.advance(4)
    assert got == []
    clock.advance(1.5)
    assert len(got) == 1 and isinstance(got[0], Failure) and got[0].check(StreamIdle)
    assert answer.transport.stopped


def test_an_answer_still_arriving_that_ends_leaves_no_timer() -> None:
    clock = CountingClock()
    answer = Answer(None)
    got = outcome(ensureDeferred(collect(answer, Idle(clock, 5))))
    answer.protocol.dataReceived(b"all")
    answer.protocol.connectionLost(Failure(ResponseDone()))
    assert got == [b"all"] and clock.getDelayedCalls() == []


@pytest.mark.parametrize("whole", [b"x", None])
def test_without_an_idle_limit_no_timer_is_ever_armed(whole: bytes | None) -> None:
    clock = CountingClock()
    answer = Answer(whole)
    ensureDeferred(collect(answer, None))
    if whole is None:
        answer.protocol.dataReceived(b"y")
    assert clock.armed == 0


@pytest.mark.parametrize("heard_at", [[1.0], [1.0, 3.0, 4.5], [0.5, 2.0, 4.0, 6.0, 9.5, 12.0]])
def test_the_silence_is_counted_from_the_last_chunk_heard_to_the_instant(heard_at: list[float]) -> None:
    """A stream is cut exactly ``idle`` seconds after its last chunk, never before, whatever the
    chunks before it; a chunk moves no timer (it notes when it was heard, and the timer, when due,
    waits again for what is left)."""
    clock = CountingClock()
    answer = Answer(None)
    got = outcome(ensureDeferred(collect(answer, Idle(clock, 5))))
    for at in heard_at:
        clock.advance(at - clock.seconds())
        answer.protocol.dataReceived(b"chunk")
        assert got == []
    armed = clock.armed
    clock.advance(heard_at[-1] + 5 - 0.001 - clock.seconds())
    assert got == []
    clock.advance(0.001)
    assert len(got) == 1 and isinstance(got[0], Failure) and got[0].check(StreamIdle)
    assert clock.armed <= armed + 1 and clock.getDelayedCalls() == []
