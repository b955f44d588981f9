"""One resource over several API objects: each request goes to the object whose class-level Klein
app has its path (an exact path is a dict lookup; branch routes match by prefix), and an unknown
path or method is answered here with the contract's 404/405 envelope.

The inference paths skip Klein: an API object may offer ``lean_routes(table)``, filling a
:class:`LeanRoutes` with handlers that take the request's facts (:class:`~routerd.routing.call.Incoming`)
and a :class:`~routerd.routing.call.Reply`, never a Twisted request.  The lean HTTP channel
(:mod:`routerd.api.channel`) calls them for the requests it parses itself; a request it hands to
twisted.web reaches them here, with Klein's contract kept — the handler's bytes (or Deferred of
bytes) are written and the request finished once; a client that disconnects cancels the
handler's Deferred; a failure is answered by the same error handler the Klein apps use.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from klein import Klein
from twisted.internet.defer import CancelledError, Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import resource, server
from twisted.web.iweb import IRequest

from routerd.api.errors import answer_error, handle_failure, method_not_allowed, not_found
from routerd.api.reply import RequestReply, incoming
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

    def __init__(self, apis: Iterable[Any]) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._exact: dict[str, list[tuple[frozenset[str], resource.IResource]]] = {}
        self._prefixes: list[tuple[str, frozenset[str], resource.IResource]] = []
        self.lean = LeanRoutes()
        self.apis: tuple[Any, ...] = tuple(apis)  # what it serves (the OpenAPI test reads their rules)
        for api in self.apis:
            lean = getattr(api, "lean_routes", None)
            if lean is not None:
                lean(self.lean)
            app: Klein = api.app
            target = app.resource()
            for rule in app.url_map.iter_rules():
                methods = frozenset(rule.methods or ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH"))
                if "<" in rule.rule:
                    self._prefixes.append((rule.rule.split("<", 1)[0], methods, target))
                else:
                    self._exact.setdefault(rule.rule, []).append((methods, target))
        self._prefixes.sort(key=lambda entry: -len(entry[0]))

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
