"""DBRunner behaviour shared by every caller: transactions, pragmas, closing (SyncRunner)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TypeVar

import pytest
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from routerd.store.runner import StoreClosedError, SyncRunner, connect, transaction

T = TypeVar("T")


def outcome(d: Deferred[T]) -> T | Failure:
    results: list[T | Failure] = []
    d.addBoth(results.append)
    assert results, "Deferred has not fired"
    return results[0]


def make_table(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE t (x INTEGER)")


def count(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT COUNT(*) FROM t").fetchone()[0])


def test_run_commits_on_success_and_fires_the_result() -> None:
    runner = SyncRunner()
    outcome(runner.run(make_table))

    def insert(conn: sqlite3.Connection) -> str:
        assert conn.in_transaction
        conn.execute("INSERT INTO t VALUES (1)")
        return "done"

    assert outcome(runner.run(insert)) == "done"
    assert outcome(runner.run(count)) == 1


def test_run_rolls_back_on_exception_and_errbacks_with_it() -> None:
    runner = SyncRunner()
    outcome(runner.run(make_table))

    def insert_then_fail(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO t VALUES (1)")
        raise ValueError("nope")

    result = outcome(runner.run(insert_then_fail))
    assert isinstance(result, Failure) and isinstance(result.value, ValueError)
    assert outcome(runner.run(count)) == 0


def test_run_without_transaction_leaves_transaction_control_to_the_function() -> None:
    runner = SyncRunner()
    assert outcome(runner.run(lambda c: c.in_transaction, transaction=False)) is False


def test_nested_transaction_is_a_savepoint_that_rolls_back_alone() -> None:
    conn = connect(":memory:")
    make_table(conn)
    with transaction(conn):
        conn.execute("INSERT INTO t VALUES (1)")
        with pytest.raises(KeyError):
            with transaction(conn):
                conn.execute("INSERT INTO t VALUES (2)")
                raise KeyError("inner")
        assert count(conn) == 1
    assert not conn.in_transaction
    assert count(conn) == 1


def test_closed_runner_errbacks_with_store_closed() -> None:
    runner = SyncRunner()
    outcome(runner.close())
    result = outcome(runner.run(count))
    assert isinstance(result, Failure) and isinstance(result.value, StoreClosedError)
    assert outcome(runner.close()) is None  # closing twice is harmless


def test_file_connection_uses_wal_foreign_keys_and_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "dir" / "routerd.sqlite"
    conn = connect(str(path))
    assert path.exists()  # the directory was created
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert conn.execute("PRAGMA foreign_keys").fetchone() == (1,)
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] > 0
    assert conn.isolation_level is None  # no implicit transactions
