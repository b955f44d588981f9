"""Asset routes (cluster reference §8.3, §8.6): lookup and streaming by sha256 between nodes, the
master's merged lookup, transfer state, and the site's asset availability and file hashing.

Files are only ever found through the node's index (by hash) or, for hashing, by a path relative
to ``models.file_roots`` that :func:`routerd.assets.paths.resolve_in_roots` has checked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
from twisted.internet import defer
from twisted.protocols.basic import FileSender
from twisted.web.iweb import IRequest

from routerd.api.jsonio import json_response, read_json
from routerd.api.reply import query_arg
from routerd.api.routes import Routes
from routerd.assets.index import LookupError400, is_sha256, parse_hashes
from routerd.assets.ranges import RangeNotSatisfiable, parse_range
from routerd.errors import HTTPError
from routerd.paths import ASSET_PREFIX, LOOKUP_CLUSTER_PATH, LOOKUP_PATH, NODE_ASSETS_STATE
from routerd.site.assets import NODE_HASH, NODE_OPS, SiteAssets
from routerd.site.service import SiteService, master_only

if TYPE_CHECKING:
    from routerd.assets.service import AssetService

LOOKUP_BODY_LIMIT = 1024 * 1024
MAX_BATCH = 128


class _Window:
    """A file object that reads at most ``length`` bytes from ``offset``."""

    def __init__(self, handle: Any, offset: int, length: int) -> None:
        handle.seek(offset)
        self.handle = handle
        self.left = length

    def read(self, size: int) -> bytes:
        if self.left <= 0:
            return b""
        data: bytes = self.handle.read(min(size, self.left))
        self.left -= len(data)
        return data


def _hashes(request: IRequest) -> list[str]:
    content = request.content
    if content is not None:
        content.seek(0, 2)
        if content.tell() > LOOKUP_BODY_LIMIT:
            raise HTTPError(400, "lookup body is larger than 1 MiB")
        content.seek(0)
    try:
        return parse_hashes(read_json(request))
    except LookupError400 as exc:
        raise HTTPError(400, str(exc)) from None


@attrs.define(slots=False, kw_only=True)
class AssetsAPI:
    site: SiteService
    assets: SiteAssets

    routes = Routes()

    @property
    def service(self) -> AssetService:
        """This node's asset service."""
        return self.assets.service

    @routes.route(LOOKUP_PATH, methods=["POST"], auth="cluster")
    def lookup(self, request: IRequest) -> bytes:
        service = self.service
        assets = service.index.lookup(_hashes(request))
        return json_response(request, {"assets": [service.describe(a.sha256, a.to_json()) for a in assets]})

    @routes.route(LOOKUP_CLUSTER_PATH, methods=["POST"], auth="cluster")
    async def lookup_cluster(self, request: IRequest) -> bytes:
        if self.site.master is None:
            raise master_only()  # a standalone node knows no other node to ask
        return json_response(request, await self.service.lookup_cluster(_hashes(request)))

    @routes.route(NODE_ASSETS_STATE, methods=["GET"], auth="cluster")
    def state(self, request: IRequest) -> bytes:
        return json_response(request, self.service.state())

    @routes.route(ASSET_PREFIX, branch=True, methods=["GET"], auth="cluster",
                  docs=(ASSET_PREFIX + "{sha256}",))
    async def stream(self, request: IRequest) -> bytes:
        # the rest of the raw path, never decoded into a file-system path: only a hash matches
        sha256 = request.path.decode("latin-1")[len(ASSET_PREFIX):]
        asset = self.service.index.get(sha256) if is_sha256(sha256) else None
        if asset is None:
            raise HTTPError(404, f"asset {sha256[:80]!r} is not held by this node", "not_found",
                            "asset_not_found")
        header = request.getHeader(b"range")
        try:
            window = parse_range(header.decode("latin-1") if header is not None else None, asset.size)
        except RangeNotSatisfiable as exc:
            request.setHeader(b"content-range", f"bytes */{asset.size}".encode())
            raise HTTPError(416, str(exc), "invalid_request_error", "range_not_satisfiable") from None
        request.setHeader(b"content-type", b"application/octet-stream")
        request.setHeader(b"x-content-type-options", b"nosniff")
        request.setHeader(b"accept-ranges", b"bytes")
        request.setHeader(b"content-disposition",
                          f'attachment; filename="{asset.filename}"'.encode("utf-8", "replace"))
        offset, length = (0, asset.size) if window is None else (window.start, window.length)
        if window is not None:
            request.setResponseCode(206)
            request.setHeader(b"content-range", window.content_range(asset.size).encode())
        request.setHeader(b"content-length", str(length).encode())
        if request.method == b"HEAD" or length == 0:
            return b""
        with open(asset.path, "rb") as handle:
            await FileSender().beginFileTransfer(_Window(handle, offset, length), request)
        return b""

    # -- site (admin; master) ---------------------------------------------------------

    async def _site_op(self, request: IRequest, op: str, body: dict[str, Any] | None = None) -> Any:
        """Run ``op`` on the owning node (:meth:`routerd.site.assets.SiteAssets.run`)."""
        self.site.require()
        return await self.assets.run(op, read_json(request) if body is None else body, self._local_op)

    async def _local_op(self, op: str, body: dict[str, Any]) -> Any:
        service = self.service
        if op == "export":
            filename, config = await service.export(body.get("model_id"))
            return {"filename": filename, "config": config}
        if op == "resolve":
            return await service.resolve_model(body.get("model_id"))
        if op == "jobs":
            return service.job_document(service.start_job(body.get("model_id")))
        if op == "candidates":
            return await service.candidates(body)
        if op == "substitute":
            return service.substitute(body)
        if op == "bind":
            return await service.bind(body)
        raise HTTPError(404, f"unknown asset operation {op!r}", "not_found", "not_found")

    @routes.route("/router/v1/site/model-assets/export", methods=["POST"], auth="admin")
    async def site_export(self, request: IRequest) -> bytes:
        answer = await self._site_op(request, "export")
        filename = str(answer.get("filename") or "model.kcpps") if isinstance(answer, dict) else "model.kcpps"
        safe = "".join(c for c in filename if c.isalnum() or c in "._-") or "model.kcpps"
        request.setHeader(b"content-disposition", f'attachment; filename="{safe}"'.encode())
        request.setHeader(b"x-content-type-options", b"nosniff")
        config = answer.get("config") if isinstance(answer, dict) else None
        return json_response(request, config if isinstance(config, dict) else {})

    @routes.route("/router/v1/site/model-assets/resolve", methods=["POST"], auth="admin")
    async def site_resolve(self, request: IRequest) -> bytes:
        doc = await self._site_op(request, "resolve")
        return _resolution(request, doc)

    @routes.route("/router/v1/site/model-assets/resolve-batch", methods=["POST"], auth="admin")
    async def site_resolve_batch(self, request: IRequest) -> bytes:
        self.site.require()
        items = read_json(request).get("requests")
        if not isinstance(items, list) or not items:
            raise HTTPError(400, "requests must be a non-empty list")
        if len(items) > MAX_BATCH:
            raise HTTPError(400, f"at most {MAX_BATCH} requests per batch")
        if not all(isinstance(i, dict) for i in items):
            raise HTTPError(400, "each request must be an object")
        calls = [defer.ensureDeferred(self._site_op(request, "resolve", i)) for i in items]
        results: list[dict[str, Any]] = []
        for item, outcome in zip(items, await defer.DeferredList(calls, consumeErrors=True), strict=True):
            ok, value = outcome
            if ok:
                status = 200 if value.get("asset_state") == "ready" else 503
                results.append({"status": status, **value})
            else:
                err = value.value
                status = getattr(err, "status", 500)
                results.append({"status": status, "node_id": item.get("node_id") or self.site.node_id,
                                "model_id": item.get("model_id"),
                                "error": {"message": str(getattr(err, "message", err)),
                                          "code": getattr(err, "code", "internal_error")}})
        return json_response(request, {"results": results})

    @routes.route("/router/v1/site/model-assets/jobs", methods=["POST"], auth="admin")
    async def site_start_job(self, request: IRequest) -> bytes:
        return json_response(request, await self._site_op(request, "jobs"), 202)

    @routes.route("/router/v1/site/model-assets/jobs", methods=["GET"], auth="admin")
    async def site_jobs(self, request: IRequest) -> bytes:
        self.site.require()
        info = self.assets.target(query_arg(request, "node_id"), query_arg(request, "node_url"))
        if info is None:
            return json_response(request, self._jobs_local())
        return json_response(request, await self.assets.forward(info, "GET", f"{NODE_OPS}/jobs"))

    def _job_target(self, request: IRequest, job_id: str) -> Any:
        return self.assets.job_target(query_arg(request, "node_id"), query_arg(request, "node_url"), job_id)

    @routes.route("/router/v1/site/model-assets/jobs/<job_id>", methods=["GET"], auth="admin")
    async def site_job(self, request: IRequest, job_id: str) -> bytes:
        self.site.require()
        info = self._job_target(request, job_id)
        if info is None:
            return json_response(request, self._job_local(job_id))
        return json_response(request, await self.assets.forward(info, "GET", f"{NODE_OPS}/jobs/{job_id}"))

    @routes.route("/router/v1/site/model-assets/jobs/<job_id>/events", methods=["GET"], auth="admin")
    async def site_job_events(self, request: IRequest, job_id: str) -> bytes:
        self.site.require()
        after = _after(request)
        info = self._job_target(request, job_id)
        if info is None:
            return json_response(request, self._events_local(job_id, after))
        path = f"{NODE_OPS}/jobs/{job_id}/events?after_sequence={after}"
        return json_response(request, await self.assets.forward(info, "GET", path))

    @routes.route("/router/v1/site/model-assets/candidates", methods=["POST"], auth="admin")
    async def site_candidates(self, request: IRequest) -> bytes:
        return json_response(request, await self._site_op(request, "candidates"))

    @routes.route("/router/v1/site/model-assets/substitute", methods=["POST"], auth="admin")
    async def site_substitute(self, request: IRequest) -> bytes:
        return json_response(request, await self._site_op(request, "substitute"))

    @routes.route("/router/v1/site/model-assets/bind", methods=["POST"], auth="admin")
    async def site_bind(self, request: IRequest) -> bytes:
        return json_response(request, await self._site_op(request, "bind"))

    # -- node side of the site operations (cluster token) ---------------------------

    @routes.route(f"{NODE_OPS}/<op>", methods=["POST"], auth="cluster")
    async def node_op(self, request: IRequest, op: str) -> bytes:
        if op not in ("export", "resolve", "jobs", "candidates", "substitute", "bind"):
            raise HTTPError(404, f"unknown asset operation {op[:40]!r}", "not_found", "not_found")
        return json_response(request, await self._local_op(op, read_json(request)),
                             202 if op == "jobs" else 200)

    # an exact path: the dispatcher wants it named
    @routes.route(f"{NODE_OPS}/jobs", methods=["POST"], auth="cluster")
    def node_start_job(self, request: IRequest) -> bytes:
        service = self.service
        job = service.start_job(read_json(request).get("model_id"))
        return json_response(request, service.job_document(job), 202)

    @routes.route(f"{NODE_OPS}/jobs", methods=["GET"], auth="cluster")
    def node_jobs(self, request: IRequest) -> bytes:
        return json_response(request, self._jobs_local())

    @routes.route(f"{NODE_OPS}/jobs/<job_id>", methods=["GET"], auth="cluster")
    def node_job(self, request: IRequest, job_id: str) -> bytes:
        return json_response(request, self._job_local(job_id))

    @routes.route(f"{NODE_OPS}/jobs/<job_id>/events", methods=["GET"], auth="cluster")
    def node_job_events(self, request: IRequest, job_id: str) -> bytes:
        return json_response(request, self._events_local(job_id, _after(request)))

    def _jobs_local(self) -> dict[str, Any]:
        service = self.service
        return {"node_id": self.site.node_id, "jobs": [j.summary() for j in service.jobs.all()]}

    def _job(self, job_id: str) -> Any:
        job = self.service.jobs.get(job_id)
        if job is None:
            raise HTTPError(404, f"asset job {job_id[:80]!r} was not found", "not_found", "job_not_found")
        return job

    def _job_local(self, job_id: str) -> dict[str, Any]:
        return self.service.job_document(self._job(job_id))

    def _events_local(self, job_id: str, after: int) -> dict[str, Any]:
        job = self._job(job_id)
        return {"job_id": job.job_id, "state": job.state,
                "events": [e for e in job.events if e["sequence"] > after]}

    @routes.route("/router/v1/site/model-assets/<sha256>", methods=["GET"], auth="admin")
    async def availability(self, request: IRequest, sha256: str) -> bytes:
        self.site.require()
        if not is_sha256(sha256):
            raise HTTPError(400, "sha256 must be 64 lowercase hex characters")
        return json_response(request, await self.assets.availability(sha256))

    @routes.route("/router/v1/site/model-files/hash", methods=["POST"], auth="admin")
    async def site_hash(self, request: IRequest) -> bytes:
        self.site.require()
        return json_response(request, await self.assets.hash(read_json(request)))

    @routes.route(NODE_HASH, methods=["POST"], auth="cluster")
    async def node_hash(self, request: IRequest) -> bytes:
        return json_response(request, await self.assets.hash_here(read_json(request).get("path")))


def _after(request: IRequest) -> int:
    raw = query_arg(request, "after_sequence") or "0"
    if not raw.isdigit():
        raise HTTPError(400, "after_sequence must be a non-negative integer")
    return int(raw)


def _resolution(request: IRequest, doc: Any) -> bytes:
    """200 when every field is bound, else 503 with the reason (reference §8.6 ``resolve``)."""
    if isinstance(doc, dict) and doc.get("asset_state") == "ready":
        return json_response(request, doc)
    reason = doc.get("reason") if isinstance(doc, dict) else "unknown"
    error = {"message": f"unresolved assets: {reason}", "type": "backend_error", "code": "assets_unresolved"}
    return json_response(request, {**(doc if isinstance(doc, dict) else {}), "error": error}, 503)
