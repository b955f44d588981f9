"""``routing.upstream.upstream_gone``: which upstream failures are expected network events."""

from __future__ import annotations

from twisted.internet.error import ConnectionDone, ConnectionLost, ConnectionRefusedError
from twisted.python.failure import Failure
from twisted.web.client import ResponseFailed, ResponseNeverReceived

from routerd.routing.upstream import upstream_gone


def test_refused_lost_and_closed_connections_are_expected_with_a_one_line_reason() -> None:
    assert "refused" in (upstream_gone(ConnectionRefusedError("127.0.0.1:9")) or "")
    assert "lost" in (upstream_gone(ConnectionLost()) or "")
    assert "closed" in (upstream_gone(ResponseFailed([Failure(ConnectionDone())])) or "")
    assert upstream_gone(ResponseNeverReceived([Failure(ConnectionLost())])) is not None


def test_a_wrapped_bug_or_any_other_exception_is_not_an_expected_failure() -> None:
    assert upstream_gone(ResponseFailed([Failure(ValueError("bad header"))])) is None
    assert upstream_gone(ResponseFailed([])) is None
    assert upstream_gone(KeyError("model")) is None
