"""A node's asset service: the index it serves peers from, peer discovery, and the binding of its
portable configs (cluster reference §8).

At start the index is built off the reactor thread, then every portable config is resolved (local
index, then peers) and the node's catalog replaced by the bound one; unresolved or failed configs are
retried every ``retry_interval``.  Peers: a slave asks its master's ``lookup-cluster``; a master asks
every registered node; a standalone node has only its own files.  Progress: :meth:`state` (the
``/router/v1/node/assets/state`` document) and the ``routerd_asset_bytes_transferred`` counter.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol

import attrs
from prometheus_client import CollectorRegistry, Counter
from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from routerd.assets.book import BOOK_FILE, AssetBook, Substitution
from routerd.assets.hf import BindRefused, parse_origin, verify_origin
from routerd.assets.index import AssetIndex, build_index_blocking, is_sha256
from routerd.assets.jobs import JobBoard, ResolutionJob
from routerd.assets.portable import portable_config
from routerd.assets.pull import AssetPuller
from routerd.assets.resolve import AssetResolver, AssetState, needs_of
from routerd.catalog.catalog import Catalog
from routerd.catalog.hashing import FileHashCache
from routerd.catalog.model import ModelConfig
from routerd.config.schema import Config
from routerd.errors import HTTPError
from routerd.paths import LOOKUP_CLUSTER_PATH, LOOKUP_PATH
from routerd.services import IntervalService
from routerd.wire.records import ModelRecord

log = Logger(namespace="routerd.assets.service")

PostJson = Callable[[str, str, Any], Awaitable[Any]]
LOOKUP_CACHE_LIMIT = 512  # hashes whose peer lookup answer is kept (reference §8.4)


def assets_unresolved(model_id: str, reason: str) -> HTTPError:
    """503 for a load of a config whose portable weights are not bound to a verified file."""
    return HTTPError(503, f"model {model_id!r} cannot load before its assets are resolved: {reason}",
                     "backend_error", "assets_unresolved")


def _sha(body: Any, key: str) -> str:
    value = body.get(key) if isinstance(body, dict) else None
    if not is_sha256(value):
        raise HTTPError(400, f"{key} must be a sha256 of 64 lowercase hex characters")
    return value


def _read_raw(path: str) -> dict[str, Any]:
    """Blocking: the config file's JSON object."""
    with open(path, encoding="utf-8-sig") as handle:
        raw = json.load(handle)
    if not isinstance(raw, dict):
        raise ValueError("config is not a JSON object")
    return raw


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


def _roots(roots: Sequence[str]) -> tuple[str, ...]:
    return tuple(roots)


def _book_or_blank(book: AssetBook | None) -> AssetBook:
    return book if book is not None else AssetBook(None)


@attrs.define(kw_only=True, eq=False, slots=False)  # tests set attributes on one instance
class AssetService:
    clock: IReactorTime
    index: AssetIndex
    puller: AssetPuller
    cache: FileHashCache
    run_in_thread: Callable[..., Any]
    file_roots: tuple[str, ...] = attrs.field(converter=_roots)
    shared_dir: str
    own_url: str
    catalog: Callable[[], Catalog]
    on_catalog: Callable[[Catalog], Awaitable[None]]
    post_json: PostJson
    peers: Callable[[], list[str]]
    master_url: str | None
    metrics_registry: CollectorRegistry | None = None
    retry_interval: float = 30.0
    node_id: str = ""
    book: AssetBook = attrs.field(default=None, converter=_book_or_blank)
    hub_http: Any = None  # treq-like client for bind (the Hugging Face Hub)
    lookup_cache: float = 5.0
    states: dict[str, AssetState] = attrs.field(init=False, factory=dict)
    #: sha256 -> (expires, peer URLs).
    _found: dict[str, tuple[float, list[str]]] = attrs.field(init=False, factory=dict)
    _resolving: defer.Deferred[None] | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        clock = self.clock
        self.jobs = JobBoard(self.node_id, lambda: int(clock.seconds() * 1000))
        self.resolver = AssetResolver(index=self.index, puller=self.puller, cache=self.cache,
                                      run_in_thread=self.run_in_thread, sources=self.find_sources,
                                      substitute_for=self.book.substitute_for)
        self.bytes_transferred = Counter("routerd_asset_bytes_transferred",
                                         "Bytes received by peer asset transfers",
                                         registry=self.metrics_registry) if self.metrics_registry else None
        if self.bytes_transferred is not None:
            counter = self.bytes_transferred
            self.puller.on_bytes = counter.inc
        self.retry = IntervalService("asset resolution", self.resolve_again, self.retry_interval, clock)

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

    async def resolve(self, observe: Any = None) -> None:
        """Bind the current catalog's portable fields and hand the bound catalog to ``on_catalog``.

        A catalog replaced while this ran (a reload, a start-up resolve still under way) is
        resolved again rather than overwritten with a result computed from the old one."""
        while True:
            started_from = self.catalog()
            if observe is None:
                catalog, states = await self.resolver.resolve(started_from)
            else:
                catalog, states = await self.resolver.resolve(started_from, observe)
            if self.catalog() is started_from:
                break
            log.info("the model catalog changed while its assets were resolved; resolving it again")
        self.states = states
        for local_id, state in sorted(states.items()):
            if state.state != "ready":
                log.warn("model {model}: assets {state}: {reason}", model=local_id, state=state.state,
                         reason=state.reason)
        await self.on_catalog(catalog)

    async def find_sources(self, hashes: list[str]) -> dict[str, list[str]]:
        """Peers holding each hash: the master's merged lookup (slave) or every peer's (master).
        An answer is reused for ``lookup_cache`` seconds (at most 512 hashes kept)."""
        now = self.clock.seconds()
        out = {h: self._found[h][1] for h in hashes if h in self._found and self._found[h][0] > now}
        missing = [h for h in hashes if h not in out]
        if not missing:
            return {h: urls for h, urls in out.items() if urls}
        if self.master_url is not None:
            answer = await self.post_json(self.master_url, LOOKUP_CLUSTER_PATH, {"hashes": missing})
            found = sources_from([(self.master_url, answer)])
        else:
            found = sources_from(await self.fan_out(missing))
        expires = self.clock.seconds() + self.lookup_cache
        self._found = {h: e for h, e in self._found.items() if e[0] > now}
        for sha in missing:
            if len(self._found) < LOOKUP_CACHE_LIMIT:
                self._found[sha] = (expires, found.get(sha, []))
            out[sha] = found.get(sha, [])
        return {h: urls for h, urls in out.items() if urls}

    def forget_sources(self) -> None:
        """Drop the cached lookup answers (a new resolution asked for by an operator)."""
        self._found.clear()

    async def fan_out(self, hashes: list[str]) -> list[tuple[str, Any]]:
        urls = self.peers()
        calls = [defer.ensureDeferred(_ask(self.post_json, url, hashes)) for url in urls]
        results = await defer.gatherResults(calls, consumeErrors=True) if calls else []
        return [(url, answer) for url, answer in zip(urls, results, strict=True) if answer is not None]

    async def lookup_cluster(self, hashes: list[str]) -> dict[str, Any]:
        """The master's merged lookup: its own index (``node_url`` = itself) and every peer's."""
        own = self.index.lookup(hashes) if self.own_url else []  # without a public URL none can fetch
        out = [{**self.describe(a.sha256, a.to_json()), "node_url": self.own_url} for a in own]
        for url, answer in await self.fan_out(hashes):
            for item in answer.get("assets", []) if isinstance(answer, dict) else []:
                if isinstance(item, dict) and is_sha256(item.get("sha256")):
                    entry = {"sha256": item["sha256"], "filename": item.get("filename"),
                             "size": item.get("size"), "node_url": url}
                    if isinstance(item.get("origin"), str):
                        entry["origin"] = item["origin"]
                    out.append(entry)
        return {"assets": out}

    def describe(self, sha256: str, entry: dict[str, Any]) -> dict[str, Any]:
        """A lookup entry with the hash's bound origin, when there is one."""
        origin = self.book.origin(sha256)
        return {**entry, "origin": origin} if origin else entry

    def blocked(self, model: ModelConfig) -> str | None:
        """Why ``model`` may not load yet (portable weights not bound to a verified file), or None."""
        state = self.states.get(model.local_id)
        if state is not None and state.state != "ready":
            return f"asset_state {state.state}: {state.reason}"
        unbound = model.unbound
        if unbound:
            return f"{', '.join(unbound)} named only by sha256 and not bound to a verified file yet"
        return None

    def _model(self, local_id: Any) -> ModelConfig:
        model = self.catalog().resolve(local_id) if isinstance(local_id, str) and local_id else None
        if model is None:
            raise HTTPError(404, f"model {str(local_id)[:80]!r} was not found on this node", "not_found",
                            "model_not_found")
        return model

    # -- site operations (reference §8.6), run on the owning node ---------------------

    async def export(self, local_id: Any) -> tuple[str, dict[str, Any]]:
        """``(file name, portable config)``: every weight path replaced by its sha256."""
        model = self._model(local_id)
        try:
            raw: dict[str, Any] = await self.run_in_thread(_read_raw, model.path)
        except (OSError, ValueError) as exc:
            raise HTTPError(409, f"cannot read {model.filename}: {exc}", "invalid_request_error",
                            "config_unreadable") from None
        files: dict[str, tuple[str, str]] = {}
        for field, path in model.weight_files().items():
            try:
                digest: str = await self.run_in_thread(self.cache.hash_file, path)
            except OSError as exc:
                raise HTTPError(409, f"cannot hash the {field} file of {model.local_id}: {exc}",
                                "invalid_request_error", "asset_unreadable") from None
            files[field] = (digest, os.path.basename(path))
        for need in needs_of(model):  # still unbound: keep what the config says
            files.setdefault(need.field, (need.sha256, need.filename))
        return model.filename, portable_config(raw, files, self.book.origins)

    def _model_state(self, model: ModelConfig) -> dict[str, Any]:
        state = self.states.get(model.local_id, AssetState("ready", portable=bool(needs_of(model))))
        reason = self.blocked(self._model(model.local_id))
        return {"node_id": self.node_id, "model_id": model.local_id,
                "asset_state": state.state if reason is None or state.state != "ready" else "unresolved",
                "reason": reason or "", "fields": list(state.fields)}

    async def resolve_model(self, local_id: Any) -> dict[str, Any]:
        """Resolve now (peer lookup not cached) and report ``local_id``'s state and fields."""
        model = self._model(local_id)
        self.forget_sources()
        await self.resolve()
        return self._model_state(model)

    def start_job(self, local_id: Any) -> ResolutionJob:
        model = self._model(local_id)
        job = self.jobs.create(model.local_id)

        def observe(model_id: str, kind: str, fields: dict[str, Any]) -> None:
            if model_id == job.model_id:
                if kind == "transfer" and fields["sha256"] not in job.hashes:
                    job.hashes.append(fields["sha256"])
                job.add(self.jobs.now_ms(), kind, **fields)

        async def run() -> None:
            self.forget_sources()
            try:
                await self.resolve(observe)
            except Exception as exc:  # noqa: BLE001 - the job records why it failed
                self.jobs.finish(job, "failed", str(exc))
                return
            doc = self._model_state(model)
            self.jobs.finish(job, doc["asset_state"], doc["reason"])

        defer.ensureDeferred(run())
        return job

    def job_document(self, job: ResolutionJob) -> dict[str, Any]:
        return {**job.summary(), "transfers": [self.puller.transfers[h].to_json() for h in job.hashes
                                               if h in self.puller.transfers]}

    async def candidates(self, body: Any) -> dict[str, Any]:
        """Where a hash can come from: files with it here and on peers, the bound origin, a recorded
        substitution, and local files with the same name but another hash (substitution candidates)."""
        sha256 = _sha(body, "sha256")
        filename = body.get("filename") if isinstance(body.get("filename"), str) else None
        exact: list[dict[str, Any]] = []
        own = self.index.get(sha256)
        if own is not None:
            exact.append({"node_url": self.own_url, "node_id": self.node_id, "filename": own.filename,
                          "size": own.size, "source": own.source})
        try:
            peers = await self.find_sources([sha256])
        except Exception as exc:  # noqa: BLE001 - the local answer stands
            log.info("asset lookup for candidates failed: {error}", error=str(exc))
            peers = {}
        for url in peers.get(sha256, []):
            if url != self.own_url:
                exact.append({"node_url": url, "source": "peer"})
        names = {filename} if filename else {a.filename for a in ([own] if own else [])}
        similar = [{"sha256": a.sha256, "filename": a.filename, "size": a.size, "source": a.source}
                   for a in self.index.all() if a.filename in names and a.sha256 != sha256]
        sub = self.book.substitutions.get(sha256)
        return {"sha256": sha256, "node_id": self.node_id, "exact": exact, "similar": similar,
                "origin": self.book.origin(sha256), "substitution": sub.to_json() if sub else None}

    def substitute(self, body: Any) -> dict[str, Any]:
        """Record that ``expected_sha256`` may be served by the file with ``sha256``; needs
        ``confirm: true`` and two different hashes (else 400 ``confirmation_required``)."""
        expected = _sha(body, "expected_sha256")
        sha256 = _sha(body, "sha256")
        if body.get("confirm") is not True or expected == sha256:
            raise HTTPError(400, "a substitution needs \"confirm\": true and a sha256 different from "
                                 "expected_sha256", "invalid_request_error", "confirmation_required")
        note = body.get("note") if isinstance(body.get("note"), str) else ""
        sub = Substitution(expected, sha256, int(self.clock.seconds() * 1000), note[:200])
        self.book.substitute(sub)
        log.info("asset {expected} will be bound to {sha256} (confirmed substitution)", expected=expected,
                 sha256=sha256)
        defer.ensureDeferred(self.resolve()).addErrback(
            lambda f: log.failure("resolving after a substitution failed", failure=f))
        return {"ok": True, "node_id": self.node_id, "substitution": sub.to_json()}

    async def bind(self, body: Any) -> dict[str, Any]:
        """Record a Hugging Face origin once the Hub confirms the path at that commit has that LFS
        sha256; ``{sha256, hf}``."""
        sha256 = _sha(body, "sha256")
        try:
            origin = parse_origin(body.get("hf"))
            if self.hub_http is None:
                raise BindRefused("this node has no HTTP client for the Hugging Face Hub")
            await verify_origin(self.hub_http, origin, sha256)
        except BindRefused as exc:
            raise HTTPError(exc.status, str(exc), "invalid_request_error", exc.code) from None
        self.book.bind(sha256, str(origin))
        log.info("asset {sha256} bound to {hf}", sha256=sha256, hf=str(origin))
        return {"sha256": sha256, "hf": str(origin)}

    def annotate(self, records: list[ModelRecord]) -> list[ModelRecord]:
        """Records with their ``asset_state``; a config whose assets are not ready is unavailable."""
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


class _PostJSON(Protocol):
    def post_json(self, base: str, path: str, body: Any) -> defer.Deferred[Any]: ...


def build_asset_service(config: Config, *, clock: IReactorTime, agent: Any, http: Any, cache: FileHashCache,
                        run_in_thread: Callable[..., Any], metrics_registry: CollectorRegistry,
                        client: _PostJSON | None, catalog: Callable[[], Catalog],
                        on_catalog: Callable[[Catalog], Awaitable[None]],
                        peers: Callable[[], list[str]]) -> AssetService:
    """A node's asset service from its config: the index, the puller (bounded slots, rate and
    deadline) and the book of origins and substitutions under ``store_dir``."""
    models, cluster = config.models, config.cluster
    shared_dir = models.shared_dir or os.path.join(cluster.store_dir, "model-assets")
    index = AssetIndex()
    puller = AssetPuller(agent=agent, token=cluster.token, clock=clock, shared_dir=shared_dir,
                         index=index, slots=models.concurrent_asset_transfers, run_in_thread=run_in_thread,
                         rate=max(1, int(models.asset_transfer_rate_mb * 1024 * 1024)),
                         deadline=models.asset_transfer_deadline)

    def post_json(base: str, path: str, body: Any) -> defer.Deferred[Any]:
        if client is None:
            return defer.fail(LookupError("a standalone node has no peers"))
        return client.post_json(base, path, body)

    return AssetService(clock=clock, index=index, puller=puller, cache=cache, run_in_thread=run_in_thread,
                        file_roots=models.file_roots, shared_dir=shared_dir, own_url=cluster.public_url,
                        catalog=catalog, on_catalog=on_catalog, post_json=post_json, peers=peers,
                        master_url=cluster.master_url if cluster.role == "slave" else None,
                        metrics_registry=metrics_registry, node_id=cluster.node_id,
                        book=AssetBook(os.path.join(cluster.store_dir, BOOK_FILE)), hub_http=http,
                        lookup_cache=models.asset_lookup_cache)
