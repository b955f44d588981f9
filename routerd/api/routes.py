"""Every route of the HTTP edge, declared once, with its facts.

A route is declared where its handler is, by the decorator of its API class's :class:`Routes`::

    class NodeAPI:
        routes = Routes()

        @routes.route("/router/v1/node/models", methods=["GET"], auth="cluster")
        def models(self, request: IRequest) -> bytes: ...

        @routes.lean(INFERENCE_PATHS, methods=["POST"], auth="inference")
        def serve(self, method: str, path: str, facts: Incoming, reply: Reply) -> Deferred[bytes]: ...

Each declaration records (path, methods, handler and the route's facts: auth class, error family,
phases; :class:`~routerd.api.facts.RouteFacts`) as a :class:`Declared`; a ``route`` also registers
the handler with the class's Klein app (its twisted.web answer), a ``lean`` one is served from a
request's facts alone (:class:`~routerd.api.dispatch.LeanRoutes`).  From the declarations of a
site's API classes, :class:`RouteTable` gives everything that must agree about routes:
:class:`~routerd.api.dispatch.Dispatch` builds its Klein and lean tables from it, its
:meth:`RouteTable.facts` gives admission and the error writer the facts of any path, and the OpenAPI
check compares its :attr:`Declared.docs` paths with ``openapi.yaml``.  It is the only source of
those facts: no path list beside it says which paths need which key, which envelope an error takes,
or which are served while the node starts or drains.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import attrs
from klein import Klein

from routerd.api.errors import api_app
from routerd.api.facts import READY, Phase, RouteFacts, namespace_facts
from routerd.cluster.auth import RouteClass
from routerd.errors import ErrorStyle, style_for_path

__all__ = ["ANY_METHOD", "Declared", "RouteTable", "Routes", "routes_of"]

#: What a route declared with no methods answers (as werkzeug's rule without methods does).
ANY_METHOD = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH"})

_PARAMETER = re.compile(r"<(?:\w+:)?(\w+)>")
_CONVERTER = re.compile(r"<(?:(\w+):)?\w+>")

Handler = TypeVar("Handler", bound=Callable[..., Any])


@attrs.frozen
class Declared:
    """One route: what the table, the dispatcher, admission and the OpenAPI check read."""

    #: An exact path, a werkzeug template (``/jobs/<job_id>``) or, for a branch, its prefix (``/ui/``).
    path: str
    #: The methods declared; None answers any method.
    methods: frozenset[str] | None
    auth: RouteClass
    #: The name of the API class's method that answers it.
    handler: str
    #: Matches every path under ``path`` (which ends in ``/``) as well as ``path`` itself.
    branch: bool = False
    #: Served from the request's facts (:data:`~routerd.api.dispatch.LeanHandler`), not by Klein.
    lean: bool = False
    #: The OpenAPI path templates it is documented under (``openapi.yaml``).
    docs: tuple[str, ...] = ()
    #: Its error family (by default its namespace's, :func:`~routerd.errors.style_for_path`).
    errors: ErrorStyle = "openai"
    #: The phases it is served in, what happens to it in others (see :class:`RouteFacts`).
    phases: frozenset[Phase] = READY
    returns: bool = False
    forwards: str | None = None

    @property
    def facts(self) -> RouteFacts:
        return RouteFacts(self.auth, self.errors, self.phases, self.returns, self.forwards)

    @property
    def prefix(self) -> str | None:
        """The prefix a path must start with to be this route's (a branch or template), or None
        for an exact path."""
        if self.branch:
            return self.path
        if "<" in self.path:
            return self.path.split("<", 1)[0]
        return None

    @property
    def answered(self) -> frozenset[str]:
        """The methods the route answers: any when none is declared, HEAD with GET (werkzeug adds it)."""
        if self.methods is None:
            return ANY_METHOD
        return self.methods | {"HEAD"} if "GET" in self.methods else self.methods


def _docs(path: str, branch: bool, docs: Sequence[str] | None) -> tuple[str, ...]:
    if docs is not None:
        return tuple(docs)
    if branch:
        return (path + "{path}",)
    return (_PARAMETER.sub(r"{\1}", path),)


def _template(path: str) -> re.Pattern[str]:
    """The paths a werkzeug template matches: a ``<name>`` is one segment, a ``<path:name>`` any."""
    parts = _CONVERTER.split(path)
    out = [re.escape(parts[0])]
    for index in range(1, len(parts), 2):
        out += ".+" if parts[index] == "path" else "[^/]+", re.escape(parts[index + 1])
    return re.compile("".join(out))


def _methods(methods: Iterable[str] | None) -> frozenset[str] | None:
    return None if methods is None else frozenset(m.upper() for m in methods)


class Routes:
    """The routes of one API class (a class attribute), declared by its decorators."""

    def __init__(self) -> None:
        #: The class's Klein app, every ``route`` registered with it (its error handler installed).
        self.klein: Klein = api_app()
        self.declared: list[Declared] = []

    def route(self, path: str, *, methods: Sequence[str] | None, auth: RouteClass, branch: bool = False,
              docs: Sequence[str] | None = None, phases: frozenset[Phase] = READY,
              errors: ErrorStyle | None = None) -> Callable[[Handler], Handler]:
        """Declare ``path`` answered by the decorated method with a Twisted request (through Klein).

        ``docs`` are the OpenAPI paths that document it: by default its path (``<name>`` as
        ``{name}``), or for a branch its prefix followed by ``{path}``; ``()`` for a route that is
        not an operation (a catch-all answering 404).  ``phases`` and ``errors``: see
        :class:`~routerd.api.facts.RouteFacts` (the error family defaults to the path's namespace's)."""
        def declare(handler: Handler) -> Handler:
            self.declared.append(Declared(path, _methods(methods), auth, handler.__name__, branch,
                                          False, _docs(path, branch, docs), errors or style_for_path(path),
                                          phases))
            return self.klein.route(path, methods=list(methods) if methods is not None else None,
                                    branch=branch)(handler)
        return declare

    def lean(self, paths: str | Iterable[str], *, methods: Sequence[str], auth: RouteClass,
             branch: bool = False, phases: frozenset[Phase] = READY, returns: bool = False,
             forwards: bool = False) -> Callable[[Handler], Handler]:
        """Declare ``paths`` answered by the decorated method from the request's facts alone: a
        :data:`~routerd.api.dispatch.LeanHandler` (the lean HTTP channel serves these itself).
        A ``branch`` path is a prefix: every path under it is the route's; a ``forwards`` branch's
        rest is another of the node's paths (see :class:`~routerd.api.facts.RouteFacts`)."""
        def declare(handler: Handler) -> Handler:
            for path in [paths] if isinstance(paths, str) else sorted(paths):
                self.declared.append(Declared(path, _methods(methods), auth, handler.__name__, branch,
                                              True, _docs(path, branch, None), style_for_path(path), phases,
                                              returns, path.rstrip("/") if forwards else None))
            return handler
        return declare

    def bound(self, api: object) -> Klein:
        """The class's Klein app bound to the API object ``api`` (its routes called on ``api``)."""
        return self.klein.__get__(api, type(api))


def routes_of(api: object) -> Routes:
    """The :class:`Routes` of an API object (or class); TypeError when it declares none."""
    routes = getattr(api, "routes", None)
    if not isinstance(routes, Routes):
        raise TypeError(f"{type(api).__name__} declares no routes (a class attribute routes = Routes())")
    return routes


class RouteTable:
    """The routes of a site's API objects together, and the facts of any path."""

    def __init__(self, apis: Iterable[object]) -> None:
        self.routes: tuple[Declared, ...] = tuple(d for api in apis for d in routes_of(api).declared)
        self._exact: dict[str, RouteFacts] = {}
        #: (prefix, the template's pattern or None for a branch, facts)
        prefixes: list[tuple[str, re.Pattern[str] | None, RouteFacts]] = []
        for declared in self.routes:
            facts = declared.facts
            self._exact.setdefault(declared.path, facts)
            if declared.prefix is not None:
                pattern = None if declared.branch else _template(declared.path)
                prefixes.append((declared.prefix, pattern, facts))
        prefixes.sort(key=lambda entry: -len(entry[0]))  # stable: the first declared wins a tie
        self._prefixes = tuple(prefixes)

    def facts(self, path: str) -> RouteFacts:
        """The facts of ``path`` (no query): its route's (an exact path, a template it matches, the
        longest branch it is under), else those of its namespace
        (:func:`~routerd.api.facts.namespace_facts`: ``/router/v1/node/…`` cluster, other
        ``/router/…`` admin, anything else inference), so an unknown path needs the same
        credential as its neighbours before it is answered 404."""
        found = self._exact.get(path)
        if found is not None:
            return found
        for prefix, pattern, facts in self._prefixes:
            if path.startswith(prefix) and (pattern is None or pattern.fullmatch(path) is not None):
                return facts
        return namespace_facts(path)

    def route_class(self, path: str) -> RouteClass:
        """The auth class of ``path`` (see :meth:`facts`)."""
        return self.facts(path).auth
