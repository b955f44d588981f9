"""The deadlines of a connection on the node's HTTP edge (``server.*``), one rule for both edges.

:func:`due` is pure: from what a connection is doing (its state and since when, since when its
output is backed up, when its arriving body must be complete) it returns what the reaper does now
(:meth:`~routerd.api.channel.NodeServerFactory.reap`, once a second):

- an answer whose output has not drained ``send_timeout`` after it backed up (in any state: the
  client stopped reading, also after a hand-over to twisted.web's channel), or a connection asked
  to close that has not after ``send_timeout``: ``"abort"``;
- a head not complete ``head_timeout`` after its first byte: a 408;
- a body without a byte for ``body_timeout``, or not complete in the time its declared length
  takes at ``min_body_rate`` bytes a second (at least ``body_deadline_floor``) after its head
  (:func:`body_deadline`): a 408;
- an idle keep-alive connection after the site's ``timeOut``, or a connection from outside
  ``allowed_cidrs`` that has sent nothing ``head_timeout`` after it was accepted: ``"close"``.
"""

from __future__ import annotations

from typing import Literal

from routerd.config.schema import ServerConfig
from routerd.errors import HTTPError

Due = Literal["abort", "close"] | HTTPError | None


def head_timed_out() -> HTTPError:
    return HTTPError(408, "the request head was not received in time (server.head_timeout)",
                     "invalid_request_error", "request_timeout")


def body_timed_out() -> HTTPError:
    return HTTPError(408, "the request body stopped arriving (server.body_timeout)",
                     "invalid_request_error", "request_timeout")


def body_too_slow() -> HTTPError:
    return HTTPError(408, "the request body arrived slower than server.min_body_rate allows",
                     "invalid_request_error", "request_timeout")


def body_deadline(limits: ServerConfig, now: float, length: int) -> float:
    """When a body of ``length`` declared bytes whose head came ``now`` must be complete: its length
    at ``server.min_body_rate`` bytes a second, and never sooner than ``server.body_deadline_floor``
    (0.0: no such deadline)."""
    if not limits.min_body_rate or not length:
        return 0.0
    return now + max(limits.body_deadline_floor, length / limits.min_body_rate)


def due(limits: ServerConfig, idle: float | None, now: float, state: str, since: float,
        blocked_at: float | None, body_by: float, silent_outsider: bool) -> Due:
    """What the reaper does to a connection now (see the module docstring)."""
    waited = now - since
    if blocked_at is not None and now - blocked_at > limits.send_timeout:
        return "abort"
    if state == "head" and limits.head_timeout and waited > limits.head_timeout:
        return head_timed_out()
    if state == "body" and limits.body_timeout and waited > limits.body_timeout:
        return body_timed_out()
    if state == "body" and body_by and now > body_by:
        return body_too_slow()
    if state == "idle" and idle and waited > idle:
        return "close"
    if silent_outsider and waited > limits.head_timeout:
        return "close"
    if state == "closing" and waited > limits.send_timeout:
        return "abort"
    return None


__all__ = ["body_deadline", "body_timed_out", "body_too_slow", "due", "head_timed_out"]
