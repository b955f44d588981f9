"""A request waiting in a lane queue: a small record woken by a callback (held requests stay small).

A held request does not wait as a coroutine suspended on a ``Deferred`` of its own (ten thousand
held requests would keep ten thousand such frames): it waits as a :class:`WaitingRequest`: the call,
what it is served as, the ``Deferred`` its caller awaits (``result``) and a state — nothing else.
The service wakes it with a ticket (:meth:`wake`); only then does a coroutine run (serving it here,
or lending it), and when that coroutine hands the request back to the queue (a lent request
returned) the record waits again.

States: ``ARRIVING`` (being queued, or queued again: a ticket that comes now is kept until
:meth:`wait`, so the arrival's own bookkeeping finishes first), ``WAITING`` (held), ``RUNNING`` (a
ticket's work in progress) and ``DONE``.  ``result`` fires exactly once: with the answer, the
work's failure, or ``CancelledError`` when the caller cancels it (a client gone): a waiting request
is then taken out of the queue by :meth:`Steward.cancel_waiting`, a running one's work is
cancelled.

This is the one place a request is held, so it is also where a held request is shaped for
memory (:func:`shape_for_hold`): the strings every request repeats are shared rather than kept
once per held request, and the parsed JSON body is dropped (a held request then costs its raw
body, not that and its decoded copy); it is decoded again when the request moves on
(:func:`parsed_again`).  Measured (``benchmarks/held_footprint.py``): see ``README.md``
"Performance", "Memory".
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Protocol, TypeVar

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from routerd.catalog.model import ModelConfig
from routerd.routing.call import Call
from routerd.wire.lending import Lane

__all__ = ["ARRIVING", "DONE", "RUNNING", "WAITING", "RunLocal", "Steward", "WaitingRequest", "parsed_again",
           "shape_for_hold"]

T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)

ARRIVING, WAITING, RUNNING, DONE = 0, 1, 2, 3

#: Serves an admitted request on this node: ``(call, model, public_id) -> final bytes``.
RunLocal = Callable[[Call, ModelConfig, str], Awaitable[bytes]]


async def no_local(call: Call, _model: ModelConfig, _public_id: str) -> bytes:
    """The :data:`RunLocal` of a lending service built without one (tests that never admit)."""
    raise RuntimeError(f"no local server runs {call.request_id}: the lending service has no run_local")


def shape_for_hold(call: Call) -> bool:
    """Shape ``call`` for a wait in a lane queue: the path (one of the inference paths), a plain
    content type and the model name it selects recur across requests, so one shared copy of each
    is kept (a content type with parameters, such as a multipart boundary, does not recur); the
    parsed body is dropped.  Whether there was a parsed body to drop.

    The edge's reply was told the model name for its access line: told again, it keeps the shared
    copy too (naming is idempotent)."""
    call.path = sys.intern(call.path)
    if ";" not in call.content_type:
        call.content_type = sys.intern(call.content_type)
    if call.selector:
        call.selector = sys.intern(call.selector)
        call.reply.name_model(call.selector)
    if call.parsed is None:
        return False
    call.parsed = None
    return True


def parsed_again(call: Call) -> None:
    """Decode the body :func:`shape_for_hold` dropped, as the request moves on."""
    call.parsed = json.loads(call.body)


class Steward(Protocol[T_contra]):
    """What wakes and runs a :class:`WaitingRequest` (the lending service)."""

    def run_ticket(self, held: WaitingRequest[Any], ticket: T_contra) -> Deferred[bytes | None]:
        """Start what ``ticket`` says; the Deferred fires with the answer, or with None when the
        request went back to its queue (it called :meth:`WaitingRequest.park_again` first)."""

    def cancel_waiting(self, held: WaitingRequest[Any]) -> None:
        """The caller gave up while the request waited: take it out of its queue."""


class WaitingRequest(Generic[T]):
    """One request held in a lane queue (see the module docstring)."""

    __slots__ = ("steward", "call", "model", "lane", "model_id", "public_id", "run_local", "owner",
                 "result", "state", "_ticket", "_running", "_shed")

    def __init__(self, steward: Steward[T], call: Call, model: ModelConfig, lane: Lane, model_id: str,
                 public_id: str, run_local: RunLocal, owner: bool) -> None:
        self.steward = steward
        self.call = call
        self.model = model
        self.lane = lane
        self.model_id = model_id
        self.public_id = public_id
        self.run_local = run_local  # what an admitted request runs (one shared callable)
        self.owner = owner  # an own request of a model that owns a link (its events are reported)
        self.result: Deferred[bytes] = Deferred(self._cancelled)
        self.state = ARRIVING
        self._ticket: T | None = None  # a ticket that came while arriving
        self._running: Deferred[bytes | None] | None = None
        self._shed = False  # its parsed body was dropped while it waited

    def wake(self, ticket: T) -> None:
        """The queue's verdict: admit, lend or hand back.  Kept while the request is arriving."""
        if self.state == ARRIVING:
            self._ticket = ticket
        elif self.state == WAITING:
            self._run(ticket)

    def wait(self) -> None:
        """The arrival is done: run the ticket that came meanwhile, or wait for one."""
        ticket, self._ticket = self._ticket, None
        if ticket is not None:
            self._run(ticket)
        elif self.state == ARRIVING:
            self.state = WAITING
            self._shed = shape_for_hold(self.call)  # held: only the raw body stays in memory

    def park_again(self) -> None:
        """Called by the running work as it puts the request back in its queue: a ticket that
        comes from here on is kept until the work has returned (then :meth:`wait` runs it)."""
        self.state = ARRIVING

    def _run(self, ticket: T) -> None:
        self.state = RUNNING
        self._restore()
        running = self.steward.run_ticket(self, ticket)
        self._running = running
        running.addCallbacks(self._ran, self._failed)

    def _restore(self) -> None:
        if self._shed:
            self._shed = False
            parsed_again(self.call)

    def _ran(self, answer: bytes | None) -> None:
        self._running = None
        if answer is None:  # back in the queue (park_again was called)
            self.wait()
            return
        self.state = DONE
        if not self.result.called:
            self.result.callback(answer)

    def _failed(self, failure: Failure) -> None:
        self._running = None
        self.state = DONE
        if not self.result.called:
            self.result.errback(failure)

    def _cancelled(self, _result: Deferred[bytes]) -> None:
        """``result`` was cancelled: cancel the running work (its failure fires ``result``), or
        take a waiting request out of its queue (``result`` then fails with ``CancelledError``)."""
        if self.state == RUNNING:
            running = self._running
            if running is not None:
                running.cancel()
        elif self.state != DONE:
            self.state = DONE
            self._ticket = None
            self._restore()  # the caller's bookkeeping may read the parsed body
            self.steward.cancel_waiting(self)
