"""The one place an error becomes an HTTP answer, and the one route idiom.

Every API class declares its routes with a class-level :class:`~routerd.api.routes.Routes`, whose
Klein app (:func:`api_app`) has :func:`_handle` as its only error handler, so a route method just
raises :class:`~routerd.errors.StatusError` (sync or async) and its answer is written here:
:func:`answer_error` into a Twisted request, :func:`write_error` into a
:class:`~routerd.routing.call.Reply` (the lean edge, lean handlers); the refusals both edges write
before reading a body (:func:`~routerd.api.access.refusal`) take the same answer.  Status, headers
(``Retry-After`` included) and envelope all come from :func:`routerd.errors.error_answer`, in the
error family of the request's route (:attr:`~routerd.api.facts.RouteFacts.errors`, which admission
put in its verdict), else that of the path's namespace.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from klein import Klein
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest
from werkzeug.exceptions import MethodNotAllowed, NotFound
from werkzeug.routing import RequestRedirect

from routerd.api.reply import request_family
from routerd.errors import ErrorStyle, HTTPError, StatusError, error_answer, style_for_path
from routerd.routing.call import Reply

log = Logger()


#: The answer to a failure that is not an HTTP error (logged where it is caught).
INTERNAL_ERROR = HTTPError(500, "internal error", "internal_error", "internal_error")


@runtime_checkable
class KnowsFamily(Protocol):
    """A reply that knows its route's error family (the edges' own replies)."""

    @property
    def error_family(self) -> ErrorStyle: ...


def answer_error(request: IRequest, err: StatusError, style: ErrorStyle | None = None) -> bytes:
    """Set ``err``'s status and headers on ``request`` and return its envelope (in ``style``, by
    default the request's route's family)."""
    status, headers, body = error_answer(err, style or request_family(request))
    request.setResponseCode(status)
    for name, value in headers:
        request.setHeader(name, value)
    return body


def write_error(reply: Reply, err: StatusError, style: ErrorStyle) -> bytes:
    """Set ``err``'s status and headers on ``reply`` and return its envelope in ``style``."""
    status, headers, body = error_answer(err, style)
    reply.set_status(status)
    for name, value in headers:
        reply.set_header(name, value)
    return body


def reply_error(reply: Reply, path: str, err: StatusError) -> bytes:
    """:func:`write_error` in the family of the reply's route (its path's namespace's when the
    reply does not know it)."""
    family = reply.error_family if isinstance(reply, KnowsFamily) else style_for_path(path)
    return write_error(reply, err, family)


def failure_error(failure: Failure, path: str) -> StatusError:
    """What a route that failed on ``path`` answers: its StatusError, else a logged 500."""
    if failure.check(StatusError):
        return failure.value  # type: ignore[return-value]
    # The dispatcher matched a branch prefix but werkzeug's rule did not (its path converter
    # refuses a newline, %0A, in the rest of the path): an unknown path, not a server error.
    # werkzeug's redirect to the path with its slashes merged or added (``/ui//x``): the contract's
    # paths are exact, so an unknown path, not a server error.
    if failure.check(NotFound, RequestRedirect):
        return not_found(path)
    if failure.check(MethodNotAllowed):
        return method_not_allowed(path)
    log.failure("unhandled error on {path}", failure=failure, path=path)
    return INTERNAL_ERROR


def reply_failure(reply: Reply, path: str, failure: Failure) -> bytes:
    """:func:`handle_failure` for a :class:`~routerd.routing.call.Reply`."""
    return reply_error(reply, path, failure_error(failure, path))


def _handle(_api: Any, request: IRequest, failure: Failure) -> bytes:
    return handle_failure(request, failure)


def handle_failure(request: IRequest, failure: Failure) -> bytes:
    """The answer to a route that failed: a StatusError's envelope, else a logged 500."""
    return answer_error(request, failure_error(failure, request.path.decode("utf-8", "replace")))


def api_app() -> Klein:
    """A class-level Klein for one API class, with the error handler installed."""
    app = Klein()
    app.url_map.merge_slashes = False  # ``/ui//x`` is not ``/ui/x``: no redirect, the path as sent
    app.handle_errors(Exception)(_handle)  # type: ignore[arg-type]
    return app


def not_found(path: str) -> HTTPError:
    return HTTPError(404, f"endpoint not found: {path}", "not_found", "not_found")


def method_not_allowed(path: str) -> HTTPError:
    return HTTPError(405, f"method not allowed on {path}", "method_not_allowed", "method_not_allowed")


def require_method(method: str, allowed: str, path: str, reply: Reply) -> None:
    """A lean route answers its one method (the lean table is looked up by path whatever the
    method): 405 with ``Allow`` otherwise."""
    if method != allowed:
        reply.set_header(b"allow", allowed.encode())
        raise method_not_allowed(path)


def require_post(method: str, path: str, reply: Reply) -> None:
    """:func:`require_method` for POST, what most lean routes answer."""
    require_method(method, "POST", path, reply)
