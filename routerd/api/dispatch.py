"""One resource over several API objects, built from their declared routes
(:class:`~routerd.api.routes.RouteTable`): each request goes to the object whose route has its
path (an exact path is a dict lookup; branch and template routes match by prefix), and an unknown
path or method is answered here with the contract's 404/405 envelope.

The inference paths skip Klein: a route declared ``lean`` (:meth:`~routerd.api.routes.Routes.lean`)
is a handler that takes the request's facts (:class:`~routerd.routing.call.Incoming`) and a
:class:`~routerd.routing.call.Reply`, never a Twisted request; they fill a :class:`LeanRoutes`.
The lean HTTP channel (:mod:`routerd.api.channel`) calls them for the requests it parses itself;
a request it hands to twisted.web reaches them here, with Klein's contract kept — the handler's
bytes (or Deferred of bytes) are written and the request finished once; a client that disconnects
cancels the handler's Deferred; a failure is answered by the same error handler the Klein apps use.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from twisted.internet.defer import CancelledError, Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import resource, server
from twisted.web.iweb import IRequest

from routerd.api.errors import answer_error, handle_failure, method_not_allowed, not_found
from routerd.api.facts import RouteFacts
from routerd.api.reply import RequestReply, incoming
from routerd.api.routes import RouteTable, routes_of
from routerd.cluster.auth import RouteClass
from routerd.routing.call import Incoming, Reply

#: ``handler(method, path, facts, reply)`` -> the answer's final bytes, or a Deferred of them.
LeanHandler = Callable[[str, str, Incoming, Reply], "Deferred[bytes] | bytes"]

log = Logger()


class LeanRoutes:
    """The paths served from a request's facts alone: exact paths and path prefixes."""

    def __init__(self) -> None:
        self.exact: dict[bytes, LeanHandler] = {}
        self.prefixes: list[tuple[bytes, LeanHandler]] = []

    def add(self, path: str, handler: LeanHandler) -> None:
        self.exact[path.encode()] = handler

    def add_prefix(self, prefix: str, handler: LeanHandler) -> None:
        self.prefixes.append((prefix.encode(), handler))

    def find(self, path: bytes) -> LeanHandler | None:
        """The handler of the raw request path ``path`` (no query), or None."""
        handler = self.exact.get(path)
        if handler is None:
            for prefix, candidate in self.prefixes:
                if path.startswith(prefix):
                    return candidate
        return handler


class Dispatch(resource.Resource):
    isLeaf = True

    def __init__(self, apis: Iterable[object]) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._exact: dict[str, list[tuple[frozenset[str], resource.IResource]]] = {}
        self._prefixes: list[tuple[str, frozenset[str], resource.IResource]] = []
        self.lean = LeanRoutes()
        self.apis: tuple[object, ...] = tuple(apis)
        #: Every route of every API object: what is served here, and the auth class of a path.
        self.routes = RouteTable(self.apis)
        #: The facts of a path (see :meth:`RouteTable.facts`): what the guard's admission reads,
        #: the table's own method (a frame a request fewer than a method calling it).
        self.route_facts: Callable[[str], RouteFacts] = self.routes.facts
        for api in self.apis:
            routes = routes_of(api)
            target: resource.IResource | None = None
            for declared in routes.declared:
                if declared.lean:
                    handler: LeanHandler = getattr(api, declared.handler)
                    if declared.branch:
                        self.lean.add_prefix(declared.path, handler)
                    else:
                        self.lean.add(declared.path, handler)
                    continue
                if target is None:
                    target = routes.bound(api).resource()
                methods = declared.answered
                if declared.branch or declared.prefix is None:
                    self._exact.setdefault(declared.path, []).append((methods, target))
                if declared.prefix is not None:
                    self._prefixes.append((declared.prefix, methods, target))
        self._prefixes.sort(key=lambda entry: -len(entry[0]))

    def route_class(self, path: str) -> RouteClass:
        """The auth class of ``path`` (see :meth:`RouteTable.route_class`)."""
        return self.routes.route_class(path)

    def render(self, request: IRequest) -> Any:
        path = request.path.decode("utf-8", "replace")
        method = request.method.decode("ascii", "replace")
        lean = self.lean.find(request.path)
        if lean is not None:
            return render_direct(request, lambda: lean(method, path, incoming(request, path),
                                                       RequestReply(request)))
        candidates = self._exact.get(path)
        if candidates is None:
            candidates = [(m, t) for prefix, m, t in self._prefixes if path.startswith(prefix)]
        allowed: set[str] = set()
        for methods, target in candidates:
            if method in methods:
                return target.render(request)
            allowed |= methods
        if allowed:
            request.setHeader(b"allow", ", ".join(sorted(allowed)).encode())
            return answer_error(request, method_not_allowed(path))
        return answer_error(request, not_found(path))


def render_direct(request: IRequest, handler: Callable[[], Any]) -> Any:
    """Run ``handler`` for ``request`` as a Klein route would be run (see the module docstring)."""
    try:
        result = handler()
    except Exception:  # noqa: BLE001 - answered by the one error handler
        return handle_failure(request, Failure())
    if not isinstance(result, Deferred):
        return result
    finished = [False]

    def gone(_: object) -> None:
        finished[0] = True
        result.cancel()

    def done(_: object) -> None:
        finished[0] = True

    request.notifyFinish().addCallbacks(done, gone)  # type: ignore[attr-defined]
    result.addCallbacks(lambda body: _write(request, body, finished),
                        lambda failure: _failed(request, failure, finished))
    return server.NOT_DONE_YET


def _write(request: IRequest, body: bytes, finished: list[bool]) -> None:
    if finished[0]:
        return
    if body:
        request.write(body)
    request.finish()


def _failed(request: IRequest, failure: Failure, finished: list[bool]) -> None:
    if finished[0]:
        if not failure.check(CancelledError):
            log.failure("unhandled error after the request finished", failure=failure)
        return
    try:
        body = handle_failure(request, failure)
    except Exception:  # noqa: BLE001 - never leave the request open
        log.failure("error handler failed")
        body = b""
    _write(request, body, finished)
