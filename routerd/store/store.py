"""The router database facade: what the rest of routerd calls.

Every call returns a ``Deferred``; the SQL runs through a ``DBRunner`` (a
dedicated thread in production, synchronously in unit tests).  Sample writes
are fire-and-forget for the request path: a failing write is logged and the
returned ``Deferred`` still fires ``None``.  Reads and admin writes (links,
settings) report failures through their ``Deferred``.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from twisted.internet.defer import Deferred, fail, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from routerd.lanes import Lane
from routerd.store import analytics as analytics_sql
from routerd.store import decisions as decisions_sql
from routerd.store import guardians as guardians_sql
from routerd.store import links as links_sql
from routerd.store import public_ids as public_ids_sql
from routerd.store import request_log as request_log_sql
from routerd.store import samples as samples_sql
from routerd.store import settings as settings_sql
from routerd.store.guardians import GuardianRow
from routerd.store.links import LinkRow
from routerd.store.migrations import convert_legacy_groups, migrate
from routerd.store.runner import MEMORY, DBRunner, ReactorForRunner, SyncRunner, ThreadRunner
from routerd.store.samples import OK, RUNTIMES, SECTIONS, LoadSample, RequestSample

T = TypeVar("T")

#: The database file inside ``cluster.store_dir``.
DB_FILENAME = "routerd.sqlite"
#: How long a request sample may wait to join a batch (production stores), and the batch that is
#: written at once whatever the wait.
SAMPLE_LINGER_S = 0.25
SAMPLE_BATCH_MAX = 512


class Clock(Protocol):
    def seconds(self) -> float: ...


class StoreReactor(ReactorForRunner, Clock, Protocol):
    """A reactor as ``Store.open`` needs it: threads, triggers and time."""


class _WallClock:
    def seconds(self) -> float:
        return time.time()


def db_path(store_dir: str) -> str:
    """``<store_dir>/routerd.sqlite``."""
    return os.path.join(store_dir, DB_FILENAME)


def _prepare(conn: sqlite3.Connection) -> None:
    migrate(conn)
    convert_legacy_groups(conn)


class Store:
    """The router database: samples now; links, settings and more for lending."""

    log = Logger()

    def __init__(self, runner: DBRunner, clock: Clock | None = None) -> None:
        self._runner = runner
        self._clock: Clock = clock if clock is not None else _WallClock()
        # Group commit for request samples: while one batch is being written,
        # later samples collect here and go down in one transaction.
        self._pending: list[tuple[tuple[object, ...], Deferred[None] | None]] = []
        self._writing = False
        self._idle: list[Deferred[None]] = []  # close() waiting for the sample writes to drain
        self._closed = False
        #: Seconds a lone request sample waits for others before its batch is written (0: at once).
        #: A node at one request at a time would otherwise hand a commit to the database thread per
        #: request (CPU and latency spikes); a read or close writes pending ones first.
        self.linger = 0.0
        self._linger_call: Any = None

    @property
    def runner(self) -> DBRunner:
        return self._runner

    # --- opening and closing -------------------------------------------------------------------

    @classmethod
    def open(cls, path: str, reactor: StoreReactor, clock: Clock | None = None) -> Deferred[Store]:
        """Open (creating its directory) and migrate the database file at ``path``, off the reactor.

        Fails with ``SchemaTooNewError`` for a database written by a newer
        routerd (after releasing the worker thread).  ``clock`` defaults to the
        reactor.
        """
        return Deferred.fromCoroutine(cls._open(path, reactor, clock))

    @classmethod
    async def _open(cls, path: str, reactor: StoreReactor, clock: Clock | None) -> Store:
        runner = ThreadRunner(path, reactor)
        try:
            await runner.run(_prepare, transaction=False)
        except BaseException:
            await runner.close()
            raise
        store = cls(runner, clock if clock is not None else reactor)
        store.linger = SAMPLE_LINGER_S
        return store

    @classmethod
    def open_sync(cls, path: str = MEMORY, clock: Clock | None = None) -> Store:
        """Open and migrate synchronously (tests, tools); ``":memory:"`` by default."""
        runner = SyncRunner(path)
        result: list[Failure] = []
        runner.run(_prepare, transaction=False).addErrback(result.append)
        if result:
            runner.close()
            result[0].raiseException()
        return cls(runner, clock)

    def close(self) -> Deferred[None]:
        """Write every pending request sample, then close (a stop must not lose or fail them)."""
        self._closed = True
        self._stop_lingering()
        if self._pending and not self._writing:
            self._flush_samples()
        if not self._writing:
            return self._runner.close()
        drained: Deferred[None] = Deferred()
        self._idle.append(drained)
        return drained.addCallback(lambda _: self._runner.close())

    def now_ms(self) -> int:
        return int(self._clock.seconds() * 1000)

    # --- fire-and-forget writes ----------------------------------------------------------------

    def _write(self, what: str, fn: Callable[[sqlite3.Connection], T], default: T) -> Deferred[T]:
        """Run a write whose failure must not reach the caller: log it, fire ``default``."""
        try:
            d = self._runner.run(fn)
        except Exception:
            d = fail()

        def logged(failure: Failure) -> T:
            self.log.failure("router database write failed: {what}", failure, what=what)
            return default

        d.addErrback(logged)
        return d

    def record_request_sample(self, sample: RequestSample) -> Deferred[None]:
        """Store one finished request; never fails (a failure is logged).  Fires once it is
        written (or dropped)."""
        done: Deferred[None] = Deferred()
        if not self.add_request_sample(sample, done):
            done.callback(None)
        return done

    def add_request_sample(self, sample: RequestSample, done: Deferred[None] | None = None) -> bool:
        """Queue ``sample``, firing ``done`` once it is written (False: dropped, logged).  The
        request path waits for no write: it passes no Deferred.

        Samples are group-committed: when a write is already under way the
        sample joins the next batch, so a busy node does one transaction (and
        one thread hand-off) per batch rather than per request.
        """
        if sample.section not in SECTIONS:
            self.log.warn("request sample for {model_id} dropped: unknown section {section!r}",
                          model_id=sample.model_id, section=sample.section)
            return False
        if self._closed:
            # A request that ended after the stop began: nothing left to write it to.
            self.log.info("request sample for {model_id} not stored: the store is closing",
                          model_id=sample.model_id)
            return False
        self._pending.append((samples_sql.request_row(sample), done))
        if self._writing or self._linger_call is not None:
            return True
        call_later = getattr(self._clock, "callLater", None)
        if self.linger > 0 and call_later is not None and len(self._pending) < SAMPLE_BATCH_MAX:
            self._linger_call = call_later(self.linger, self._lingered)
        else:
            self._flush_samples()
        return True

    def _lingered(self) -> None:
        self._linger_call = None
        if not self._writing:
            self._flush_samples()

    def _stop_lingering(self) -> None:
        if self._linger_call is not None:
            if self._linger_call.active():
                self._linger_call.cancel()
            self._linger_call = None

    def _flush_samples(self) -> None:
        """Submit every pending request sample as one write job."""
        self._stop_lingering()
        if not self._pending:
            self._writing = False
            idle, self._idle = self._idle, []
            for waiter in idle:
                waiter.callback(None)
            return
        batch, self._pending = self._pending, []
        rows = [row for row, _ in batch]
        self._writing = True

        def written(_: object) -> None:
            for _row, d in batch:
                if d is not None:
                    d.callback(None)
            self._flush_samples()

        insert = self._write("request sample", lambda conn: samples_sql.insert_requests(conn, rows), None)
        insert.addCallback(written)

    def _submit_pending(self) -> None:
        """Queue pending samples ahead of a read so the read sees them (the runner is FIFO)."""
        if self._pending:
            self._flush_samples()

    def record_load_sample(self, sample: LoadSample) -> Deferred[None]:
        """Store one finished model load; never fails (a failure is logged)."""
        if sample.runtime not in RUNTIMES:
            self.log.warn("load sample for {config_filename} dropped: unknown runtime {runtime!r}",
                          config_filename=sample.config_filename, runtime=sample.runtime)
            return succeed(None)
        return self._write("load sample", lambda conn: samples_sql.insert_load(conn, sample), None)

    def public_ids(self) -> Deferred[list[tuple[str, str, str]]]:
        """Every persisted ``(identity, base_id, public_id)``."""

        return self._runner.run(public_ids_sql.list_public_ids)

    def save_public_id(self, identity: str, base_id: str, public_id: str) -> Deferred[None]:
        """Persist one public-ID assignment (replacing the identity's earlier one)."""
        now = self.now_ms()

        def upsert(conn: sqlite3.Connection) -> None:
            public_ids_sql.save_public_id(conn, identity, base_id, public_id, now)

        return self._write("public id", upsert, None)

    def prune_samples(self, before_ms: int) -> Deferred[int]:
        """Delete request and load samples finished before ``before_ms``; fires the rows removed.

        Never fails: on error it logs and fires 0.
        """

        return self._write("sample pruning", lambda conn: samples_sql.prune(conn, before_ms), 0)

    # --- analytics (contract §9; rows batched by routerd.inference.analytics) ------------------------

    def write_analytics(self, requests: Sequence[analytics_sql.RequestRow],
                        loads: Sequence[analytics_sql.LoadRow],
                        captures: Sequence[request_log_sql.CaptureRow] = ()) -> Deferred[None]:
        """Insert a batch of analytics rows (and captured bodies) and add it into the rollups, in one
        transaction."""
        def write(conn: sqlite3.Connection) -> None:
            analytics_sql.write_batch(conn, requests, loads)
            request_log_sql.write_captures(conn, captures)

        return self._runner.run(write)

    def prune_analytics(self, raw_before_ms: int, level_before_ms: Mapping[str, int],
                        capture_before_ms: int = 0) -> Deferred[int]:
        """Delete raw analytics rows, each rollup level's rows and the captured bodies older than their
        cutoffs."""
        def prune(conn: sqlite3.Connection) -> int:
            removed = analytics_sql.prune(conn, raw_before_ms, level_before_ms)
            return removed + request_log_sql.prune_captures(conn, capture_before_ms)

        return self._runner.run(prune)

    def request_captures(self, request_id: str) -> Deferred[list[request_log_sql.CaptureRow]]:
        """The bodies captured of ``request_id`` (contract §9)."""
        return self._runner.run(lambda conn: request_log_sql.captures_of(conn, request_id), transaction=False)

    def query_analytics(self, query: analytics_sql.Query, now_ms: int) -> Deferred[
            tuple[list[analytics_sql.TableRow], list[tuple[int, str, analytics_sql.Sums]]]]:
        """One period's rollup sums: per (node, model, local ID, lane) and per (bucket, lane)."""
        return self._runner.run(lambda conn: analytics_sql.query(conn, query, now_ms), transaction=False)

    def query_request_log(self, query: request_log_sql.LogQuery) -> Deferred[
            list[tuple[int, analytics_sql.RequestRow, bool]]]:
        """One page of the request log, newest first (``(id, row, captured)``; contract §9)."""
        return self._runner.run(lambda conn: request_log_sql.query_log(conn, query), transaction=False)

    # --- sample queries ------------------------------------------------------------------------

    def request_samples(
        self, model_id: str | None, section: str, since_ms: int, status: str | None = OK,
        *, newest: int | None = None,
    ) -> Deferred[list[RequestSample]]:
        """Requests of ``model_id`` (None: every model) in ``section`` finished at or after
        ``since_ms`` with ``status`` (None: any), oldest first; with ``newest``, only the newest
        that many of each model (chosen inside SQLite: nothing else is read into Python)."""
        self._submit_pending()
        return self._runner.run(
            lambda conn: samples_sql.query_requests(conn, model_id, section, since_ms, status, newest))

    def load_samples(
        self, since_ms: int, config_filename: str | None = None, status: str | None = OK
    ) -> Deferred[list[LoadSample]]:
        """Loads finished at or after ``since_ms`` (of one config; with ``status``, None: any),
        oldest first."""
        return self._runner.run(lambda conn: samples_sql.query_loads(conn, since_ms, config_filename, status))

    def load_summary(self, since_ms: int) -> Deferred[dict[str, tuple[float, int]]]:
        """Config filename → (mean duration ms, count) of successful loads since ``since_ms``."""

        return self._runner.run(lambda conn: samples_sql.load_summary(conn, since_ms))

    # --- routing links (admin writes: failures reach the caller) -------------------------------

    def links(self, lane: Lane) -> Deferred[list[LinkRow]]:
        """Every link of ``lane``, ordered by owner node, owner model, helper node, helper model."""
        return self._runner.run(lambda conn: links_sql.list_links(conn, lane))

    def replace_links(self, lane: Lane, rows: Sequence[LinkRow]) -> Deferred[None]:
        """Make ``rows`` the complete link set of ``lane`` (a slave installing the master's push)."""
        return self._runner.run(lambda conn: links_sql.replace_links(conn, lane, rows))

    def replace_anchor_links(
        self, lane: Lane, node_id: str, model_id: str, rows: Sequence[LinkRow]
    ) -> Deferred[None]:
        """Replace every link touching the anchor (either direction) with ``rows``."""
        return self._runner.run(
            lambda conn: links_sql.replace_anchor_links(conn, lane, node_id, model_id, rows)
        )

    def delete_anchor_links(self, lane: Lane, node_id: str, model_id: str) -> Deferred[int]:
        """Remove every link touching the anchor; fires the number removed."""
        return self._runner.run(lambda conn: links_sql.delete_anchor_links(conn, lane, node_id, model_id))

    # --- guardian models (validated by routerd.lending.admin.GuardianEditor) -------------------

    def guardians(self) -> Deferred[list[GuardianRow]]:
        """Every guardian setting, ordered by scope, node and model."""
        return self._runner.run(guardians_sql.list_guardians)

    def put_guardians(self, rows: Sequence[GuardianRow]) -> Deferred[None]:
        """Insert or replace these settings (keyed by scope, node, model), all or none."""
        batch = list(rows)
        return self._runner.run(lambda conn: guardians_sql.put_guardians(conn, batch))

    def replace_guardians(self, rows: Sequence[GuardianRow]) -> Deferred[None]:
        """Make ``rows`` every guardian setting (a slave keeping its master's push), all or none."""
        batch = list(rows)
        return self._runner.run(lambda conn: guardians_sql.replace_guardians(conn, batch))

    def delete_guardian(self, scope: str, node_id: str, model_id: str) -> Deferred[int]:
        """Remove the setting of one scope key; fires the number removed."""
        return self._runner.run(lambda conn: guardians_sql.delete_guardian(conn, scope, node_id, model_id))

    # --- lending setting overrides (values are already normalised by routerd.config.lending) --

    def setting_overrides(self) -> Deferred[dict[str, str]]:
        """Key → stored override value."""
        return self._runner.run(settings_sql.get_overrides)

    def set_setting_overrides(self, values: Mapping[str, str]) -> Deferred[None]:
        """Store every value of the batch, or none of them."""
        now = self.now_ms()
        return self._runner.run(lambda conn: settings_sql.set_overrides(conn, values, now))

    def replace_setting_overrides(self, values: Mapping[str, str]) -> Deferred[None]:
        """Make ``values`` the whole override set (a slave keeping its master's push), all or none."""
        now, batch = self.now_ms(), dict(values)
        return self._runner.run(lambda conn: settings_sql.replace_overrides(conn, batch, now))

    def delete_setting_overrides(self, key: str | None = None) -> Deferred[int]:
        """Clear one override (or all with ``key=None``); fires the number removed."""
        return self._runner.run(lambda conn: settings_sql.delete_overrides(conn, key))

    # --- lending decision log (rows prepared by routerd.lending.decisions) --------------------

    def insert_decisions(self, rows: Sequence[Mapping[str, Any]]) -> Deferred[None]:
        """Insert decision rows in one transaction; a column a row leaves out is ``''`` or 0 and
        ``recorded_at`` defaults to now (ms).

        Fails (through the Deferred) with ``ValueError`` for an unknown column, or with the
        database's error; ``DecisionLog`` logs such failures.
        """
        now = self.now_ms()
        try:
            values = [decisions_sql.row_values(row, now) for row in rows]
        except ValueError:
            return fail()
        if not values:
            return succeed(None)
        return self._runner.run(lambda conn: decisions_sql.insert(conn, values))

    def insert_decision_values(self, values: Iterable[tuple[object, ...]]) -> Deferred[None]:
        """Insert rows already made into their values (``decisions_sql.COLUMNS`` order, checked by
        the caller) in one transaction.  ``values`` is read on the store's thread, as the rows are
        written: a lazy iterable makes each row there, not on the caller's turn."""
        return self._runner.run(lambda conn: decisions_sql.insert(conn, values))

    def query_decisions(
        self, *, lane: str | None = None, outcome: str | None = None, kind: str | None = None,
        limit: int = decisions_sql.DEFAULT_LIMIT, since_ms: int | None = None,
    ) -> Deferred[list[dict[str, Any]]]:
        """Decision rows matching every given filter as JSON objects, newest first
        (``recorded_at DESC, id DESC``); at most ``limit`` (capped at 5000); ``since_ms`` keeps
        rows recorded at or after it.  Empty and zero fields are omitted, apart from ``id``,
        ``recorded_at``, ``node_id``, ``kind``, ``outcome``, ``lane`` and ``router_version``."""
        if limit < 1:
            return fail(ValueError(f"limit must be at least 1, got {limit}"))
        return self._runner.run(lambda conn: decisions_sql.query(
            conn, lane=lane, outcome=outcome, kind=kind, limit=limit, since_ms=since_ms))

    def prune_decisions(self, before_ms: int) -> Deferred[int]:
        """Delete decision rows recorded before ``before_ms``; fires the number removed."""
        return self._runner.run(lambda conn: decisions_sql.prune(conn, before_ms))
