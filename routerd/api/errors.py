"""The one place an error becomes an HTTP answer, and the one route idiom.

Every API class declares its routes with a class-level :class:`~routerd.api.routes.Routes`, whose
Klein app (:func:`api_app`) has :func:`_handle` as its only error handler, so a route method just
raises :class:`~routerd.errors.StatusError` (sync or async) and the envelope of its path family is
written here.
"""

from __future__ import annotations

from typing import Any

from klein import Klein
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest
from werkzeug.exceptions import MethodNotAllowed, NotFound
from werkzeug.routing import RequestRedirect

from routerd.errors import ErrorStyle, HTTPError, StatusError, error_body, style_for_path
from routerd.routing.call import Reply

log = Logger()


#: The answer to a failure that is not an HTTP error (logged where it is caught).
INTERNAL_ERROR = HTTPError(500, "internal error", "internal_error", "internal_error")


def answer_error(request: IRequest, err: StatusError, style: ErrorStyle | None = None) -> bytes:
    """Set ``err``'s status and content type on ``request`` and return its envelope."""
    if style is None:
        style = style_for_path(request.path.decode("utf-8", "replace"))
    request.setResponseCode(err.status)
    request.setHeader(b"content-type", b"application/json")
    return error_body(style, err.message, err.type, err.code)


def reply_error(reply: Reply, path: str, err: StatusError) -> bytes:
    """:func:`answer_error` for a :class:`~routerd.routing.call.Reply` (the lean HTTP edge)."""
    reply.set_status(err.status)
    reply.set_header(b"content-type", b"application/json")
    return error_body(style_for_path(path), err.message, err.type, err.code)


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


def master_only() -> HTTPError:
    return HTTPError(404, "site routes are served by the master only", "not_found", "not_found")
