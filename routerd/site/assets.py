"""The site's model assets (cluster reference §8.6): which node an asset operation is for, passing
it on to that node, where an asset is available across the site, and hashing a model file on the
node that holds it.

Only registry-known node URLs are ever used (reference ``configNodeTarget``); files are only ever
found by a path relative to ``models.file_roots`` that :func:`routerd.assets.paths.resolve_in_roots`
has checked.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
from twisted.internet import defer

from routerd.assets.paths import UnsafePath, resolve_in_roots
from routerd.catalog.hashing import sha256_file
from routerd.errors import HTTPError
from routerd.paths import NODE_ASSET_OPS, NODE_MODEL_FILES_HASH
from routerd.registry.records import NodeInfo
from routerd.site.service import SiteService, remote_answer

if TYPE_CHECKING:
    from routerd.assets.service import AssetService

NODE_OPS = NODE_ASSET_OPS
NODE_HASH = NODE_MODEL_FILES_HASH

LocalOp = Callable[[str, dict[str, Any]], Awaitable[Any]]


@attrs.define
class SiteAssets:
    """The site half of the asset routes over this node's ``service``; ``file_roots`` is read per
    request (a reload may change it)."""

    site: SiteService
    service: AssetService
    file_roots: Callable[[], Sequence[str]]
    run_in_thread: Callable[..., Any]

    def target(self, node_id: Any, node_url: Any) -> NodeInfo | None:
        """The registered node a site operation is for; None for this node."""
        if node_id is not None and not isinstance(node_id, str):
            raise HTTPError(400, "node_id must be a string")
        if node_url is not None and not isinstance(node_url, str):
            raise HTTPError(400, "node_url must be a string")
        if not node_id or node_id == self.site.node_id:
            return None
        master = self.site.master
        info: NodeInfo | None = master.registry.node(node_id) if master is not None else None
        if info is None:
            raise HTTPError(400, f"node url for {node_id} is required", "invalid_request_error",
                            "unknown_node")
        if node_url is not None and node_url.rstrip("/") != info.node_url.rstrip("/"):
            raise HTTPError(400, f"node url {node_url} does not match the registered node {node_id}",
                            "invalid_request_error", "node_url_mismatch")
        return info

    def job_target(self, node_id: str | None, node_url: str | None, job_id: str) -> NodeInfo | None:
        """The node running job ``job_id``: named, or the owner its ID starts with when known."""
        if not node_id and "-" in job_id:
            owner = job_id.rsplit("-", 1)[0]
            master = self.site.master
            node_id = owner if master is not None and master.registry.node(owner) is not None else None
        return self.target(node_id, node_url)

    async def forward(self, info: NodeInfo, method: str, path: str, body: Any = None) -> Any:
        """The node API call ``path`` on node ``info``; its error answered as given, or 502."""
        client = self.site.client
        work = client.get_json(info.node_url, path) if method == "GET" else \
            client.post_json(info.node_url, path, body)
        return await remote_answer(work, f"node {info.node_id!r}")

    async def run(self, op: str, body: dict[str, Any], local: LocalOp) -> Any:
        """Run ``op`` on the owning node: here (``local``), or passed on with the body (node
        fields dropped)."""
        self.site.require()
        info = self.target(body.get("node_id"), body.get("node_url"))
        inner = {k: v for k, v in body.items() if k not in ("node_id", "node_url")}
        if info is None:
            return await local(op, inner)
        return await self.forward(info, "POST", f"{NODE_OPS}/{op}", inner)

    async def availability(self, sha256: str) -> dict[str, Any]:
        """Where asset ``sha256`` is held across the site, with its file name, size and origin."""
        self.site.require()
        service = self.service
        master = self.site.master
        if master is not None:
            items = (await service.lookup_cluster([sha256]))["assets"]
            urls = {url: node for node, url in master.registry.node_urls().items()}
        else:
            own = service.index.get(sha256)
            items = [{**service.describe(sha256, own.to_json()), "node_url": ""}] if own else []
            urls = {"": self.site.node_id}
        first = items[0] if items else {}
        origin = service.book.origin(sha256) or next(
            (i["origin"] for i in items if isinstance(i.get("origin"), str)), None)
        return {"sha256": sha256, "available": bool(items),
                "nodes": sorted({urls.get(i["node_url"], i["node_url"]) for i in items}),
                "filename": first.get("filename"), "size": first.get("size"), "origin": origin}

    async def hash(self, body: dict[str, Any]) -> dict[str, Any]:
        """Hash a model file on the node ``body`` names (this one by default)."""
        agent = self.site.require()  # a standalone node's site of one knows no other node
        node_id = body.get("node_id") or ""
        if not node_id or node_id == self.site.node_id:
            return await self.hash_here(body.get("path"))
        node_url = body.get("node_url")
        info = agent.registry.node(node_id) if isinstance(node_id, str) else None
        if info is None:
            raise HTTPError(400, f"node url for {node_id} is required")
        if node_url is not None and node_url.rstrip("/") != info.node_url.rstrip("/"):
            raise HTTPError(400, f"node url {node_url} does not match the registered node")
        answer: dict[str, Any] = await remote_answer(
            self.site.client.post_json(info.node_url, NODE_HASH, {"path": body.get("path")}),
            f"node {node_id!r}")
        return answer

    async def hash_here(self, path: Any) -> dict[str, Any]:
        """Hash a file named relative to a file root (never an absolute or escaping path)."""
        roots = self.file_roots()
        if not roots:
            raise HTTPError(403, "no models.file_roots are configured on this node", "forbidden",
                            "no_file_roots")
        try:
            real = resolve_in_roots(path, roots)
        except UnsafePath as exc:
            raise HTTPError(400, str(exc), "invalid_request_error", "unsafe_path") from None
        digest: str = await defer.maybeDeferred(self.run_in_thread, sha256_file, real)
        return {"path": path, "sha256": digest, "node_id": self.site.node_id}


__all__ = ["NODE_HASH", "NODE_OPS", "LocalOp", "SiteAssets"]
