"""The one place routerd reads a Twisted ``Deferred``'s internals (issue 20: performance tricks
fenced, each with what it measured).

:class:`Woken` reads ``Deferred.called``, ``.paused`` and ``.result`` — attributes that are not
part of Deferred's documented API but have kept their meaning for many releases; the versions
relied on are pinned in ``pyproject.toml`` (``twisted[tls]>=24.3,<27``, tested with 26.10) and
``tests/unit/test_held_requests.py`` exercises every branch (fired before or after the await,
failed, cancelled).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, TypeVar

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

__all__ = ["Woken"]

T = TypeVar("T")


class Woken(Generator["Deferred[T]", object, T]):
    """``await Woken(waiter)`` is ``await waiter`` without the generator ``Deferred.__await__``
    makes: a held request keeps this slotted object instead.  Twisted's coroutine driver is yielded
    the Deferred as usual, then sends its result back or throws its failure in.

    Measured (issue 14, ``benchmarks/held_footprint.py``): with the other cuts of that commit a
    request held in the lending queue went from 4.47 to 2.62 KB besides its body; the generator
    this replaces was one of the objects each held request kept."""

    __slots__ = ("_waiter",)

    def __init__(self, waiter: Deferred[T]) -> None:
        self._waiter: Deferred[T] | None = waiter

    def __await__(self) -> Generator[Deferred[T], object, T]:
        return self

    def send(self, value: object) -> Deferred[T]:
        waiter, self._waiter = self._waiter, None
        if waiter is None:  # resumed by the driver: ``value`` is what the waiter fired with
            raise StopIteration(value)
        if waiter.called and not waiter.paused:  # woken before it was awaited (admitted on arrival)
            if isinstance(waiter.result, Failure):
                return waiter.__await__().send(None)  # raises it as ``await waiter`` would
            raise StopIteration(waiter.result)
        return waiter

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Deferred[T]:
        self._waiter = None
        exc = typ if isinstance(typ, BaseException) else (val if isinstance(val, BaseException) else typ(val))
        raise exc.with_traceback(tb) if tb is not None else exc
