"""The Klein app of one node: client API (contract §5), node API (§6), site and admin API (§7)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from klein import Klein
from twisted.internet.defer import ensureDeferred
from twisted.web.iweb import IRequest

from routerd import __version__
from routerd.api import decisions_routes, links_routes, offload_routes, push_routes, settings_routes
from routerd.api.jsonio import json_response, read_json
from routerd.errors import HTTPError, StatusError, error_body, style_for_path
from routerd.lending.service import Borrowed
from routerd.routing.adapters import ollama
from routerd.routing.classify import INFERENCE_PATHS, classify
from routerd.routing.forward import INFERENCE_PREFIX
from routerd.routing.relay import header
from routerd.wire.records import PROTOCOL_VERSION

if TYPE_CHECKING:
    from routerd.node import Node

__all__ = ["PROTOCOL_VERSION", "build_app"]




def _fail(request: IRequest, err: StatusError) -> bytes:
    path = request.path.decode("utf-8", "replace")
    request.setResponseCode(err.status)
    request.setHeader(b"content-type", b"application/json")
    return error_body(style_for_path(path), err.message, err.type, err.code)




def _arg(request: IRequest, name: str) -> str | None:
    values = getattr(request, "args", {}).get(name.encode())
    return values[0].decode("utf-8", "replace") if values else None


def build_app(node: Node) -> Klein:
    app = Klein()

    def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
        """Turn a ``StatusError`` raised by a handler (sync or async) into its envelope."""

        def wrapper(request: IRequest, *args: Any, **kwargs: Any) -> Any:
            def on_error(failure: Any) -> bytes:
                failure.trap(StatusError)
                return _fail(request, failure.value)

            try:
                result = fn(request, *args, **kwargs)
            except StatusError as err:
                return _fail(request, err)
            if hasattr(result, "__await__"):
                return ensureDeferred(result).addErrback(on_error)
            return result

        wrapper.__name__ = fn.__name__
        return wrapper

    def master_only() -> None:
        if node.master is None:
            raise HTTPError(404, "site routes are served by the master only", "not_found", "not_found")

    # -- health and metrics ---------------------------------------------------

    @app.route("/health", methods=["GET"])
    def health(request: IRequest) -> bytes:
        return json_response(request, {"status": "ok", "node_id": node.node_id, "role": node.role})

    @app.route("/metrics", methods=["GET"])
    def metrics(request: IRequest) -> bytes:
        request.setHeader(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")
        return node.metrics.render()

    # -- listings (contract §5): public IDs only --------------------------------

    @app.route("/v1/models", methods=["GET"])
    def v1_models(request: IRequest) -> bytes:
        return json_response(request, ollama.openai_models(node.listing(lambda c: c.llm or c.embeddings)))

    @app.route("/api/tags", methods=["GET"])
    def api_tags(request: IRequest) -> bytes:
        return json_response(request, ollama.ollama_tags(node.listing(lambda c: c.llm or c.embeddings)))

    @app.route("/api/ps", methods=["GET"])
    def api_ps(request: IRequest) -> bytes:
        return json_response(request, ollama.ollama_ps(node.listing(lambda c: c.llm or c.embeddings)))

    @app.route("/api/version", methods=["GET"])
    def api_version(request: IRequest) -> bytes:
        return json_response(request, {"version": __version__})

    @app.route("/api/show", methods=["POST"])
    @guarded
    def api_show(request: IRequest) -> bytes:
        body = read_json(request, optional=True)
        name = body.get("model", body.get("name"))
        if not isinstance(name, str) or not name:
            raise HTTPError(400, "model is required")
        entries = [e for e in node.listing(lambda c: True) if e.name == name]
        if not entries:
            raise HTTPError(404, f"model '{name}' not found", "not_found", "model_not_found")
        return json_response(request, ollama.ollama_show(entries[0]))

    @app.route("/sdapi/v1/sd-models", methods=["GET"])
    def sd_models(request: IRequest) -> bytes:
        return json_response(request, node.image_listing())

    # -- inference ------------------------------------------------------------

    def inference(request: IRequest) -> Any:
        path = request.path.decode("utf-8", "replace")
        route = classify(request.method.decode(), path)
        if route is None:
            request.setHeader(b"allow", b"POST")
            return _fail(request, HTTPError(405, f"method not allowed on {path}", "method_not_allowed",
                                            "method_not_allowed"))
        body = request.content.read() if request.content is not None else b""
        return ensureDeferred(node.front.handle(request, route, path, body))

    for inference_path in sorted(INFERENCE_PATHS):
        app.route(inference_path, methods=["POST", "GET", "PUT", "DELETE", "PATCH"],
                  endpoint="inference:" + inference_path)(inference)

    @app.route(INFERENCE_PREFIX + "/", branch=True, methods=["POST"])
    def node_inference(request: IRequest) -> Any:
        """Forwarded inference from the master (cluster token checked by the guard)."""
        full = request.path.decode("utf-8", "replace")
        path = full[len(INFERENCE_PREFIX):]
        route = classify("POST", path) if path.startswith("/") and not path.startswith(("//", "/\\")) \
            else None
        if route is None:
            return _fail(request, HTTPError(404, f"{path!r} is not an inference path", "not_found",
                                            "not_found"))
        body = request.content.read() if request.content is not None else b""
        borrowed = None
        if request.getHeader(b"x-routerd-offload") == b"1":
            # Only the master's relay sets these; the cluster token proves it.
            borrowed = Borrowed(load_allowed=request.getHeader(b"x-routerd-offload-load") == b"1",
                                restore=request.getHeader(b"x-routerd-offload-restore") == b"1",
                                owner_node_id=header(request, b"x-routerd-offload-owner"),
                                owner_model_id=header(request, b"x-routerd-offload-owner-model"))
        return ensureDeferred(node.front.handle(request, route, path, body, cluster_call=True,
                                                borrowed=borrowed))

    # -- node API (contract §6; cluster token) ---------------------------------

    @app.route("/router/v1/node/register", methods=["POST"])
    @guarded
    def register(request: IRequest) -> bytes:
        if node.master is None:
            raise HTTPError(409, "this node is not the master", "cluster_error", "not_master")
        return json_response(request, node.master.register(read_json(request, optional=True)))

    @app.route("/router/v1/node/models", methods=["GET"])
    def node_models(request: IRequest) -> bytes:
        return json_response(request, node.snapshot())

    @app.route("/router/v1/node/runtime-status", methods=["GET"])
    def runtime_status(request: IRequest) -> bytes:
        return json_response(request, node.runtime_status())

    @app.route("/router/v1/node/state", methods=["GET"])
    @app.route("/router/v1/state", methods=["GET"])
    def state(request: IRequest) -> bytes:
        return json_response(request, node.state_document())

    @app.route("/router/v1/node/load", methods=["POST"])
    @guarded
    async def node_load(request: IRequest) -> bytes:
        return json_response(request, await node.load_model(_model_arg(read_json(request, optional=True))))

    @app.route("/router/v1/node/unload", methods=["POST"])
    @guarded
    async def node_unload(request: IRequest) -> bytes:
        body = read_json(request, optional=True)
        return json_response(request, await node.unload_model(body.get("model"), body.get("target")))

    # -- admin and site API (contract §7) ---------------------------------------

    @app.route("/router/v1/version", methods=["GET"])
    def version(request: IRequest) -> bytes:
        return json_response(request, {"version": __version__, "protocol_version": PROTOCOL_VERSION,
                               "minimum_protocol_version": PROTOCOL_VERSION})

    @app.route("/router/v1/models", methods=["GET"])
    def router_models(request: IRequest) -> bytes:
        return json_response(request, node.models_document())

    @app.route("/router/v1/load", methods=["POST"])
    @guarded
    async def load(request: IRequest) -> bytes:
        name = _model_arg(read_json(request, optional=True))
        return json_response(request, await node.load_model(name, site=True))

    @app.route("/router/v1/unload", methods=["POST"])
    @guarded
    async def unload(request: IRequest) -> bytes:
        body = read_json(request, optional=True)
        result = await node.unload_model(body.get("model"), body.get("target"), site=True)
        return json_response(request, result)

    @app.route("/router/v1/site/inventory", methods=["GET"])
    @guarded
    def inventory(request: IRequest) -> bytes:
        master_only()
        return json_response(request, node.inventory())

    @app.route("/router/v1/site/nodes/state", methods=["GET"])
    @guarded
    async def nodes_state(request: IRequest) -> bytes:
        master_only()
        assert node.master is not None
        node_id = _arg(request, "node_id")
        if not node_id:
            raise HTTPError(400, "node_id is required")
        if node_id == node.node_id:
            return json_response(request, node.state_document())
        return json_response(request, await node.master.node_json(node_id, "/router/v1/node/state"))

    @app.route("/router/v1/site/", branch=True)
    @guarded
    def site_other(request: IRequest) -> bytes:
        master_only()
        path = request.path.decode("utf-8", "replace")
        raise HTTPError(404, f"endpoint not found: {path}", "not_found", "not_found")

    for routes in (offload_routes, decisions_routes, links_routes, settings_routes, push_routes):
        routes.add_routes(app, node, guarded)

    @app.handle_errors(Exception)
    def not_found(request: IRequest, failure: Any) -> bytes:
        from werkzeug.exceptions import MethodNotAllowed, NotFound

        path = request.path.decode("utf-8", "replace")
        if failure.check(NotFound):
            return _fail(request, HTTPError(404, f"endpoint not found: {path}", "not_found", "not_found"))
        if failure.check(MethodNotAllowed):
            valid = getattr(failure.value, "valid_methods", None) or []
            request.setHeader(b"allow", ", ".join(valid).encode())
            return _fail(request, HTTPError(405, f"method not allowed on {path}", "method_not_allowed",
                                            "method_not_allowed"))
        node.log.failure("unhandled error on {path}", failure=failure, path=path)
        return _fail(request, HTTPError(500, "internal error", "internal_error", "internal_error"))

    return app


def _model_arg(body: dict[str, Any]) -> str:
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise HTTPError(400, "model is required")
    return name
