"""Routes declared once: one declaration per route (path, methods, handler and its facts: auth
class, error family, phases) in ``routerd.api.routes``, from which the dispatcher, the lean table,
admission and the OpenAPI check (``test_openapi``) are built."""

from __future__ import annotations

import json

import pytest
from treq.testing import StubTreq
from twisted.internet.defer import succeed
from twisted.web.iweb import IRequest

from routerd.api.dispatch import Dispatch
from routerd.api.facts import served
from routerd.api.routes import Declared, Routes, RouteTable, routes_of
from routerd.cluster.auth import AuthPolicy, route_class
from routerd.edge import build_site
from routerd.errors import style_for_path
from routerd.paths import INFERENCE_PREFIX, RELAY_PATH
from routerd.routing.call import Incoming, Reply

from .node_fixture import TEXT, World

#: Paths no route declares, around and under the declared ones (each must keep today's class).
UNDECLARED = [
    "/", "/x", "/v1", "/v1/unknown", "/api", "/api/unknown", "/healthz", "/health/", "/metrics/x",
    "/openapi.yaml", "/openapi.json/x", "/router", "/router/", "/router/v1", "/router/v1/",
    "/router/v1/node", "/router/v1/node/", "/router/v1/nodes", "/router/v1/node/nope",
    "/router/v1/node/inference", "/router/v1/node/inference/v1/chat/completions",
    "/router/v1/node/inference//x", "/router/v1/node/assets/" + "a" * 64, "/router/v1/node/assets/",
    "/router/v1/node/site/model-assets/export", "/router/v1/node/site/model-assets/jobs/j-1/events",
    "/router/v1/site", "/router/v1/site/", "/router/v1/site/nope", "/router/v1/site/model-assets/" + "b" * 64,
    "/router/v1/site/model-assets/jobs/n-1/events", "/router/v2/anything", "/ui", "/ui/", "/ui/app.js",
    "/ui//x", "/UI/x", "/v1/chat/completions/", "//router/v1/node/models",
]


@pytest.fixture(scope="module")
def site_routes(tmp_path_factory: pytest.TempPathFactory) -> Dispatch:
    world = World(tmp_path_factory.mktemp("routes"))
    site = build_site(world.node("solo", {"chat": TEXT}))
    dispatch = site.resource.inner  # GuardResource → Dispatch
    assert isinstance(dispatch, Dispatch)
    return dispatch


def _examples(declared: Declared) -> list[str]:
    """Paths the route answers: its own, and for a branch or template one under its prefix."""
    if declared.prefix is None:
        return [declared.path]
    return [declared.path, declared.prefix + "x", declared.prefix + "x/y"]


def test_every_declared_route_has_the_class_the_auth_policy_gives_its_path(site_routes: Dispatch) -> None:
    """The table's classifier and ``AuthPolicy.check``'s (``cluster.auth.route_class``) agree on
    every declared route, so the lead can switch admission to the table without a change."""
    table = site_routes.routes
    assert len(table.routes) > 80
    for declared in table.routes:
        assert declared.auth == route_class(declared.path), declared
        for path in _examples(declared):
            assert table.route_class(path) == route_class(path), (declared, path)


@pytest.mark.parametrize("path", UNDECLARED)
def test_an_undeclared_path_keeps_the_class_of_its_namespace(site_routes: Dispatch, path: str) -> None:
    assert site_routes.route_class(path) == route_class(path)


def test_the_policy_refuses_what_the_table_classifies_for_every_declared_route(
        site_routes: Dispatch) -> None:
    """With every kind of credential configured, a caller with none is refused on exactly the
    declared routes whose class needs one (health, docs and the WebUI's files need none)."""
    policy = AuthPolicy.build(["inf-key"], ["adm-key"], "cluster-token", ["127.0.0.0/8"],
                              metrics_keys=["met-key"])
    open_classes = {"health", "docs", "ui"}
    for declared in site_routes.routes.routes:
        refused = False
        try:
            policy.check(declared.path, "127.0.0.1", None, site_routes.route_class(declared.path))
        except Exception:  # noqa: BLE001 - HTTPError 401: what is asserted
            refused = True
        assert refused == (site_routes.route_class(declared.path) not in open_classes), declared


class _Api:
    """Two Klein routes, a template, a branch and a lean path, one declared outside its namespace."""

    routes = Routes()

    @routes.route("/router/v1/thing", methods=["GET", "POST"], auth="admin")
    def thing(self, request: IRequest) -> bytes:
        return b"thing " + request.method

    @routes.route("/router/v1/open", methods=["GET"], auth="inference")
    def open(self, request: IRequest) -> bytes:
        return b"open"

    @routes.route("/router/v1/jobs/<job_id>", methods=["GET"], auth="admin")
    def job(self, request: IRequest, job_id: str) -> bytes:
        return job_id.encode()

    @routes.route("/files/", methods=["GET"], auth="inference", branch=True, docs=("/files/{name}",))
    def files(self, request: IRequest) -> bytes:
        return request.path

    @routes.lean(["/v1/a", "/v1/b"], methods=["POST"], auth="inference")
    def lean(self, method: str, path: str, facts: Incoming, reply: Reply) -> object:
        return succeed(b"lean " + path.encode() + b" " + facts.body)


def test_a_route_records_path_methods_auth_handler_and_docs() -> None:
    declared = {(d.path, d.handler): d for d in _Api.routes.declared}
    assert declared["/router/v1/thing", "thing"] == Declared(
        "/router/v1/thing", frozenset({"GET", "POST"}), "admin", "thing", docs=("/router/v1/thing",))
    assert declared["/router/v1/thing", "thing"].answered == {"GET", "HEAD", "POST"}
    assert declared["/router/v1/jobs/<job_id>", "job"].docs == ("/router/v1/jobs/{job_id}",)
    assert declared["/router/v1/jobs/<job_id>", "job"].prefix == "/router/v1/jobs/"
    assert declared["/files/", "files"].prefix == "/files/"
    assert declared["/v1/a", "lean"].lean and declared["/v1/b", "lean"].lean


def test_the_table_classifies_by_declaration_before_the_namespace() -> None:
    """A declared class decides (``/router/v1/open`` is declared inference, its namespace says
    admin): the classifier reads the table, not only the path's prefix."""
    table = RouteTable([_Api()])
    assert table.route_class("/router/v1/open") == "inference"
    assert table.route_class("/router/v1/thing") == "admin"
    assert table.route_class("/files/deep/file.txt") == "inference"
    assert table.route_class("/router/v1/other") == "admin"
    assert table.route_class("/router/v1/node/x") == "cluster"


def _call(client: StubTreq, method: str, url: str, body: bytes = b"") -> tuple[int, bytes, list[bytes]]:
    out: list[object] = []
    client.request(method, url, data=body or None).addCallback(
        lambda r: out.append(r) or r.content()).addCallback(out.append)
    client.flush()
    response, content = out
    return response.code, content, response.headers.getRawHeaders(b"allow", [])  # type: ignore[attr-defined]


def test_dispatch_serves_the_declared_routes_and_answers_the_rest_404_or_405() -> None:
    client = StubTreq(Dispatch([_Api()]))
    assert _call(client, "POST", "http://n/router/v1/thing")[:2] == (200, b"thing POST")
    assert _call(client, "GET", "http://n/router/v1/jobs/j-7")[:2] == (200, b"j-7")
    assert _call(client, "GET", "http://n/files/a/b")[:2] == (200, b"/files/a/b")
    assert _call(client, "POST", "http://n/v1/b", b"{}")[:2] == (200, b"lean /v1/b {}")
    status, body, allow = _call(client, "DELETE", "http://n/router/v1/thing")
    assert (status, allow) == (405, [b"GET, HEAD, POST"])
    assert json.loads(body)["error"]["code"] == "method_not_allowed"
    assert _call(client, "GET", "http://n/router/v1/nothing")[0] == 404


def test_dispatch_fills_the_lean_table_from_the_lean_declarations() -> None:
    dispatch = Dispatch([_Api()])
    assert set(dispatch.lean.exact) == {b"/v1/a", b"/v1/b"}
    assert dispatch.lean.find(b"/router/v1/thing") is None


def test_an_api_object_without_declared_routes_is_refused() -> None:
    class Bare:
        pass

    with pytest.raises(TypeError, match="declares no routes"):
        Dispatch([Bare()])


def test_every_klein_rule_of_the_site_comes_from_a_declaration(site_routes: Dispatch) -> None:
    """Nothing reaches Klein but through ``Routes.route`` (a branch is its root and its rest)."""
    for api in site_routes.apis:
        routes = routes_of(api)
        expected: list[str] = []
        for declared in routes.declared:
            if declared.lean:
                continue
            if declared.branch:
                expected.append(declared.path.rstrip("/") + "/<path:__rest__>")
            expected.append(declared.path)
        assert sorted(rule.rule for rule in routes.klein.url_map.iter_rules()) == sorted(expected), api


def test_the_site_declares_each_path_and_method_once(site_routes: Dispatch) -> None:
    seen: set[tuple[str, str]] = set()
    for declared in site_routes.routes.routes:
        for method in declared.methods or ():
            assert (declared.path, method) not in seen, declared
            seen.add((declared.path, method))


def test_every_route_and_undeclared_path_has_the_error_family_of_its_namespace(site_routes: Dispatch) -> None:
    """The table's error families are the envelopes the paths were always answered in (Ollama's
    under ``/api/``, but Kobold's ``/api/v1`` and ``/api/extra``; OpenAI's everywhere else)."""
    table = site_routes.routes
    for declared in table.routes:
        assert declared.errors == style_for_path(declared.path), declared
        for path in _examples(declared):
            assert table.facts(path).errors == style_for_path(path), (declared, path)
    for path in UNDECLARED + ["/api/chat", "/api/v1/generate", "/api/extra/tokencount", "/api/nope"]:
        assert table.facts(path).errors == style_for_path(path), path
    assert table.facts("/api/chat").errors == "ollama"


def test_the_routes_served_while_starting_or_draining_are_the_declared_ones(site_routes: Dispatch) -> None:
    table = site_routes.routes
    starting = {d.path for d in table.routes if "starting" in d.phases}
    draining = {d.path for d in table.routes if "draining" in d.phases}
    assert starting == {"/health", "/metrics", "/openapi.json"}
    assert draining == starting | {"/sdcpp/v1/jobs/<job_id>", "/sdcpp/v1/jobs/<job_id>/cancel"}
    assert all("ready" in d.phases for d in table.routes)
    forwarded = INFERENCE_PREFIX + "/sdcpp/v1/jobs/job-1"
    assert served(table.facts, forwarded, "draining") and not served(table.facts, forwarded, "starting")
    assert not served(table.facts, INFERENCE_PREFIX + "/v1/chat/completions", "draining")
    assert not served(table.facts, "/v1/nope", "draining") and served(table.facts, "/v1/nope", "ready")
    assert served(table.facts, "/sdcpp/v1/jobs/job-1/cancel", "draining")
    assert not served(table.facts, "/sdcpp/v1/jobs/job-1/x", "draining")  # no job route's path
    assert not served(table.facts, "/sdcpp/v1/jobs/", "draining")
    assert [d.path for d in table.routes if d.returns] == [RELAY_PATH]
