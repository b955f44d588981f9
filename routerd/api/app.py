"""The Klein app of one node: client API (contract §5), admin and node routes (§6–7)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from klein import Klein
from twisted.internet.defer import ensureDeferred
from twisted.web.iweb import IRequest

from routerd import __version__
from routerd.api.errors import HTTPError, error_body, style_for_path
from routerd.routing.adapters import ollama
from routerd.routing.classify import INFERENCE_PATHS, classify
from routerd.routing.selector import SelectorError, parse_json_object

if TYPE_CHECKING:
    from routerd.node import Node

PROTOCOL_VERSION = 2


def _json(request: IRequest, payload: Any, status: int = 200) -> bytes:
    request.setResponseCode(status)
    request.setHeader(b"content-type", b"application/json")
    return json.dumps(payload).encode()


def _fail(request: IRequest, err: HTTPError) -> bytes:
    path = request.path.decode("utf-8", "replace")
    request.setResponseCode(err.status)
    request.setHeader(b"content-type", b"application/json")
    return error_body(style_for_path(path), err.message, err.type, err.code)


def _body_json(request: IRequest) -> dict[str, Any]:
    raw = request.content.read() if request.content is not None else b""
    if not raw.strip():
        return {}
    try:
        return parse_json_object(raw)
    except SelectorError as exc:
        raise HTTPError(400, str(exc)) from None


def build_app(node: Node) -> Klein:
    app = Klein()

    def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
        """Turn ``HTTPError`` raised by a handler (sync or async) into its envelope."""

        def wrapper(request: IRequest, *args: Any, **kwargs: Any) -> Any:
            def on_error(failure: Any) -> bytes:
                failure.trap(HTTPError)
                return _fail(request, failure.value)

            try:
                result = fn(request, *args, **kwargs)
            except HTTPError as err:
                return _fail(request, err)
            if hasattr(result, "__await__"):
                return ensureDeferred(result).addErrback(on_error)
            return result

        wrapper.__name__ = fn.__name__
        return wrapper

    # -- health and metrics ---------------------------------------------------

    @app.route("/health", methods=["GET"])
    def health(request: IRequest) -> bytes:
        return _json(request, {"status": "ok", "node_id": node.node_id, "role": node.config.cluster.role})

    @app.route("/metrics", methods=["GET"])
    def metrics(request: IRequest) -> bytes:
        request.setHeader(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")
        return node.metrics.render()

    # -- listings (contract §5) -----------------------------------------------

    @app.route("/v1/models", methods=["GET"])
    def v1_models(request: IRequest) -> bytes:
        return _json(request, ollama.openai_models(node.listing(lambda c: c.llm or c.embeddings)))

    @app.route("/api/tags", methods=["GET"])
    def api_tags(request: IRequest) -> bytes:
        return _json(request, ollama.ollama_tags(node.listing(lambda c: c.llm or c.embeddings)))

    @app.route("/api/ps", methods=["GET"])
    def api_ps(request: IRequest) -> bytes:
        return _json(request, ollama.ollama_ps(node.listing(lambda c: c.llm or c.embeddings)))

    @app.route("/api/version", methods=["GET"])
    def api_version(request: IRequest) -> bytes:
        return _json(request, {"version": __version__})

    @app.route("/api/show", methods=["POST"])
    @guarded
    def api_show(request: IRequest) -> bytes:
        body = _body_json(request)
        name = body.get("model", body.get("name"))
        if not isinstance(name, str) or not name:
            raise HTTPError(400, "model is required")
        entries = [e for e in node.listing(lambda c: True) if e.name == name]
        if not entries:
            raise HTTPError(404, f"model '{name}' not found", "not_found", "model_not_found")
        return _json(request, ollama.ollama_show(entries[0]))

    @app.route("/sdapi/v1/sd-models", methods=["GET"])
    def sd_models(request: IRequest) -> bytes:
        out = [{"title": m.image_id, "model_name": m.image_id, "filename": m.filename,
                "hash": m.model_hash[:10]}
               for m in node.catalog.models if m.capabilities.image and m.image_id]
        return _json(request, out)

    # -- inference ------------------------------------------------------------

    def inference(request: IRequest) -> Any:
        path = request.path.decode("utf-8", "replace")
        route = classify(request.method.decode(), path)
        if route is None:
            request.setHeader(b"allow", b"POST")
            return _fail(request, HTTPError(405, f"method not allowed on {path}", "method_not_allowed",
                                            "method_not_allowed"))
        body = request.content.read() if request.content is not None else b""
        return ensureDeferred(node.inference.handle(request, route, path, body))

    for inference_path in sorted(INFERENCE_PATHS):
        app.route(inference_path, methods=["POST", "GET", "PUT", "DELETE", "PATCH"],
                  endpoint="inference:" + inference_path)(inference)

    # -- admin (contract §7: /router/v1/load, unload, models, version) --------

    @app.route("/router/v1/version", methods=["GET"])
    def version(request: IRequest) -> bytes:
        return _json(request, {"version": __version__, "protocol_version": PROTOCOL_VERSION,
                               "minimum_protocol_version": PROTOCOL_VERSION})

    @app.route("/router/v1/models", methods=["GET"])
    def router_models(request: IRequest) -> bytes:
        return _json(request, node.models_document())

    @app.route("/router/v1/load", methods=["POST"])
    @app.route("/router/v1/node/load", methods=["POST"])
    @guarded
    async def load(request: IRequest) -> bytes:
        body = _body_json(request)
        name = body.get("model")
        if not isinstance(name, str) or not name:
            raise HTTPError(400, "model is required")
        result = await node.load_model(name)
        return _json(request, result)

    @app.route("/router/v1/unload", methods=["POST"])
    @app.route("/router/v1/node/unload", methods=["POST"])
    @guarded
    async def unload(request: IRequest) -> bytes:
        body = _body_json(request)
        result = await node.unload_model(body.get("model"), body.get("target"))
        return _json(request, result)

    @app.route("/router/v1/node/state", methods=["GET"])
    @app.route("/router/v1/state", methods=["GET"])
    def state(request: IRequest) -> bytes:
        return _json(request, node.state_document())

    @app.route("/router/v1/node/models", methods=["GET"])
    def node_models(request: IRequest) -> bytes:
        return _json(request, node.snapshot())

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
