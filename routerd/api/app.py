"""The HTTP edge of one node: the client API (contract §5), the node API (§6) and the admin API
(§7), and :func:`build_site`, which puts every API class of ``routerd.api`` in front of a node.

Each API is a class whose routes are declared by its class-level :class:`~routerd.api.routes.Routes`
(path, methods, auth class, handler), built from the collaborators it calls; a route parses the
request, calls one collaborator and answers.  Errors are raised as ``StatusError`` and answered by
the one handler in :mod:`routerd.api.errors`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import attrs
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.web.iweb import IRequest

from routerd import __version__, documents
from routerd.api.analytics_routes import AnalyticsAPI, AnalyticsNode
from routerd.api.assets_routes import AssetsAPI, AssetsNode
from routerd.api.bench_routes import BenchAPI, BenchNode
from routerd.api.browser import browser_rules
from routerd.api.cook_routes import CookAPI
from routerd.api.decisions_routes import DecisionsAPI
from routerd.api.dispatch import Dispatch
from routerd.api.errors import master_only, not_found, reply_error, require_method, require_post
from routerd.api.guardians_routes import GuardiansAPI, GuardiansNode
from routerd.api.jobs_routes import JobsAPI
from routerd.api.jsonio import json_response, read_json
from routerd.api.lending_http import LendingNode
from routerd.api.links_routes import LinksAPI
from routerd.api.offload_routes import OffloadAPI
from routerd.api.openapi import OpenAPI
from routerd.api.push_routes import PushAPI
from routerd.api.reload_routes import ReloadAPI
from routerd.api.remote import remote_answer
from routerd.api.reply import query_arg
from routerd.api.routes import Routes
from routerd.api.settings_routes import SettingsAPI
from routerd.api.site import GuardResource, NodeSite, authenticated
from routerd.api.webui import WebUI, webui_dir
from routerd.catalog.model import Capabilities
from routerd.clients.node_client import ClusterError, RemoteError
from routerd.errors import HTTPError
from routerd.inference.admin import UNLOAD_TARGETS, ModelAdmin
from routerd.inference.front import InferenceFront
from routerd.inference.keepalive import OllamaControl
from routerd.inference.video import VideoJobs
from routerd.lending.offload import borrowed_from_headers
from routerd.lending.reports import DecisionsNode, site_states
from routerd.routing.adapters import ollama
from routerd.routing.adapters.ollama import Mode
from routerd.routing.call import Incoming, Reply
from routerd.routing.classify import INFERENCE_PATHS, Route, classify
from routerd.routing.forward import INFERENCE_PREFIX
from routerd.routing.jobs import job_path
from routerd.routing.selector import MAX_MODEL_BYTES, model_too_long
from routerd.wire.records import PROTOCOL_VERSION
from routerd.wire.status import status_to_json

if TYPE_CHECKING:
    from routerd.catalog.catalog import Catalog
    from routerd.cluster.auth import AuthPolicy
    from routerd.cluster.master import MasterAgent
    from routerd.inference.recipes import RecipeRouter
    from routerd.lending.coordinator import Coordinator
    from routerd.lending.service import LendingService
    from routerd.metrics import NodeMetrics
    from routerd.process.reload import Reloader
    from routerd.store.store import Store
    from routerd.wire.records import ModelRecord
    from routerd.wire.status import RuntimeStatus

__all__ = ["PROTOCOL_VERSION", "AdminAPI", "AdminNode", "ClientAPI", "NodeAPI", "NodeDocuments", "ServedNode",
           "build_site"]

Listing = Callable[[Callable[[Capabilities], bool]], list[ollama.ListedModel]]


def _TEXT(caps: Capabilities) -> bool:
    return caps.llm or caps.embeddings


# Ollama routes whose empty requests load / unload a model (see routerd.inference.keepalive).
_OLLAMA_CONTROL: dict[str, Mode] = {"ollama_chat": "chat", "ollama_generate": "generate"}


def _model_arg(body: dict[str, Any]) -> str:
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise HTTPError(400, "model is required")
    return name


def _node_arg(body: dict[str, Any]) -> str:
    node_id = body.get("node_id")
    if not isinstance(node_id, str) or not node_id:
        raise HTTPError(400, "node_id is required")
    return node_id


async def _on_remote(master: MasterAgent, node_id: str, call: Callable[[str], Deferred[Any]]) -> None:
    """Run a node API call on a remote node; its error answered as the node gave it, or 502."""
    info = master.registry.node(node_id)
    if info is None:
        raise HTTPError(404, f"node {node_id!r} is not known", "not_found", "node_not_found")
    try:
        await call(info.node_url)
    except RemoteError as exc:
        raise HTTPError(exc.status, exc.message, exc.type, exc.code) from None
    except ClusterError as exc:
        raise HTTPError(502, f"node {node_id!r} did not answer: {exc.reason}", "backend_error",
                        "node_unreachable") from None


class ClientAPI:
    """Health, metrics, model listings and inference (OpenAI, Ollama, SD-WebUI, Kobold)."""

    routes = Routes()

    def __init__(self, *, node_id: str, role: str, front: InferenceFront, listing: Listing,
                 image_listing: Callable[[], list[dict[str, Any]]], metrics: Callable[[], bytes],
                 phase: Callable[[], str] = lambda: "ready",
                 ollama_control: OllamaControl | None = None, jobs: VideoJobs | None = None) -> None:
        self.ollama_control = ollama_control
        self.jobs = jobs
        self.node_id = node_id
        self.phase = phase
        self.role = role
        self.front = front
        self.listing = listing
        self.image_listing = image_listing
        self.metrics = metrics

    @routes.route("/health", methods=["GET"], auth="health")
    def health(self, request: IRequest) -> bytes:
        """200 ``ok`` when ready, 503 ``starting``/``draining``; node details only to a caller
        the guard found authenticated (load balancers need no key and learn nothing more)."""
        phase = self.phase()
        if phase != "ready":
            return json_response(request, {"status": phase}, 503)
        if not authenticated(request):
            return json_response(request, {"status": "ok"})
        return json_response(request, {"status": "ok", "node_id": self.node_id, "role": self.role})

    @routes.route("/metrics", methods=["GET"], auth="metrics")
    def metrics_text(self, request: IRequest) -> bytes:
        request.setHeader(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")
        return self.metrics()

    @routes.route("/v1/models", methods=["GET"], auth="inference")
    def v1_models(self, request: IRequest) -> bytes:
        return json_response(request, ollama.openai_models(self.listing(_TEXT)))

    @routes.route("/api/tags", methods=["GET"], auth="inference")
    def api_tags(self, request: IRequest) -> bytes:
        return json_response(request, ollama.ollama_tags(self.listing(_TEXT)))

    @routes.route("/api/ps", methods=["GET"], auth="inference")
    def api_ps(self, request: IRequest) -> bytes:
        return json_response(request, ollama.ollama_ps(self.listing(_TEXT)))

    @routes.route("/api/version", methods=["GET"], auth="inference")
    def api_version(self, request: IRequest) -> bytes:
        return json_response(request, {"version": __version__})

    @routes.route("/api/show", methods=["POST"], auth="inference")
    def api_show(self, request: IRequest) -> bytes:
        body = read_json(request, optional=True)
        name = body.get("model", body.get("name"))
        if not isinstance(name, str) or not name:
            raise HTTPError(400, "model is required")
        if model_too_long(name):
            raise HTTPError(400, f"model name is longer than {MAX_MODEL_BYTES} bytes")
        entries = [e for e in self.listing(lambda c: True) if e.name == name]
        if not entries:
            raise HTTPError(404, f"model '{name}' not found", "not_found", "model_not_found")
        return json_response(request, ollama.ollama_show(entries[0]))

    @routes.route("/sdapi/v1/sd-models", methods=["GET"], auth="inference")
    def sd_models(self, request: IRequest) -> bytes:
        return json_response(request, self.image_listing())

    @routes.lean(INFERENCE_PATHS, methods=["POST"], auth="inference")
    def serve(self, method: str, path: str, facts: Incoming, reply: Reply) -> Deferred[bytes]:
        """Serve the inference request ``facts`` (a client inference path) into ``reply``; both
        HTTP edges call this: the lean channel (:mod:`routerd.api.channel`) and, for requests it
        hands over, the Twisted one (:class:`~routerd.api.dispatch.Dispatch`)."""
        route = classify(method, path)
        if route is None:
            reply.set_header(b"allow", b"POST")
            raise HTTPError(405, f"method not allowed on {path}", "method_not_allowed", "method_not_allowed")
        if self.ollama_control is not None and route.kind in _OLLAMA_CONTROL:
            return ensureDeferred(self._ollama(path, facts, reply, route))
        return ensureDeferred(self.front.handle(facts, reply, route))

    async def _ollama(self, path: str, facts: Incoming, reply: Reply, route: Route) -> bytes:
        """Ollama's preload / unload requests are answered here; others are noted for their
        ``keep_alive`` and served as usual."""
        assert self.ollama_control is not None
        try:
            body = json.loads(facts.body) if facts.body.strip() else None
        except ValueError:
            body = None
        if isinstance(body, dict):
            try:
                answer = await self.ollama_control.handle(_OLLAMA_CONTROL[route.kind], body)
            except HTTPError as err:
                return reply_error(reply, path, err)
            if answer is not None:
                reply.set_header(b"content-type", b"application/json")
                return json.dumps(answer).encode()
        return await self.front.handle(facts, reply, route)

    @routes.lean(INFERENCE_PREFIX + "/", methods=["POST"], auth="cluster", branch=True)
    def serve_forwarded(self, method: str, path: str, facts: Incoming, reply: Reply) -> Deferred[bytes]:
        """Forwarded inference from the master (cluster token checked by the guard); borrowed
        work when the master's relay marked it so.  ``path`` is the full path, with the prefix."""
        inner = path[len(INFERENCE_PREFIX):]
        job = job_path(inner)
        if job is not None and self.jobs is not None:  # a master passing on a video job's poll
            require_method(method, "POST" if job[1] == "cancel" else "GET", path, reply)
            return ensureDeferred(self.jobs.answer(job[0], job[1], reply))
        route = classify("POST", inner) if inner.startswith("/") and not inner.startswith(("//", "/\\")) \
            else None
        require_post(method, path, reply)
        if route is None:
            raise HTTPError(404, f"{inner!r} is not an inference path", "not_found", "not_found")
        facts = attrs.evolve(facts, path=inner)
        return ensureDeferred(self.front.handle(facts, reply, route, cluster_call=True,
                                                borrowed=borrowed_from_headers(facts.header)))


class _Registrar(Protocol):
    def register(self, body: Any) -> dict[str, Any]: ...


class NodeDocuments(Protocol):
    """What the node API reads of a node: its documents, and the master's registration."""

    @property
    def master(self) -> _Registrar | None: ...

    def snapshot(self) -> dict[str, Any]: ...

    def runtime_status(self) -> RuntimeStatus: ...

    def state_document(self) -> dict[str, Any]: ...


class NodeAPI:
    """Node API (contract §6; cluster token): registration, documents, loads."""

    routes = Routes()

    def __init__(self, *, node: NodeDocuments, admin: ModelAdmin) -> None:
        self.node = node
        self.admin = admin

    @routes.route("/router/v1/node/register", methods=["POST"], auth="cluster")
    def register(self, request: IRequest) -> bytes:
        if self.node.master is None:
            raise HTTPError(409, "this node is not the master", "cluster_error", "not_master")
        return json_response(request, self.node.master.register(read_json(request, optional=True)))

    @routes.route("/router/v1/node/models", methods=["GET"], auth="cluster")
    def models(self, request: IRequest) -> bytes:
        return json_response(request, self.node.snapshot())

    @routes.route("/router/v1/node/runtime-status", methods=["GET"], auth="cluster")
    def runtime_status(self, request: IRequest) -> bytes:
        return json_response(request, status_to_json(self.node.runtime_status()))

    @routes.route("/router/v1/node/state", methods=["GET"], auth="cluster")
    @routes.route("/router/v1/state", methods=["GET"], auth="admin")
    def state(self, request: IRequest) -> bytes:
        return json_response(request, self.node.state_document())

    @routes.route("/router/v1/node/load", methods=["POST"], auth="cluster")
    async def load(self, request: IRequest) -> bytes:
        return json_response(request, await self.admin.load(_model_arg(read_json(request, optional=True))))

    @routes.route("/router/v1/node/unload", methods=["POST"], auth="cluster")
    async def unload(self, request: IRequest) -> bytes:
        body = read_json(request, optional=True)
        return json_response(request, await self.admin.unload(body.get("model"), body.get("target")))


class AdminNode(Protocol):
    """What the admin and site API reads of a node."""

    @property
    def node_id(self) -> str: ...

    @property
    def public_url(self) -> str: ...

    @property
    def catalog(self) -> Catalog: ...

    @property
    def master(self) -> MasterAgent | None: ...

    @property
    def site(self) -> MasterAgent | None: ...  # the master's agent, or a standalone node's site of one

    @property
    def role(self) -> str: ...

    @property
    def recipes(self) -> RecipeRouter | None: ...

    def records(self) -> list[ModelRecord]: ...

    def state_document(self) -> dict[str, Any]: ...


class AdminAPI:
    """Admin and site API (contract §7; admin keys): version, models, loads, inventory, node state."""

    routes = Routes()

    def __init__(self, *, node: AdminNode, admin: ModelAdmin) -> None:
        self.node = node
        self.admin = admin

    def _site(self) -> MasterAgent:
        """The site the site routes read: the master's, or a standalone node's site of one; 404
        on a slave (reference §12)."""
        if self.node.site is None:
            raise master_only()
        return self.node.site

    @routes.route("/router/v1/version", methods=["GET"], auth="admin")
    def version(self, request: IRequest) -> bytes:
        return json_response(request, {"version": __version__, "protocol_version": PROTOCOL_VERSION,
                                       "minimum_protocol_version": PROTOCOL_VERSION})

    @routes.route("/router/v1/models", methods=["GET"], auth="admin")
    def models(self, request: IRequest) -> bytes:
        return json_response(request, documents.models_document(self.node.node_id, self.node.records(),
                                                                self.node.catalog))

    @routes.route("/router/v1/load", methods=["POST"], auth="admin")
    async def load(self, request: IRequest) -> bytes:
        name = _model_arg(read_json(request, optional=True))
        recipes = self.node.recipes
        recipe = recipes.book.by_public_id(name) if recipes is not None else None
        if recipes is not None and recipe is not None:
            return json_response(request, await remote_answer(recipes.load(recipe)))
        return json_response(request, await self.admin.load(name, site=True))

    @routes.route("/router/v1/unload", methods=["POST"], auth="admin")
    async def unload(self, request: IRequest) -> bytes:
        body = read_json(request, optional=True)
        answer = await self.admin.unload(body.get("model"), body.get("target"), site=True)
        return json_response(request, answer)

    @routes.route("/router/v1/site/inventory", methods=["GET"], auth="admin")
    def inventory(self, request: IRequest) -> bytes:
        site = self._site()
        document = documents.inventory(self.node.node_id, self.node.public_url, site.registry.nodes(),
                                       self.node.records(), role=self.node.role)
        if self.node.recipes is not None:
            document["recipes"] = [r.to_json() for r in self.node.recipes.book.recipes()]
        return json_response(request, document)

    @routes.route("/router/v1/site/recipes", methods=["GET"], auth="admin")
    def recipes_list(self, request: IRequest) -> bytes:
        self._site()
        recipes = self.node.recipes.book.recipes() if self.node.recipes is not None else ()
        return json_response(request, {"recipes": [r.to_json() for r in recipes]})

    @routes.route("/router/v1/site/recipes", methods=["POST"], auth="admin")
    def recipes_save(self, request: IRequest) -> bytes:
        self._site()
        assert self.node.recipes is not None
        saved = self.node.recipes.book.save(read_json(request))
        return json_response(request, {"ok": True, "recipe": saved.to_json()})

    @routes.route("/router/v1/site/recipes", methods=["DELETE"], auth="admin")
    def recipes_delete(self, request: IRequest) -> bytes:
        self._site()
        assert self.node.recipes is not None
        recipe_id = query_arg(request, "id")
        if not recipe_id:
            body = read_json(request, optional=True)
            recipe_id = body.get("id") if isinstance(body.get("id"), str) else None
        if not recipe_id:
            raise HTTPError(400, "id is required")
        removed = self.node.recipes.book.delete(recipe_id)
        return json_response(request, {"ok": True, "recipe": removed.to_json()})

    @routes.route("/router/v1/site/nodes/state", methods=["GET"], auth="admin")
    async def nodes_state(self, request: IRequest) -> bytes:
        site = self._site()
        node_id = query_arg(request, "node_id")
        if not node_id:
            raise HTTPError(400, "node_id is required")
        if node_id == self.node.node_id:
            return json_response(request, self.node.state_document())
        return json_response(request, await site.node_json(node_id, "/router/v1/node/state"))

    @routes.route("/router/v1/site/nodes/states", methods=["GET"], auth="admin")
    async def nodes_states(self, request: IRequest) -> bytes:
        """Every node's ``/state`` in one answer (the WebUI Nodes page), plus ``node_errors``."""
        site = self._site()
        return json_response(request, await site_states(site, self.node.node_id,
                                                        self.node.state_document()))

    @routes.route("/router/v1/site/nodes/load", methods=["POST"], auth="admin")
    async def node_load(self, request: IRequest) -> bytes:
        """Load a model on one named node (``{node_id, model}``; model = that node's local ID)."""
        site = self._site()
        body = read_json(request)
        node_id = _node_arg(body)
        model = _model_arg(body)
        if node_id == self.node.node_id:
            return json_response(request, await self.admin.load(model))
        await _on_remote(site, node_id, lambda url: site.client.load(url, model))
        return json_response(request, {"ok": True, "model": model, "node_id": node_id})

    @routes.route("/router/v1/site/nodes/unload", methods=["POST"], auth="admin")
    async def node_unload(self, request: IRequest) -> bytes:
        """Unload on one named node (``{node_id, model?, target?}`` as that node's ``/unload``)."""
        site = self._site()
        body = read_json(request)
        node_id = _node_arg(body)
        model, target = body.get("model"), body.get("target")
        if model is not None and (not isinstance(model, str) or not model):
            raise HTTPError(400, "model must be a non-empty string")
        if target is not None and target not in UNLOAD_TARGETS:
            raise HTTPError(400, "target must be one of " + ", ".join(UNLOAD_TARGETS))
        if node_id == self.node.node_id:
            return json_response(request, await self.admin.unload(model, target))
        await _on_remote(site, node_id, lambda url: site.client.unload(url, model, target))
        return json_response(request, {"ok": True, "model": model, "node_id": node_id})

    @routes.route("/router/v1/site/", branch=True, methods=None, auth="admin", docs=())  # a 404, no operation
    def site_other(self, request: IRequest) -> bytes:
        self._site()
        raise not_found(request.path.decode("utf-8", "replace"))


class ServedNode(NodeDocuments, AdminNode, AssetsNode, LendingNode, DecisionsNode, GuardiansNode,
                 AnalyticsNode, BenchNode, Protocol):
    """Everything :func:`build_site` reads of a node (``routerd.node.Node`` is one); each API class
    is handed only the part it uses."""

    @property
    def master(self) -> MasterAgent | None: ...

    @property
    def site(self) -> MasterAgent | None: ...

    @property
    def store(self) -> Store | None: ...

    @property
    def catalog(self) -> Catalog: ...

    @property
    def lending(self) -> LendingService: ...

    @property
    def role(self) -> str: ...

    @property
    def phase(self) -> str: ...

    @property
    def front(self) -> InferenceFront: ...

    @property
    def admin(self) -> ModelAdmin: ...

    @property
    def metrics(self) -> NodeMetrics: ...

    @property
    def ollama_control(self) -> OllamaControl: ...

    @property
    def jobs(self) -> VideoJobs: ...

    @property
    def coordinator(self) -> Coordinator | None: ...

    @property
    def reloader(self) -> Reloader: ...

    @property
    def policy(self) -> AuthPolicy: ...

    def listing(self, wanted: Callable[[Capabilities], bool]) -> list[ollama.ListedModel]: ...

    def image_listing(self) -> list[dict[str, Any]]: ...


def build_site(node: ServedNode) -> NodeSite:
    """The listening site of ``node``: body limit and access guard, then every API class."""
    apis: list[Any] = [
        ClientAPI(node_id=node.node_id, role=node.role, front=node.front, listing=node.listing,
                  image_listing=node.image_listing,
                  metrics=node.metrics.render, phase=lambda: node.phase,
                  ollama_control=node.ollama_control, jobs=node.jobs),
        JobsAPI(node.jobs),
        NodeAPI(node=node, admin=node.admin),
        AssetsAPI(node),
        OffloadAPI(coordinator=node.coordinator, lending=node.lending),
        PushAPI(node),
        DecisionsAPI(node),
        AnalyticsAPI(node),
        BenchAPI(node),
        AdminAPI(node=node, admin=node.admin),
        LinksAPI(node),
        SettingsAPI(node),
        ReloadAPI(node.reloader),
        GuardiansAPI(node),
        CookAPI(node),
        WebUI(webui_dir()),
        OpenAPI(),
    ]
    limit = node.config.limits.max_body_bytes
    dispatch = Dispatch(apis)  # dispatch.route_class: the auth class of a path, from the declared routes
    guard = GuardResource(dispatch, node.policy, limit, node.config.server.cors_origins,
                          lambda: node.phase, node.config.server, browser_rules(node.config))
    site = NodeSite(guard, limit, node.config.limits.replay_buffer_bytes)
    node.reloader.on_applied.append(lambda config: guard.update(node.policy, site, config))
    return site
