"""One resource over several API objects: each request goes to the object whose class-level Klein
app has its path (an exact path is a dict lookup; branch routes match by prefix), and an unknown
path or method is answered here with the contract's 404/405 envelope."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from klein import Klein
from twisted.web import resource
from twisted.web.iweb import IRequest

from routerd.api.errors import answer_error, method_not_allowed, not_found


class Dispatch(resource.Resource):
    isLeaf = True

    def __init__(self, apis: Iterable[Any]) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._exact: dict[str, list[tuple[frozenset[str], resource.IResource]]] = {}
        self._prefixes: list[tuple[str, frozenset[str], resource.IResource]] = []
        self.apis: tuple[Any, ...] = tuple(apis)  # what it serves (the OpenAPI test reads their rules)
        for api in self.apis:
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
