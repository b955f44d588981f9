"""The simulated ``llama-server`` program: its routes (:mod:`routerd.sim.llama`'s handlers and the native
APIs of :mod:`routerd.sim.llama_apis`) as one app, and its :data:`PROGRAM`."""

from __future__ import annotations

import argparse

from klein import Klein
from twisted.web.server import Request

from routerd.sim.llama import FLAGS, LlamaOptions, LlamaServer, options_from_args, validate_args
from routerd.sim.llama_apis import api_routes
from routerd.sim.llama_info import AUTO_PARALLEL, AUTO_SLOTS
from routerd.sim.program import Family
from routerd.sim.routes import build_family_app, openai_error_page, routes
from routerd.sim.runtime import Handler, SimRuntime
from routerd.sim.web import openai_error, send_json

__all__ = ["PROGRAM", "build_app"]


def _loading(request: Request) -> bytes:
    return send_json(request, 503, openai_error(503, "Loading model", "unavailable_error"))


def build_app(runtime: SimRuntime, options: LlamaOptions) -> Klein:
    server = LlamaServer(runtime, options)
    gets: dict[str, Handler] = {
        "/health": server.health, "/v1/health": server.health,
        "/v1/models": server.models, "/models": server.models,
        "/props": server.props, "/slots": server.slots, "/metrics": server.metrics,
    }
    posts: dict[str, Handler] = {
        "/v1/chat/completions": server.chat_completions,
        "/chat/completions": server.chat_completions,
        "/v1/completions": server.completions,
        "/completions": server.completion,  # llama-server's native answer, not the OpenAI one
        "/completion": server.completion,
        "/v1/embeddings": server.embeddings, "/embeddings": server.embeddings,
        "/embedding": server.embedding,
    }
    tokenizer: dict[str, Handler] = {
        "/tokenize": server.tokenize, "/detokenize": server.detokenize,
        "/apply-template": server.apply_template,
    }
    table = [*routes("GET", gets, work=False), *routes("POST", posts, work=True),
             *routes("POST", api_routes(server, options.reranking), work=True),
             *routes("POST", tokenizer, work=False)]
    return build_family_app(runtime, table, loading_reply=_loading, error_body=openai_error_page,
                            error_page=_not_found)


def _not_found(request: Request, status: int, message: str) -> bytes:
    """llama-server answers a known path asked with the wrong method as it does an unknown one: 404."""
    return send_json(request, 404, openai_error_page(404, "File Not Found"))


def _build(runtime: SimRuntime, ns: argparse.Namespace) -> Klein:
    return build_app(runtime, options_from_args(ns))


def _slots(ns: argparse.Namespace) -> int:
    return AUTO_SLOTS if ns.parallel == AUTO_PARALLEL else int(ns.parallel)


PROGRAM = Family("llama-server", "text", FLAGS, _build, _slots, validate_args)
