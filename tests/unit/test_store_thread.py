"""The production runner: SQL on one dedicated thread, durable across reopening (real reactor)."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor

from routerd.store.migrations import SchemaTooNewError
from routerd.store.runner import StoreClosedError, ThreadRunner, connect
from routerd.store.samples import LoadSample, RequestSample
from routerd.store.store import Store, db_path


@pytest_twisted.ensureDeferred
async def test_thread_store_writes_off_the_reactor_thread_and_reopens_with_data_intact(
    tmp_path: Path,
) -> None:
    path = db_path(str(tmp_path / "store"))  # the directory does not exist yet
    store = await Store.open(path, reactor)
    sample = RequestSample("llama", "llm", (12.0, 34.0), 456.0, "ok", 1_000, request_bytes=99, node_id="n1")
    loaded = LoadSample("llama.kcpps", "llama", "text", 2500.0, "ok", 900)
    await store.record_request_sample(sample)
    await store.record_load_sample(loaded)

    worker = await store.runner.run(lambda conn: threading.get_ident())
    again = await store.runner.run(lambda conn: threading.get_ident())
    assert worker == again != threading.get_ident()  # one dedicated thread, not the reactor's

    assert await store.request_samples("llama", "llm", 0) == [sample]
    await store.close()
    with pytest.raises(StoreClosedError):
        await store.request_samples("llama", "llm", 0)

    reopened = await Store.open(path, reactor)
    try:
        assert await reopened.request_samples("llama", "llm", 0) == [sample]
        assert await reopened.load_summary(0) == {"llama.kcpps": (2500.0, 1)}
    finally:
        await reopened.close()


@pytest_twisted.ensureDeferred
async def test_thread_runner_rolls_back_a_failing_function(tmp_path: Path) -> None:
    runner = ThreadRunner(str(tmp_path / "t.sqlite"), reactor)
    try:
        await runner.run(lambda c: c.execute("CREATE TABLE t (x INTEGER)"))

        def insert_then_fail(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO t VALUES (1)")
            raise ValueError("nope")

        with pytest.raises(ValueError):
            await runner.run(insert_then_fail)
        assert await runner.run(lambda c: c.execute("SELECT COUNT(*) FROM t").fetchone()) == (0,)
    finally:
        await runner.close()


@pytest_twisted.ensureDeferred
async def test_opening_a_too_new_database_fails_and_releases_the_thread(tmp_path: Path) -> None:
    path = str(tmp_path / "routerd.sqlite")
    conn = connect(path)
    conn.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)")
    conn.execute("INSERT INTO schema_version VALUES (99, 0)")
    conn.close()
    before = set(threading.enumerate())  # only this store's thread counts, not another test's
    with pytest.raises(SchemaTooNewError):
        await Store.open(path, reactor)
    started = [t for t in threading.enumerate() if t not in before and "routerd-store" in t.name]
    for thread in started:
        thread.join(timeout=5)  # released: it ends (it may still be returning when open() fails)
    assert [t.name for t in started if t.is_alive()] == []
