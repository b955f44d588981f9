"""Helpers shared by the unit tests."""

from __future__ import annotations

from typing import TypeVar

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

T = TypeVar("T")


def fired(d: Deferred[T]) -> T:
    """The result of an already-fired Deferred (a SyncRunner never leaves one pending)."""
    results: list[T | Failure] = []
    d.addBoth(results.append)
    assert results, "Deferred has not fired"
    result = results[0]
    if isinstance(result, Failure):
        result.raiseException()
    return result
