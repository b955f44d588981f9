"""Where SQL runs: one connection, off the reactor thread.

A ``DBRunner`` takes a function of a ``sqlite3.Connection`` and returns a
``Deferred`` of its result.  By default the function runs inside one
transaction (commit on success, rollback on any exception); migrations ask for
``transaction=False`` and manage their own transactions.

* ``ThreadRunner`` owns one dedicated worker thread and one connection opened
  in (and only ever used by) that thread, so SQLite never runs on the reactor.
* ``SyncRunner`` runs the function at once on the calling thread and returns an
  already-fired ``Deferred``: for unit tests (works with ``":memory:"``).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar, cast

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IReactorFromThreads
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

T = TypeVar("T")

MEMORY = ":memory:"
BUSY_TIMEOUT_MS = 5000


class StoreClosedError(RuntimeError):
    """The runner was closed; no more SQL can run through it."""


class DBRunner(Protocol):
    """Runs functions of a connection and hands back their results as Deferreds."""

    def run(self, fn: Callable[[sqlite3.Connection], T], *, transaction: bool = True) -> Deferred[T]:
        """Run ``fn(conn)``; inside one transaction unless ``transaction`` is false."""
        ...

    def close(self) -> Deferred[None]:
        """Close the connection (after queued work) and release the thread, if any."""
        ...


class ReactorForRunner(Protocol):
    """The parts of the reactor a ``ThreadRunner`` uses."""

    def callWhenRunning(self, callable: Callable[..., Any], *args: Any, **kwargs: Any) -> Any: ...

    def addSystemEventTrigger(
        self, phase: str, eventType: str, callable: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any: ...

    def removeSystemEventTrigger(self, triggerID: Any) -> None: ...

    def callFromThread(self, callable: Callable[..., Any], *args: Any, **kwargs: Any) -> None: ...


def connect(path: str) -> sqlite3.Connection:
    """Open ``path`` (creating its directory) in autocommit mode with routerd's pragmas.

    WAL journal, a busy timeout, foreign keys on.  Transactions are explicit
    (see ``transaction``), never implicit.
    """
    if path != MEMORY and not path.startswith("file:"):
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS:d}")
        conn.execute("PRAGMA foreign_keys = ON")
        if path != MEMORY:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
    except BaseException:
        conn.close()
        raise
    return conn


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One transaction: commit on success, roll back on any exception.

    Inside an already open transaction this nests as a savepoint, so helpers
    that need atomicity work both under ``DBRunner.run`` and on a bare
    autocommit connection.  A fresh transaction starts ``IMMEDIATE`` so two
    processes never both read-then-write the same schema.
    """
    if conn.in_transaction:
        conn.execute("SAVEPOINT routerd_nested")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK TO SAVEPOINT routerd_nested")
            conn.execute("RELEASE SAVEPOINT routerd_nested")
            raise
        conn.execute("RELEASE SAVEPOINT routerd_nested")
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _call(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T], in_transaction: bool) -> T:
    if not in_transaction:
        return fn(conn)
    with transaction(conn):
        return fn(conn)


class SyncRunner:
    """Runs each function immediately on the calling thread (tests, tools)."""

    def __init__(self, path: str = MEMORY) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = connect(path)

    def run(self, fn: Callable[[sqlite3.Connection], T], *, transaction: bool = True) -> Deferred[T]:
        if self._conn is None:
            return fail(StoreClosedError("store is closed"))
        try:
            result = _call(self._conn, fn, transaction)
        except BaseException:
            return fail()
        return succeed(result)

    def close(self) -> Deferred[None]:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        return succeed(None)


class _DaemonThread(threading.Thread):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.daemon = True


class ThreadRunner:
    """One worker thread, one connection opened in it; every call runs there in order.

    The thread pool (one thread) starts when the reactor runs (at once if it
    already does) and stops on ``close()`` or, failing that, at reactor shutdown.
    """

    log = Logger()

    def __init__(self, path: str, reactor: ReactorForRunner) -> None:
        self.path = path
        self._reactor = reactor
        self._pool = ThreadPool(1, 1, name="routerd-store")
        # A daemon worker: close() (or reactor shutdown) stops it cleanly; if neither
        # ever runs, it must not keep the process alive after everything else ended.
        self._pool.threadFactory = _DaemonThread
        self._conn: sqlite3.Connection | None = None  # touched only on the worker thread
        self._open_error: BaseException | None = None  # idem
        self._closing: Deferred[None] | None = None
        self._trigger: Any = reactor.addSystemEventTrigger("during", "shutdown", self._on_shutdown)
        reactor.callWhenRunning(self._pool.start)
        # Queued first, so the connection exists before any work runs.
        self._defer(self._open_in_thread)

    def _defer(self, f: Callable[[], T]) -> Deferred[T]:
        return deferToThreadPool(cast(IReactorFromThreads, self._reactor), self._pool, f)

    # --- worker thread -------------------------------------------------------------------------

    def _open_in_thread(self) -> None:
        try:
            self._conn = connect(self.path)
        except BaseException as exc:  # reported by every later run
            self._open_error = exc

    def _run_in_thread(self, fn: Callable[[sqlite3.Connection], T], in_transaction: bool) -> T:
        if self._conn is None:
            if self._open_error is not None:
                raise self._open_error
            raise StoreClosedError("store is closed")
        return _call(self._conn, fn, in_transaction)

    def _close_in_thread(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # --- reactor thread ------------------------------------------------------------------------

    def run(self, fn: Callable[[sqlite3.Connection], T], *, transaction: bool = True) -> Deferred[T]:
        if self._closing is not None:
            return fail(StoreClosedError("store is closed"))
        return self._defer(lambda: self._run_in_thread(fn, transaction))

    def close(self) -> Deferred[None]:
        if self._closing is None:
            if self._trigger is not None:
                self._reactor.removeSystemEventTrigger(self._trigger)
                self._trigger = None
            self._closing = self._shut()
        done: Deferred[None] = Deferred()

        def fire(result: None) -> None:
            done.callback(None)
            return result

        self._closing.addCallback(fire)
        return done

    def _shut(self) -> Deferred[None]:
        d = self._defer(self._close_in_thread)

        def stop_pool(result: None | Failure) -> None | Failure:
            self._pool.stop()
            if isinstance(result, Failure):
                self.log.failure("closing the store at {path} failed", result, path=self.path)
            return None

        d.addBoth(stop_pool)
        return d

    def _on_shutdown(self) -> Deferred[None] | None:
        if self._closing is not None:
            return None
        self._trigger = None
        self._closing = self._shut()
        return self._closing
