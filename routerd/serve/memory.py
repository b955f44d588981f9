"""Giving memory back after a crowd of requests has gone (issue 14).

Ten thousand held requests leave the C allocator's heap full of free chunks between the few live
ones; glibc keeps those pages until told.  :class:`Trimmer` asks ``malloc_trim`` once the node's
requests drop back to none after at least ``crowd`` were in at once.  A no-op where there is no
glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable

from twisted.internet.interfaces import IReactorTime

__all__ = ["Trimmer", "malloc_trim"]


def _libc_trim() -> Callable[[], None] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int

    def release() -> None:
        trim(0)

    return release


malloc_trim = _libc_trim()


class Trimmer:
    """Counts requests in; once they were ``crowd`` or more and are all gone, trims after ``delay``."""

    def __init__(self, clock: IReactorTime, trim: Callable[[], None] | None = malloc_trim,
                 crowd: int = 1000, delay: float = 1.0) -> None:
        self.clock = clock
        self.trim = trim
        self.crowd = crowd
        self.delay = delay
        self.peak = 0
        self._pending: object | None = None

    def entered(self, active: int) -> None:
        if active > self.peak:
            self.peak = active

    def left(self, active: int) -> None:
        if active or self.peak < self.crowd or self.trim is None or self._pending is not None:
            return
        self._pending = self.clock.callLater(self.delay, self._run)

    def _run(self) -> None:
        self._pending = None
        self.peak = 0
        assert self.trim is not None
        self.trim()
