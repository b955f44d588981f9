"""docs/contract.md's route index (§10) is exactly the routes the API classes declare: every path
(as the OpenAPI document names it, ``{name}`` for a parameter), the methods it answers and the
credential it needs.  The routes are read from every API class's ``Routes`` declarations in
``routerd.api`` (the registry the dispatcher, admission and the OpenAPI check are built from), so a
route added, dropped, given another method or another credential fails here until the contract says
so."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections import defaultdict

import routerd.api
from routerd.api.routes import Declared, Routes

from . import contract_doc


def declared_routes() -> list[Declared]:
    """Every route declared by an API class of ``routerd.api`` (each class once)."""
    out: list[Declared] = []
    seen: set[int] = set()
    for info in pkgutil.iter_modules(routerd.api.__path__, routerd.api.__name__ + "."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            routes = cls.__dict__.get("routes")
            if isinstance(routes, Routes) and id(routes) not in seen:
                seen.add(id(routes))
                out += routes.declared
    return out


def code_index() -> dict[str, tuple[frozenset[str], frozenset[str]]]:
    """Documented path → (methods, credential classes), from the declarations (a route with no
    OpenAPI path, a catch-all answering 404, is no operation and is left out)."""
    methods: dict[str, set[str]] = defaultdict(set)
    auth: dict[str, set[str]] = defaultdict(set)
    for declared in declared_routes():
        for path in declared.docs:
            assert declared.methods is not None, declared
            methods[path] |= declared.methods
            auth[path].add(declared.auth)
    return {path: (frozenset(methods[path]), frozenset(auth[path])) for path in methods}


def contract_index() -> dict[str, tuple[frozenset[str], frozenset[str]]]:
    rows = contract_doc.table_after(contract_doc.section(10), "| path |")
    out: dict[str, tuple[frozenset[str], frozenset[str]]] = {}
    for row in rows:
        (path,) = contract_doc.ticked(row[0])
        assert path not in out, f"{path} is listed twice"
        out[path] = (frozenset(m.strip() for m in row[1].split(",")),
                     frozenset(a.strip() for a in row[2].split(",")))
    return out


def test_the_declarations_read_are_the_whole_api() -> None:
    """Every API family is found: client, node, site, lean relay, WebUI and the docs."""
    index = code_index()
    for path in ("/v1/chat/completions", "/router/v1/node/inference/{path}",
                 "/router/v1/node/offload/request", "/router/v1/site/inventory", "/ui/{file}",
                 "/openapi.json", "/health"):
        assert path in index, path
    assert len(index) > 90


def test_every_declared_route_is_in_the_contract_with_its_methods_and_credential() -> None:
    code, documented = code_index(), contract_index()
    missing = sorted(set(code) - set(documented))
    assert missing == [], "routes missing from the contract's route index"
    wrong = {path: (sorted(code[path][0]), sorted(code[path][1])) for path in code
             if documented[path] != code[path]}
    assert wrong == {}, "the contract gives these routes other methods or credentials"


def test_the_contract_lists_no_route_the_api_does_not_declare() -> None:
    assert sorted(set(contract_index()) - set(code_index())) == []


def test_the_node_inference_route_is_post_only() -> None:
    """The node's forwarded inference answers POST alone (405 with ``Allow: POST`` otherwise):
    the contract's node table says so and no longer says any method."""
    assert code_index()["/router/v1/node/inference/{path}"][0] == {"POST"}
    node_table = contract_doc.section(6)
    assert "`* /inference/{path}`" not in node_table
    assert "`POST /inference/{path}`" in node_table
