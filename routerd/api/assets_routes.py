"""Asset routes (cluster reference §8.3, §8.6): lookup and streaming by sha256 between nodes, the
master's merged lookup, transfer state, and the site's asset availability and file hashing.

Files are only ever found through the node's index (by hash) or, for hashing, by a path relative
to ``models.file_roots`` that :func:`routerd.assets.paths.resolve_in_roots` has checked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from twisted.internet import defer
from twisted.protocols.basic import FileSender
from twisted.web.iweb import IRequest

from routerd.api.errors import master_only
from routerd.api.jsonio import json_response, read_json
from routerd.api.reply import query_arg
from routerd.api.routes import Routes
from routerd.assets.index import LookupError400, is_sha256, parse_hashes
from routerd.assets.paths import UnsafePath, resolve_in_roots
from routerd.assets.ranges import RangeNotSatisfiable, parse_range
from routerd.catalog.hashing import sha256_file
from routerd.clients.node_client import ClusterError, RemoteError
from routerd.errors import HTTPError

if TYPE_CHECKING:
    from routerd.assets.service import AssetService
    from routerd.cluster.master import MasterAgent
    from routerd.config.schema import Config
    from routerd.registry.records import NodeInfo

LOOKUP_BODY_LIMIT = 1024 * 1024
ASSET_PREFIX = "/router/v1/node/assets/"
NODE_OPS = "/router/v1/node/site/model-assets"
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


class AssetsNode(Protocol):
    """What the asset routes use of a node (``routerd.node.Node`` is one)."""

    @property
    def node_id(self) -> str: ...

    @property
    def role(self) -> str: ...

    @property
    def config(self) -> Config: ...  # models.file_roots, read per request (a reload may change it)

    @property
    def assets(self) -> AssetService: ...

    @property
    def master(self) -> MasterAgent | None: ...

    @property
    def site(self) -> MasterAgent | None: ...

    @property
    def run_in_thread(self) -> Callable[..., Any]: ...


class AssetsAPI:
    routes = Routes()

    def __init__(self, node: AssetsNode) -> None:
        self.node = node

    @routes.route("/router/v1/node/assets/lookup", methods=["POST"], auth="cluster")
    def lookup(self, request: IRequest) -> bytes:
        service = self.node.assets
        assets = service.index.lookup(_hashes(request))
        return json_response(request, {"assets": [service.describe(a.sha256, a.to_json()) for a in assets]})

    @routes.route("/router/v1/node/assets/lookup-cluster", methods=["POST"], auth="cluster")
    async def lookup_cluster(self, request: IRequest) -> bytes:
        if self.node.master is None:
            raise master_only()
        return json_response(request, await self.node.assets.lookup_cluster(_hashes(request)))

    @routes.route("/router/v1/node/assets/state", methods=["GET"], auth="cluster")
    def state(self, request: IRequest) -> bytes:
        return json_response(request, self.node.assets.state())

    @routes.route(ASSET_PREFIX, branch=True, methods=["GET"], auth="cluster",
                  docs=(ASSET_PREFIX + "{sha256}",))
    async def stream(self, request: IRequest) -> bytes:
        # the rest of the raw path, never decoded into a file-system path: only a hash matches
        sha256 = request.path.decode("latin-1")[len(ASSET_PREFIX):]
        asset = self.node.assets.index.get(sha256) if is_sha256(sha256) else None
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

    def _site(self) -> None:
        """Site routes answer 404 on a slave (reference §12)."""
        if self.node.site is None:
            raise master_only()

    def _target(self, node_id: Any, node_url: Any) -> NodeInfo | None:
        """The registered node a site operation is for; None for this node (reference §8.6
        ``configNodeTarget``: only registry-known node URLs are ever used)."""
        if node_id is not None and not isinstance(node_id, str):
            raise HTTPError(400, "node_id must be a string")
        if node_url is not None and not isinstance(node_url, str):
            raise HTTPError(400, "node_url must be a string")
        if not node_id or node_id == self.node.node_id:
            return None
        master = self.node.master
        info = master.registry.node(node_id) if master is not None else None
        if info is None:
            raise HTTPError(400, f"node url for {node_id} is required", "invalid_request_error",
                            "unknown_node")
        if node_url is not None and node_url.rstrip("/") != info.node_url.rstrip("/"):
            raise HTTPError(400, f"node url {node_url} does not match the registered node {node_id}",
                            "invalid_request_error", "node_url_mismatch")
        return info

    async def _forward(self, info: NodeInfo, method: str, path: str, body: Any = None) -> Any:
        master = self.node.master
        assert master is not None
        try:
            if method == "GET":
                return await master.client.get_json(info.node_url, path)
            return await master.client.post_json(info.node_url, path, body)
        except RemoteError as exc:
            raise HTTPError(exc.status, exc.message, exc.type, exc.code) from None
        except ClusterError as exc:
            raise HTTPError(502, f"node {info.node_id!r} did not answer: {exc.reason}", "backend_error",
                            "node_unreachable") from None

    async def _site_op(self, request: IRequest, op: str, body: dict[str, Any] | None = None) -> Any:
        """Run ``op`` on the owning node: here, or forwarded with the body (node fields dropped)."""
        self._site()
        body = read_json(request) if body is None else body
        info = self._target(body.get("node_id"), body.get("node_url"))
        inner = {k: v for k, v in body.items() if k not in ("node_id", "node_url")}
        if info is None:
            return await self._local_op(op, inner)
        return await self._forward(info, "POST", f"{NODE_OPS}/{op}", inner)

    async def _local_op(self, op: str, body: dict[str, Any]) -> Any:
        service = self.node.assets
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
        self._site()
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
                results.append({"status": status, "node_id": item.get("node_id") or self.node.node_id,
                                "model_id": item.get("model_id"),
                                "error": {"message": str(getattr(err, "message", err)),
                                          "code": getattr(err, "code", "internal_error")}})
        return json_response(request, {"results": results})

    @routes.route("/router/v1/site/model-assets/jobs", methods=["POST"], auth="admin")
    async def site_start_job(self, request: IRequest) -> bytes:
        return json_response(request, await self._site_op(request, "jobs"), 202)

    @routes.route("/router/v1/site/model-assets/jobs", methods=["GET"], auth="admin")
    async def site_jobs(self, request: IRequest) -> bytes:
        self._site()
        info = self._target(query_arg(request, "node_id"), query_arg(request, "node_url"))
        if info is None:
            return json_response(request, self._jobs_local())
        return json_response(request, await self._forward(info, "GET", f"{NODE_OPS}/jobs"))

    def _job_target(self, request: IRequest, job_id: str) -> NodeInfo | None:
        node_id = query_arg(request, "node_id")
        if not node_id and "-" in job_id:
            owner = job_id.rsplit("-", 1)[0]
            known = self.node.master is not None and self.node.master.registry.node(owner) is not None
            node_id = owner if known else None
        return self._target(node_id, query_arg(request, "node_url"))

    @routes.route("/router/v1/site/model-assets/jobs/<job_id>", methods=["GET"], auth="admin")
    async def site_job(self, request: IRequest, job_id: str) -> bytes:
        self._site()
        info = self._job_target(request, job_id)
        if info is None:
            return json_response(request, self._job_local(job_id))
        return json_response(request, await self._forward(info, "GET", f"{NODE_OPS}/jobs/{job_id}"))

    @routes.route("/router/v1/site/model-assets/jobs/<job_id>/events", methods=["GET"], auth="admin")
    async def site_job_events(self, request: IRequest, job_id: str) -> bytes:
        self._site()
        after = _after(request)
        info = self._job_target(request, job_id)
        if info is None:
            return json_response(request, self._events_local(job_id, after))
        path = f"{NODE_OPS}/jobs/{job_id}/events?after_sequence={after}"
        return json_response(request, await self._forward(info, "GET", path))

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
        service = self.node.assets
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
        service = self.node.assets
        return {"node_id": self.node.node_id, "jobs": [j.summary() for j in service.jobs.all()]}

    def _job(self, job_id: str) -> Any:
        job = self.node.assets.jobs.get(job_id)
        if job is None:
            raise HTTPError(404, f"asset job {job_id[:80]!r} was not found", "not_found", "job_not_found")
        return job

    def _job_local(self, job_id: str) -> dict[str, Any]:
        return self.node.assets.job_document(self._job(job_id))

    def _events_local(self, job_id: str, after: int) -> dict[str, Any]:
        job = self._job(job_id)
        return {"job_id": job.job_id, "state": job.state,
                "events": [e for e in job.events if e["sequence"] > after]}

    @routes.route("/router/v1/site/model-assets/<sha256>", methods=["GET"], auth="admin")
    async def availability(self, request: IRequest, sha256: str) -> bytes:
        self._site()
        if not is_sha256(sha256):
            raise HTTPError(400, "sha256 must be 64 lowercase hex characters")
        service = self.node.assets
        if self.node.master is not None:
            items = (await service.lookup_cluster([sha256]))["assets"]
            urls = {url: node for node, url in self.node.master.registry.node_urls().items()}
        else:
            own = service.index.get(sha256)
            items = [{**service.describe(sha256, own.to_json()), "node_url": ""}] if own else []
            urls = {"": self.node.node_id}
        first = items[0] if items else {}
        origin = service.book.origin(sha256) or next(
            (i["origin"] for i in items if isinstance(i.get("origin"), str)), None)
        return json_response(request, {
            "sha256": sha256, "available": bool(items),
            "nodes": sorted({urls.get(i["node_url"], i["node_url"]) for i in items}),
            "filename": first.get("filename"), "size": first.get("size"), "origin": origin})

    @routes.route("/router/v1/site/model-files/hash", methods=["POST"], auth="admin")
    async def site_hash(self, request: IRequest) -> bytes:
        master = self.node.site  # a standalone node's site of one knows no other node
        if master is None:
            raise master_only()
        body = read_json(request)
        node_id = body.get("node_id") or ""
        if node_id and node_id != self.node.node_id:
            node_url = body.get("node_url")
            info = master.registry.node(node_id) if isinstance(node_id, str) else None
            if info is None:
                raise HTTPError(400, f"node url for {node_id} is required")
            if node_url is not None and node_url.rstrip("/") != info.node_url.rstrip("/"):
                raise HTTPError(400, f"node url {node_url} does not match the registered node")
            try:
                answer = await master.client.post_json(info.node_url, "/router/v1/node/site/model-files/hash",
                                                       {"path": body.get("path")})
            except RemoteError as exc:
                raise HTTPError(exc.status, exc.message, exc.type, exc.code) from None
            except ClusterError as exc:
                raise HTTPError(502, f"node {node_id!r} did not answer: {exc.reason}", "backend_error",
                                "node_unreachable") from None
            return json_response(request, answer)
        return json_response(request, await self._hash_local(body.get("path")))

    @routes.route("/router/v1/node/site/model-files/hash", methods=["POST"], auth="cluster")
    async def node_hash(self, request: IRequest) -> bytes:
        return json_response(request, await self._hash_local(read_json(request).get("path")))

    async def _hash_local(self, path: Any) -> dict[str, Any]:
        """Hash a file named relative to a file root (never an absolute or escaping path)."""
        roots = self.node.config.models.file_roots
        if not roots:
            raise HTTPError(403, "no models.file_roots are configured on this node", "forbidden",
                            "no_file_roots")
        try:
            real = resolve_in_roots(path, roots)
        except UnsafePath as exc:
            raise HTTPError(400, str(exc), "invalid_request_error", "unsafe_path") from None
        digest: str = await defer.maybeDeferred(self.node.run_in_thread, sha256_file, real)
        return {"path": path, "sha256": digest, "node_id": self.node.node_id}


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
