"""A node's asset service: the index it serves peers from, peer discovery, and the binding of its
portable configs (cluster reference §8).

At start the index is built off the reactor thread, then every portable config is resolved (local
index, then peers) and the node's catalog replaced by the bound one; unresolved or failed configs are
retried every ``retry_interval``.  Peers: a slave asks its master's ``lookup-cluster``; a master asks
every registered node; a standalone node has only its own files.  Progress: :meth:`state` (the
``/router/v1/node/assets/state`` document) and the ``routerd_asset_bytes_transferred`` counter.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from routerd.assets.index import AssetIndex, build_index_blocking, is_sha256
from routerd.assets.pull import AssetPuller
from routerd.assets.resolve import AssetResolver, AssetState
from routerd.catalog.catalog import Catalog
from routerd.catalog.hashing import FileHashCache
from routerd.services import IntervalService
from routerd.wire.records import ModelRecord

log = Logger(namespace="routerd.serve.assets")

LOOKUP_PATH = "/router/v1/node/assets/lookup"
LOOKUP_CLUSTER_PATH = "/router/v1/node/assets/lookup-cluster"
PostJson = Callable[[str, str, Any], Awaitable[Any]]


def sources_from(answers: Iterable[tuple[str, Any]]) -> dict[str, list[str]]:
    """``{sha256: [node_url]}`` from lookup answers ``(node_url, {"assets": [...]})``; an asset
    entry may name its own ``node_url`` (a master's merged answer)."""
    out: dict[str, list[str]] = {}
    for url, answer in answers:
        assets = answer.get("assets") if isinstance(answer, dict) else None
        for item in assets if isinstance(assets, list) else []:
            if not isinstance(item, dict) or not is_sha256(item.get("sha256")):
                continue
            source = item.get("node_url") if isinstance(item.get("node_url"), str) else url
            urls = out.setdefault(item["sha256"], [])
            if source and source not in urls:
                urls.append(source)
    return out


class AssetService:
    def __init__(self, *, clock: IReactorTime, index: AssetIndex, puller: AssetPuller,
                 cache: FileHashCache, run_in_thread: Callable[..., Any], file_roots: Sequence[str],
                 shared_dir: str, own_url: str, catalog: Callable[[], Catalog],
                 on_catalog: Callable[[Catalog], Awaitable[None]], post_json: PostJson,
                 peers: Callable[[], list[str]], master_url: str | None,
                 metrics_registry: CollectorRegistry | None = None, retry_interval: float = 30.0) -> None:
        self.clock = clock
        self.index = index
        self.puller = puller
        self.cache = cache
        self.run_in_thread = run_in_thread
        self.file_roots = tuple(file_roots)
        self.shared_dir = shared_dir
        self.own_url = own_url
        self.catalog = catalog
        self.on_catalog = on_catalog
        self.post_json = post_json
        self.peers = peers
        self.master_url = master_url
        self.states: dict[str, AssetState] = {}
        self.resolver = AssetResolver(index=index, puller=puller, cache=cache, run_in_thread=run_in_thread,
                                      sources=self.find_sources)
        self.bytes_transferred = Counter("routerd_asset_bytes_transferred",
                                         "Bytes received by peer asset transfers",
                                         registry=metrics_registry) if metrics_registry else None
        if self.bytes_transferred is not None:
            counter = self.bytes_transferred
            puller.on_bytes = counter.inc
        self.retry = IntervalService("asset resolution", self.resolve_again, retry_interval, clock)
        self._resolving: defer.Deferred[None] | None = None

    async def rebuild_index(self) -> None:
        files = [p for m in self.catalog().models for p in m.weight_files().values()]
        assets = await self.run_in_thread(build_index_blocking, files, self.file_roots, self.shared_dir,
                                          self.cache)
        self.index.replace(assets)
        log.info("asset index holds {count} files", count=len(self.index))

    async def start(self) -> None:
        """Build the index, then resolve the portable configs once."""
        await self.rebuild_index()
        await self.resolve()

    def resolve_again(self) -> defer.Deferred[None] | None:
        if not any(s.state != "ready" for s in self.states.values()):
            return None
        return defer.ensureDeferred(self.resolve())

    async def resolve(self) -> None:
        catalog, states = await self.resolver.resolve(self.catalog())
        self.states = states
        for local_id, state in sorted(states.items()):
            if state.state != "ready":
                log.warn("model {model}: assets {state}: {reason}", model=local_id, state=state.state,
                         reason=state.reason)
        await self.on_catalog(catalog)

    async def find_sources(self, hashes: list[str]) -> dict[str, list[str]]:
        """Peers holding each hash: the master's merged lookup (slave) or every peer's (master)."""
        if self.master_url is not None:
            answer = await self.post_json(self.master_url, LOOKUP_CLUSTER_PATH, {"hashes": hashes})
            return sources_from([(self.master_url, answer)])
        return sources_from(await self.fan_out(hashes))

    async def fan_out(self, hashes: list[str]) -> list[tuple[str, Any]]:
        urls = self.peers()
        calls = [defer.ensureDeferred(_ask(self.post_json, url, hashes)) for url in urls]
        results = await defer.gatherResults(calls, consumeErrors=True) if calls else []
        return [(url, answer) for url, answer in zip(urls, results, strict=True) if answer is not None]

    async def lookup_cluster(self, hashes: list[str]) -> dict[str, Any]:
        """The master's merged lookup: its own index (``node_url`` = itself) and every peer's."""
        own = self.index.lookup(hashes) if self.own_url else []  # without a public URL none can fetch
        out = [{**a.to_json(), "node_url": self.own_url} for a in own]
        for url, answer in await self.fan_out(hashes):
            for item in answer.get("assets", []) if isinstance(answer, dict) else []:
                if isinstance(item, dict) and is_sha256(item.get("sha256")):
                    out.append({"sha256": item["sha256"], "filename": item.get("filename"),
                                "size": item.get("size"), "node_url": url})
        return {"assets": out}

    def annotate(self, records: list[ModelRecord]) -> list[ModelRecord]:
        """Records with their ``asset_state``; a config whose assets are not ready is unavailable."""
        import attrs

        out = []
        for record in records:
            state = self.states.get(record.local_id)
            if state is not None and (state.state != "ready" or state.portable):
                record = attrs.evolve(record, asset_state=state.state, asset_reason=state.reason,
                                      available=record.available and state.state == "ready")
            out.append(record)
        return out

    def state(self) -> dict[str, Any]:
        return {"assets": len(self.index),
                "transfers": [t.to_json() for t in self.puller.transfers.values()],
                "models": {k: {"asset_state": v.state, "reason": v.reason}
                           for k, v in sorted(self.states.items())}}


async def _ask(post_json: PostJson, url: str, hashes: list[str]) -> Any:
    try:
        return await post_json(url, LOOKUP_PATH, {"hashes": hashes})
    except Exception as exc:  # noqa: BLE001 - one peer failing leaves the others
        log.info("asset lookup on {url} failed: {error}", url=url, error=str(exc))
        return None
