"""Asset routes (cluster reference §8.3, §8.6): lookup and streaming by sha256 between nodes, the
master's merged lookup, transfer state, and the site's asset availability and file hashing.

Files are only ever found through the node's index (by hash) or, for hashing, by a path relative
to ``models.file_roots`` that :func:`routerd.assets.paths.resolve_in_roots` has checked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.internet import defer
from twisted.protocols.basic import FileSender
from twisted.web.iweb import IRequest

from routerd.api.errors import api_app, master_only
from routerd.api.jsonio import json_response, read_json
from routerd.assets.index import LookupError400, is_sha256, parse_hashes
from routerd.assets.paths import UnsafePath, resolve_in_roots
from routerd.assets.ranges import RangeNotSatisfiable, parse_range
from routerd.catalog.hashing import sha256_file
from routerd.cluster.client import ClusterError, RemoteError
from routerd.errors import HTTPError

if TYPE_CHECKING:
    from routerd.node import Node

LOOKUP_BODY_LIMIT = 1024 * 1024
ASSET_PREFIX = "/router/v1/node/assets/"


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


class AssetsAPI:
    app = api_app()

    def __init__(self, node: Node) -> None:
        self.node = node

    @app.route("/router/v1/node/assets/lookup", methods=["POST"])
    def lookup(self, request: IRequest) -> bytes:
        assets = self.node.assets.index.lookup(_hashes(request))
        return json_response(request, {"assets": [a.to_json() for a in assets]})

    @app.route("/router/v1/node/assets/lookup-cluster", methods=["POST"])
    async def lookup_cluster(self, request: IRequest) -> bytes:
        if self.node.master is None:
            raise master_only()
        return json_response(request, await self.node.assets.lookup_cluster(_hashes(request)))

    @app.route("/router/v1/node/assets/state", methods=["GET"])
    def state(self, request: IRequest) -> bytes:
        return json_response(request, self.node.assets.state())

    @app.route(ASSET_PREFIX, branch=True, methods=["GET"])
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

    @app.route("/router/v1/site/model-assets/<sha256>", methods=["GET"])
    async def availability(self, request: IRequest, sha256: str) -> bytes:
        if self.node.master is None:
            raise master_only()
        if not is_sha256(sha256):
            raise HTTPError(400, "sha256 must be 64 lowercase hex characters")
        merged = await self.node.assets.lookup_cluster([sha256])
        urls = {url: node for node, url in self.node.master.registry.node_urls().items()}
        items = merged["assets"]
        first = items[0] if items else {}
        return json_response(request, {
            "sha256": sha256, "available": bool(items),
            "nodes": sorted({urls.get(i["node_url"], i["node_url"]) for i in items}),
            "filename": first.get("filename"), "size": first.get("size"), "origin": None})

    @app.route("/router/v1/site/model-files/hash", methods=["POST"])
    async def site_hash(self, request: IRequest) -> bytes:
        master = self.node.master
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

    @app.route("/router/v1/node/site/model-files/hash", methods=["POST"])
    async def node_hash(self, request: IRequest) -> bytes:
        return json_response(request, await self._hash_local(read_json(request).get("path")))

    async def _hash_local(self, path: Any) -> dict[str, Any]:
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
