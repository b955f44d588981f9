"""Which failures of an upstream call (a node's own backend, or another node it forwards to) are
expected network events rather than bugs: the connection refused, reset, lost or closed before the
answer was complete.  The request path answers those with one warning line; anything else is a
defect and keeps its traceback.
"""

from __future__ import annotations

from twisted.internet.error import ConnectError, ConnectionClosed
from twisted.web.client import RequestTransmissionFailed, ResponseFailed, ResponseNeverReceived
from twisted.web.http import PotentialDataLoss

#: Failures of the connection itself (refused, timed out, reset, lost, closed).
_NETWORK = (ConnectError, ConnectionClosed, PotentialDataLoss)
#: The HTTP client's wrappers around such failures (each holds the underlying reasons).
_WRAPPED = (ResponseFailed, ResponseNeverReceived, RequestTransmissionFailed)


def upstream_gone(exc: BaseException) -> str | None:
    """A one-line reason when ``exc`` is the upstream connection failing, else ``None``.

    A wrapper counts only when every reason it holds is a connection failure: a wrapped bug (a
    parser error, say) is still a bug.
    """
    if isinstance(exc, _NETWORK):
        return _describe(exc)
    if isinstance(exc, _WRAPPED):
        reasons = [r.value for r in exc.reasons]
        if reasons and all(isinstance(r, _NETWORK) for r in reasons):
            return "; ".join(_describe(r) for r in reasons)
    return None


def _describe(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return " ".join(text.split())
