"""The client API (contract §5; inference keys): health, metrics, model listings and inference
(OpenAI, Anthropic, Ollama, SD-WebUI, Kobold), and the master's forwarded inference (cluster token).

A route parses the request and calls the node's inference front (:mod:`routerd.inference.front`); the
listings are the node's documents.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.web.iweb import IRequest

from routerd import __version__
from routerd.api.errors import reply_error, require_method, require_post
from routerd.api.facts import EVERY_PHASE
from routerd.api.jsonio import json_response, read_json
from routerd.api.routes import Routes
from routerd.api.site import authenticated
from routerd.catalog.model import Capabilities
from routerd.errors import HTTPError
from routerd.inference.front import InferenceFront
from routerd.inference.keepalive import OllamaControl
from routerd.inference.video import VideoJobs
from routerd.lending.offload import borrowed_from_headers
from routerd.paths import INFERENCE_PREFIX
from routerd.routing.adapters import ollama
from routerd.routing.adapters.ollama import Mode
from routerd.routing.call import Incoming, Reply
from routerd.routing.classify import INFERENCE_PATHS, Route, classify
from routerd.routing.jobs import job_path
from routerd.routing.selector import MAX_MODEL_BYTES, model_too_long

Listing = Callable[[Callable[[Capabilities], bool]], list[ollama.ListedModel]]


def _TEXT(caps: Capabilities) -> bool:
    return caps.llm or caps.embeddings


#: The route of a POST to each inference path, classified once (classify took ~8 calls a request).
_POSTED: dict[str, Route | None] = {path: classify("POST", path) for path in INFERENCE_PATHS}

# Ollama routes whose empty requests load / unload a model (see routerd.inference.keepalive).
_OLLAMA_CONTROL: dict[str, Mode] = {"ollama_chat": "chat", "ollama_generate": "generate"}



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

    @routes.route("/health", methods=["GET"], auth="health", phases=EVERY_PHASE)
    def health(self, request: IRequest) -> bytes:
        """200 ``ok`` when ready, 503 ``starting``/``draining``; node details only to a caller
        the guard found authenticated (load balancers need no key and learn nothing more)."""
        phase = self.phase()
        if phase != "ready":
            return json_response(request, {"status": phase}, 503)
        if not authenticated(request):
            return json_response(request, {"status": "ok"})
        return json_response(request, {"status": "ok", "node_id": self.node_id, "role": self.role})

    @routes.route("/metrics", methods=["GET"], auth="metrics", phases=EVERY_PHASE)
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
        route = _POSTED[path] if method == "POST" and path in _POSTED else classify(method, path)
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

    @routes.lean(INFERENCE_PREFIX + "/", methods=["POST"], auth="cluster", branch=True, forwards=True)
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


__all__ = ["ClientAPI", "Listing"]
