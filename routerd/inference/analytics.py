"""A node's analytics (contract §9): what a finished request or load becomes, the buffer that
writes them off the request path, the failed-load list, and the node's analytics document.

* :func:`request_row` — the pure fold of a finished call into a :class:`RequestRow` (or None when
  another node records it).
* :class:`AnalyticsRecorder` — rows go into memory; :meth:`~AnalyticsRecorder.flush` hands the batch
  to the store's thread in one transaction (raw rows + rollups), every ``analytics.flush_interval``,
  at ``analytics.max_buffered`` rows, on a flush call and on stop; :meth:`~AnalyticsRecorder.tick`
  also prunes by the retentions.  Nothing touches SQLite on the reactor thread.
* :class:`LoadErrors` — the newest failed loads, kept whatever ``analytics.enabled`` says.
* :func:`node_document` — the node's answer (figures plus the histograms the master merges).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from routerd.backends.errors import split_output
from routerd.config.schema import AnalyticsConfig
from routerd.routing.call import Call
from routerd.routing.classify import Route
from routerd.routing.plan import SECTIONS
from routerd.routing.work import image_count, vector_count
from routerd.store.analytics import (
    LEVELS,
    LoadRow,
    Query,
    RequestRow,
    Sums,
    TableRow,
    about_model,
    figures,
    mergeable,
)
from routerd.store.request_log import CaptureRow, LogQuery

log = Logger()

#: Failed loads a node keeps in memory for ``/load-errors``.
LOAD_ERRORS_KEPT = 200
#: Statuses of a forwarded request that never reached the node it was sent to (the master records
#: those; the other node records every request it answered).
NOT_DELIVERED = frozenset({"node_unreachable"})
#: Request rows a node keeps in memory for ``/analytics/recent``.
RECENT_KEPT = 100
#: How often the flush loop also prunes (seconds).
PRUNE_EVERY_S = 3600.0


def request_row(call: Call | None, route: Route, *, node_id: str, model_label: str, status: str,
                started: float, finished: float, first_write: float | None) -> RequestRow | None:
    """The analytics row of a request the front finished, or None when another node records it
    (a master's forwarded request that reached its node)."""
    duration_ms = max(0.0, (finished - started) * 1000.0)
    if call is None:  # refused before it was a call (a bad body or selector)
        return RequestRow(at_ms=int(finished * 1000), node_id=node_id, model_id=model_label,
                          lane=route.runtime, route=route.kind, status=status, duration_ms=duration_ms)
    if call.forwarded_to and status not in NOT_DELIVERED:
        return None
    outcome = call.outcome
    section = SECTIONS[route.kind]
    prompt = completion = images = vectors = 0
    audio = 0.0
    if status == "ok" and not call.lent_to:  # a lent request's work is the helper's row
        if section == "llm" and len(outcome.work) == 2:
            prompt, completion = int(outcome.work[0]), int(outcome.work[1])
        elif section == "image" and call.parsed is not None:
            images = image_count("sdapi" if route.family == "sdapi" else "openai", call.parsed)
        elif section == "stt" and outcome.work:
            audio = float(outcome.work[0])
        elif section == "embeddings":
            vectors = vector_count(call.parsed)
    ttft = max(0.0, (first_write - started) * 1000.0) if first_write is not None and call.stream else None
    return RequestRow(
        at_ms=int(finished * 1000), node_id=node_id,
        model_id=call.public_model or call.selector or call.model_id or model_label,
        lane=route.runtime, route=route.kind, status=status, http_status=outcome.http_status,
        duration_ms=duration_ms, ttft_ms=ttft, prompt_tokens=prompt, completion_tokens=completion,
        images=images, audio_seconds=audio, vectors=vectors, lent=bool(call.lent_to),
        borrowed=call.borrowed, guardian=call.guardian, key_name=call.key_name, request_id=call.request_id,
        local_id=call.model_id, lent_from=call.lent_from, lent_to=call.lent_to,
        cached_tokens=outcome.cached_tokens if prompt else 0, reason="" if status == "ok" else outcome.reason)


def load_row(*, at_ms: int, node_id: str, model_id: str, config_filename: str, runtime: str, ok: bool,
             duration_ms: float, reason: str) -> LoadRow:
    """A load event as a row: a failure's reason split from the backend's last output lines."""
    message, tail = split_output(reason)
    return LoadRow(at_ms=at_ms, node_id=node_id, model_id=model_id, config_filename=config_filename,
                   runtime=runtime, status="ok" if ok else "failed", duration_ms=duration_ms,
                   reason=message, log_tail=tuple(tail))


class LoadErrors:
    """The newest failed loads of this node (``/load-errors``), newest first."""

    def __init__(self, kept: int = LOAD_ERRORS_KEPT) -> None:
        self._rows: deque[LoadRow] = deque(maxlen=kept)

    def add(self, row: LoadRow) -> None:
        if row.status != "ok":
            self._rows.appendleft(row)

    def listing(self, model: str | None = None, limit: int = LOAD_ERRORS_KEPT) -> list[dict[str, Any]]:
        return [load_error_json(row) for row in self._rows if model is None or row.model_id == model][:limit]

    def clear(self) -> int:
        removed = len(self._rows)
        self._rows.clear()
        return removed


def recent_json(rows: Sequence[RequestRow], model: str | None = None, lane: str | None = None,
                limit: int = RECENT_KEPT, locals_: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The newest request rows first, as ``/analytics/recent`` answers them (contract §9); an owner's
    lent row that succeeded is left out (the helper's row is that request's one row)."""
    out: list[dict[str, Any]] = []
    for row in reversed(rows):
        if row.lent and row.status == "ok":
            continue
        if (model is None or about_model(row, model, locals_)) and (lane is None or row.lane == lane):
            out.append(request_json(row))
            if len(out) >= limit:
                break
    return out


def request_json(row: RequestRow) -> dict[str, Any]:
    """One request row as the recent list and the request log answer it (contract §9): the public
    ID as ``model``, the local ID that served it, and a lent request's ``owner`` and ``helper``
    (``<node>/<model>``; null for a request that was not lent)."""
    here = f"{row.node_id}/{row.local_id or row.model_id}"
    owner = row.lent_from if row.borrowed else here if row.lent else None
    helper = here if row.borrowed else row.lent_to if row.lent else None
    return {"at_ms": row.at_ms, "request_id": row.request_id, "node_id": row.node_id, "model": row.model_id,
            "local_id": row.local_id, "lane": row.lane, "route": row.route, "status": row.status,
            "http_status": row.http_status, "duration_ms": round(row.duration_ms, 1),
            "ttft_ms": None if row.ttft_ms is None else round(row.ttft_ms, 1),
            "prompt_tokens": row.prompt_tokens, "completion_tokens": row.completion_tokens,
            "cached_tokens": row.cached_tokens, "images": row.images, "audio_seconds": row.audio_seconds,
            "vectors": row.vectors, "lent": row.lent or row.borrowed, "borrowed": row.borrowed,
            "guardian": row.guardian, "key_name": row.key_name, "owner": owner, "helper": helper,
            "reason": row.reason}


def load_error_json(row: LoadRow) -> dict[str, Any]:
    return {"node_id": row.node_id, "model": row.model_id, "config_filename": row.config_filename,
            "runtime": row.runtime, "at_ms": row.at_ms, "duration_ms": int(row.duration_ms),
            "reason": row.reason, "log_tail": list(row.log_tail)}


class AnalyticsStore(Protocol):
    def write_analytics(self, requests: Sequence[RequestRow], loads: Sequence[LoadRow],
                        captures: Sequence[CaptureRow] = ()) -> Deferred[None]: ...

    def prune_analytics(self, raw_before_ms: int, level_before_ms: dict[str, int],
                        capture_before_ms: int = 0) -> Deferred[int]: ...

    def request_captures(self, request_id: str) -> Deferred[list[CaptureRow]]: ...

    def query_analytics(self, query: Query, now_ms: int) -> Deferred[Any]: ...

    def query_request_log(self, query: LogQuery) -> Deferred[list[tuple[int, RequestRow, bool]]]: ...


class AnalyticsRecorder:
    """Buffers this node's analytics rows and writes them in batches through the store's thread."""

    def __init__(self, clock: IReactorTime, config: AnalyticsConfig, node_id: str,
                 store: Callable[[], AnalyticsStore | None]) -> None:
        self.clock = clock
        self.config = config
        self.node_id = node_id
        self.store = store
        self.load_errors = LoadErrors()
        #: The newest request rows, written or not (``/analytics/recent``: the Overview's list).
        self.recent: deque[RequestRow] = deque(maxlen=RECENT_KEPT)
        self._requests: list[RequestRow] = []
        self._loads: list[LoadRow] = []
        self._captures: list[CaptureRow] = []
        self._pruned_at: float | None = None
        #: Rows written since start (requests, loads), and rows dropped by a failed write.
        self.written = {"requests": 0, "loads": 0}
        self.dropped = 0

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    @property
    def buffered(self) -> int:
        return len(self._requests) + len(self._loads)

    def now_ms(self) -> int:
        return int(self.clock.seconds() * 1000)

    # --- recording (reactor thread, no I/O) --------------------------------------------------------

    def request(self, row: RequestRow, body: bytes = b"", content_type: str = "") -> None:
        config = self.config
        if not config.enabled:
            return
        self._requests.append(row)
        self.recent.append(row)
        if (config.capture_keys or config.capture_models) and body and self._captured(row):
            self._captures.append(CaptureRow(row.at_ms, row.request_id, row.node_id, row.model_id,
                                             row.key_name, content_type, len(body),
                                             body[:config.capture_max_bytes]))
        if self.buffered >= self.config.max_buffered:
            self.flush()

    def _captured(self, row: RequestRow) -> bool:
        """Whether the operator asked for this request's body (``analytics.capture_keys`` names its
        key, or ``capture_models`` its public or local model ID)."""
        config = self.config
        models = config.capture_models
        return bool(row.key_name) and row.key_name in config.capture_keys \
            or row.model_id in models or bool(row.local_id) and row.local_id in models

    def load(self, *, model_id: str, config_filename: str, runtime: str, ok: bool, duration_ms: float,
             reason: str) -> None:
        row = load_row(at_ms=self.now_ms(), node_id=self.node_id, model_id=model_id,
                       config_filename=config_filename, runtime=runtime, ok=ok, duration_ms=duration_ms,
                       reason=reason)
        self.load_errors.add(row)
        if not self.config.enabled:
            return
        self._loads.append(row)
        if self.buffered >= self.config.max_buffered:
            self.flush()

    # --- writing (the store's thread) --------------------------------------------------------------

    def flush(self) -> Deferred[dict[str, int]]:
        """Write every buffered row now; fires how many of each were written (a failed write is
        logged and its rows counted as dropped: the request path never sees it)."""
        requests, loads, captures = self._requests, self._loads, self._captures
        counts = {"requests": len(requests), "loads": len(loads)}
        store = self.store()
        if not requests and not loads or store is None:
            return succeed({"requests": 0, "loads": 0})
        self._requests, self._loads, self._captures = [], [], []

        def written(_: object) -> dict[str, int]:
            for name, n in counts.items():
                self.written[name] += n
            return counts

        def failed(failure: Failure) -> dict[str, int]:
            self.dropped += counts["requests"] + counts["loads"]
            log.failure("writing {count} analytics rows failed", failure,
                        count=counts["requests"] + counts["loads"])
            return {"requests": 0, "loads": 0}

        return store.write_analytics(requests, loads, captures).addCallbacks(written, failed)

    def tick(self) -> Deferred[Any]:
        """The flush loop: write the buffer, and prune once an hour."""
        d: Deferred[Any] = self.flush()
        now = self.clock.seconds()
        if self.config.enabled and (self._pruned_at is None or now - self._pruned_at >= PRUNE_EVERY_S):
            self._pruned_at = now
            d.addCallback(lambda _: self.prune())
        return d

    def prune(self) -> Deferred[int]:
        store = self.store()
        if store is None:
            return succeed(0)
        now_ms = self.now_ms()
        c = self.config
        levels = {"minute": c.minute_retention, "hour": c.hour_retention, "day": c.day_retention}
        cutoffs = {level: now_ms - int(seconds * 1000) for level, seconds in levels.items()}
        def failed(failure: Failure) -> int:
            log.failure("pruning analytics failed", failure)
            return 0

        return store.prune_analytics(now_ms - int(c.raw_retention * 1000), cutoffs,
                                     now_ms - int(c.capture_retention * 1000)).addErrback(failed)

    # --- reading -----------------------------------------------------------------------------------

    async def document(self, query: Query) -> dict[str, Any]:
        """This node's analytics document for ``query`` (contract §9)."""
        now_ms = self.now_ms()
        store = self.store()
        if not self.config.enabled or store is None:
            return node_document(self.node_id, query, now_ms, False, [], [])
        if self.buffered:  # a query answers every request recorded, not only what the loop wrote so far
            await self.flush()
        tables, series = await store.query_analytics(query, now_ms)
        return node_document(self.node_id, query, now_ms, True, tables, series)

    async def log_page(self, query: LogQuery) -> list[dict[str, Any]]:
        """One page of this node's request log (contract §9), newest first: the buffered rows are
        written first, so the page reaches up to now.  Empty with analytics off."""
        store = self.store()
        if not self.config.enabled or store is None:
            return []
        await self.flush()
        return [{**request_json(row), "id": row_id, "captured": captured}
                for row_id, row, captured in await store.query_request_log(query)]

    async def captured(self, request_id: str) -> list[dict[str, Any]]:
        """The bodies this node captured of ``request_id`` (contract §9; empty when none was)."""
        store = self.store()
        if store is None:
            return []
        await self.flush()
        return [capture_json(c) for c in await store.request_captures(request_id)]


def capture_json(capture: CaptureRow) -> dict[str, Any]:
    """A captured body as the routes answer it: its text (UTF-8, undecodable bytes replaced) and
    whether it was cut at ``capture_max_bytes``."""
    return {"request_id": capture.request_id, "at_ms": capture.at_ms, "node_id": capture.node_id,
            "model": capture.model_id, "key_name": capture.key_name, "content_type": capture.content_type,
            "size": capture.size, "truncated": len(capture.body) < capture.size,
            "body": bytes(capture.body).decode("utf-8", "replace")}


def node_document(node_id: str, query: Query, now_ms: int, enabled: bool,
                  tables: Sequence[TableRow],
                  series: Sequence[tuple[int, str, Sums]]) -> dict[str, Any]:
    """A node's analytics answer from its rollup sums (contract §9): figures and mergeable parts."""
    since, until, level, width = query.window(now_ms)
    total = Sums()
    models = []
    for node, model, local, lane, sums in tables:
        total.merge(sums)
        models.append({"model": model, "local_id": local, "node_id": node or node_id, "lane": lane,
                       **figures(sums), **mergeable(sums)})
    points: dict[int, tuple[Sums, dict[str, int]]] = {}
    for bucket, lane, sums in series:
        at, by_lane = points.setdefault(bucket, (Sums(), {}))
        at.merge(sums)
        by_lane[lane] = by_lane.get(lane, 0) + int(sums.values["requests"])
    return {
        "node_id": node_id, "enabled": enabled, "period": query.period, "since_ms": since,
        "until_ms": until, "bucket_ms": width, "level": level, "filters": query.filters(),
        "totals": {**figures(total), **mergeable(total)},
        "models": models,
        "nodes": [{"node_id": node_id, "enabled": enabled, **figures(total)}],
        "series": [series_point(bucket, sums, by_lane, detail=True)
                   for bucket, (sums, by_lane) in sorted(points.items())],
    }


def series_point(bucket: int, sums: Sums, by_lane: dict[str, int], *, detail: bool) -> dict[str, Any]:
    """One point of a series (``detail``: with the parts the master merges)."""
    shown = figures(sums)
    point: dict[str, Any] = {"t_ms": bucket}
    for name in ("requests", "errors", "prompt_tokens", "completion_tokens", "images", "lent", "borrowed",
                 "tokens_per_s", "p95_ms"):
        point[name] = shown[name]
    point["by_lane"] = {lane: by_lane.get(lane, 0) for lane in ("text", "image", "stt")}
    if detail:
        point.update(mergeable(sums, ttft=False))
    return point


__all__ = ["LEVELS", "LOAD_ERRORS_KEPT", "RECENT_KEPT", "AnalyticsRecorder", "AnalyticsStore", "LoadErrors",
           "load_error_json", "load_row", "node_document", "recent_json", "request_json", "request_row",
           "series_point"]
