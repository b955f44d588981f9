"""Benchmark routes (contract §6, §7, §9): run a model's fixed workload, list the results.

Node API (cluster token): ``POST /router/v1/node/benchmarks/run {"model"}`` (a local ID of this node)
and ``GET /router/v1/node/benchmarks?model``.  Admin (a master or a standalone node; 404 on a slave):
``POST /router/v1/benchmarks/run {"model", "node_id"?}`` runs it where the model is
(``routerd.site.bench``) and ``GET /router/v1/benchmarks?model&node_id`` lists every node's.
A run that fails is stored (``ok: false``) and answered 502 with the error envelope.
"""

from __future__ import annotations

from typing import Any

import attrs
from twisted.web.iweb import IRequest

from routerd.api.jsonio import json_response, read_json
from routerd.api.reply import query_arg
from routerd.api.routes import Routes
from routerd.errors import HTTPError
from routerd.inference.bench import BenchRunner
from routerd.paths import NODE_BENCH_LIST, NODE_BENCH_RUN
from routerd.site.bench import site_history, site_run
from routerd.site.service import SiteService

BENCH_RUN = "/router/v1/benchmarks/run"
BENCH_LIST = "/router/v1/benchmarks"


def _model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise HTTPError(400, "model is required")
    return model.strip()


def _answer(request: IRequest, result: dict[str, Any]) -> bytes:
    if result.get("ok") is False:
        raise HTTPError(502, f"the benchmark of {result.get('model')!r} on node {result.get('node_id')!r} "
                             f"failed: {result.get('error')}", "backend_error", "benchmark_failed")
    return json_response(request, result)


@attrs.define(slots=False, kw_only=True)
class BenchAPI:
    site: SiteService
    bench: BenchRunner

    routes = Routes()

    @routes.route(NODE_BENCH_RUN, methods=["POST"], auth="cluster")
    async def node_run(self, request: IRequest) -> bytes:
        return _answer(request, await self.bench.run(_model(read_json(request))))

    @routes.route(NODE_BENCH_LIST, methods=["GET"], auth="cluster")
    def node_list(self, request: IRequest) -> bytes:
        model = query_arg(request, "model") or None
        return json_response(request, {"benchmarks": self.bench.book.history(model)})

    @routes.route(BENCH_RUN, methods=["POST"], auth="admin")
    async def run(self, request: IRequest) -> bytes:
        self.site.require()
        body = read_json(request)
        node_id = body.get("node_id")
        if node_id is not None and (not isinstance(node_id, str) or not node_id):
            raise HTTPError(400, "node_id must be a non-empty string")
        result = await site_run(self.site, self.bench.run, _model(body), node_id)
        return _answer(request, result)

    @routes.route(BENCH_LIST, methods=["GET"], auth="admin")
    async def history(self, request: IRequest) -> bytes:
        self.site.require()
        model = query_arg(request, "model") or None
        node_id = query_arg(request, "node_id") or None
        own = self.bench.book.history(model)
        return json_response(request, await site_history(self.site, own, model, node_id))


__all__ = ["BENCH_LIST", "BENCH_RUN", "BenchAPI"]
