"""Ask many nodes the same thing at once, a bounded number at a time.

The master's health polls, its runtime-status collection and the site API's decision and summary
documents all fan out to every node; this is the one way they do it.  Each target's answer or
failure comes back in the order the targets were given (so "the first configured one wins" stays
true), and one slow or failing node never fails the others.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from twisted.internet import defer
from twisted.python.failure import Failure

T = TypeVar("T")
R = TypeVar("R")


async def fan_out(targets: Sequence[T], ask: Callable[[T], defer.Deferred[R]],
                  concurrency: int) -> list[tuple[T, R | Failure]]:
    """``ask(target)`` for every target, at most ``concurrency`` in flight; each answer or failure."""
    semaphore = defer.DeferredSemaphore(max(1, concurrency))
    calls: list[defer.Deferred[Any]] = [semaphore.run(ask, target) for target in targets]
    results = await defer.DeferredList(calls, consumeErrors=True)
    return [(target, value) for target, (_ok, value) in zip(targets, results, strict=True)]


def failure_text(failure: Failure) -> str:
    """A short reason for a failed ask (the error's ``reason`` when it has one)."""
    reason = getattr(failure.value, "reason", None)
    return str(reason) if reason else (failure.getErrorMessage() or repr(failure.value))


__all__ = ["fan_out", "failure_text"]
