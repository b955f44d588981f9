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


class FakeReply:
    """A :class:`routerd.routing.call.Reply` that records what it was given."""

    def __init__(self) -> None:
        self.status = 200
        self.headers: dict[bytes, bytes] = {}
        self.written: list[bytes] = []
        self.aborted = False
        self.gone = False

    @property
    def started(self) -> bool:
        return bool(self.written)

    def set_status(self, code: int) -> None:
        self.status = code

    def set_header(self, name: bytes, value: bytes) -> None:
        self.headers[name] = value

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def abort(self) -> None:
        self.aborted = True

    def name_model(self, name: str) -> None:
        self.model = name
