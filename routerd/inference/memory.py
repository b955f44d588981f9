"""The node's memory tricks, fenced in one module, each with what it measured.

* :class:`Trimmer` — giving memory back after a crowd of requests has gone.  Ten thousand held
  requests leave the C allocator's heap full of free chunks between the few live ones; glibc keeps
  those pages until told.  It runs a full garbage collection and asks ``malloc_trim`` (glibc, through
  ``ctypes``) once the node's requests drop back to none after at least ``crowd`` were in at once
  (only the collection where there is no glibc).  Measured with ``benchmarks/held.py`` (10,000 held
  4 KB requests): after the drain +56 MB stayed with pymalloc, +10 MB with ``PYTHONMALLOC=malloc``
  (the shipped unit and Dockerfile), where the trim reaches the freed pages.
* :func:`freeze_start_up` — ``gc.freeze()`` once a node is ready.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from collections.abc import Callable

from twisted.internet.interfaces import IReactorTime

__all__ = ["Trimmer", "freeze_start_up", "malloc_trim"]


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


def freeze_start_up() -> None:
    """Move every object alive now out of the collector's sight for good: what start-up built
    (catalog, config, imported modules) lives as long as the node, and a full collection no longer
    walks it on the reactor thread.  Measured: full collections paused the reactor for
    15-60 ms at start-up, the latency spikes of the first minutes."""
    gc.freeze()


class Trimmer:
    """Counts requests in; once they were ``crowd`` or more and are all gone, collects and trims
    after ``delay``.

    The collection comes first: a crowd's requests leave reference cycles behind (the HTTP edge's
    and client's objects, some thirty per request) that an idle node's collector would not reach
    for a long time, since nothing allocates any more; freed, their memory can then be trimmed
    (a drained 3,000-request crowd left 46 MB of RSS without it, 31 MB with it)."""

    def __init__(self, clock: IReactorTime, trim: Callable[[], None] | None = malloc_trim,
                 crowd: int = 1000, delay: float = 1.0,
                 collect: Callable[[], object] = gc.collect) -> None:
        self.clock = clock
        self.trim = trim
        self.collect = collect
        self.crowd = crowd
        self.delay = delay
        self.peak = 0
        self._pending: object | None = None

    def entered(self, active: int) -> None:
        if active > self.peak:
            self.peak = active

    def left(self, active: int) -> None:
        if active or self.peak < self.crowd or self._pending is not None:
            return
        self._pending = self.clock.callLater(self.delay, self._run)

    def _run(self) -> None:
        self._pending = None
        self.peak = 0
        self.collect()
        if self.trim is not None:
            self.trim()
