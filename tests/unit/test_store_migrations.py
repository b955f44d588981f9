"""Schema migrations of the router database: fresh, idempotent, upgraded, refused when too new."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from routerd.store.migrations import (
    MIGRATIONS,
    Migration,
    MigrationError,
    SchemaTooNewError,
    current_version,
    migrate,
    split_statements,
)
from routerd.store.runner import connect
from routerd.store.store import Store

V1_TABLES = {
    "schema_version",
    "request_samples",
    "load_samples",
    "offload_decisions",
    "routing_image_links",
    "routing_text_links",
    "offload_settings",
    "guardians",
    "public_ids",
}
#: Migration 3 (issue 22): analytics rows and rollups.
V3_TABLES = {"analytics_requests", "analytics_loads", "analytics_rollups"}
V5_TABLES = {"analytics_captures"}  # the request log's captured bodies (rollups rebuilt, same name)

DECISION_COLUMNS = [
    "id", "recorded_at", "node_id", "kind", "trigger", "lane", "owner_node_id", "owner_model_id",
    "helper_node_id", "helper_model_id", "outcome", "reason", "request_id", "pending_count",
    "backlog_count", "keep_ms", "switch_ms", "restore_ms", "service_ms", "owner_job_ms", "service_source",
    "helper_idle_ms", "slots", "lent_out", "borrowed_ahead", "wait_ms", "router_version",
    "priority", "key_name",  # v3 (issue 23)
    "key_hash", "load_ms", "mean_load_ms", "moved_from",  # v5: replica_choice rows
]  # fmt: skip


def tables(conn: sqlite3.Connection) -> set[str]:
    return {
        str(r[0])
        for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        if not str(r[0]).startswith("sqlite_")
    }


def columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [str(r[1]) for r in conn.execute(f'PRAGMA table_info("{table}")')]


def indexes(conn: sqlite3.Connection, table: str) -> set[str]:
    return {str(r[1]) for r in conn.execute(f'PRAGMA index_list("{table}")') if r[3] == "c"}


def _migrated_file(tmp_path: Path) -> tuple[str, sqlite3.Connection]:
    """A database file under ``tmp_path`` migrated to the newest version: its path and connection."""
    path = str(tmp_path / "routerd.sqlite")
    conn = connect(path)
    migrate(conn)
    return path, conn


def test_fresh_database_migrates_to_the_newest_version_with_every_table() -> None:
    conn = connect(":memory:")
    assert current_version(conn) == 0
    assert migrate(conn) == len(MIGRATIONS)
    assert tables(conn) == V1_TABLES | V3_TABLES | V5_TABLES
    versions = [r[0] for r in conn.execute("SELECT version FROM schema_version ORDER BY version")]
    assert versions == list(range(1, len(MIGRATIONS) + 1))


def test_v1_decision_log_has_exactly_the_contract_columns() -> None:
    conn = connect(":memory:")
    migrate(conn)
    assert columns(conn, "offload_decisions") == DECISION_COLUMNS
    assert "offload_decisions_recorded" in indexes(conn, "offload_decisions")


def test_v1_sample_and_link_tables_have_the_agreed_columns_and_indexes() -> None:
    conn = connect(":memory:")
    migrate(conn)
    assert columns(conn, "request_samples") == [
        "id", "node_id", "model_id", "section", "work", "duration_ms", "status", "http_status",
        "request_bytes", "finished_at",
    ]  # fmt: skip
    assert columns(conn, "load_samples") == [
        "id", "config_filename", "model_id", "runtime", "duration_ms", "status", "reason", "finished_at",
    ]  # fmt: skip
    assert "request_samples_model_section_finished" in indexes(conn, "request_samples")
    assert "load_samples_config_finished" in indexes(conn, "load_samples")
    link_columns = [
        "owner_node_id", "owner_model_id", "helper_node_id", "helper_model_id", "load_if_unloaded",
        "restore_after_borrow",
    ]  # fmt: skip
    for table in ("routing_image_links", "routing_text_links"):
        assert columns(conn, table) == link_columns
    assert columns(conn, "offload_settings") == ["key", "value", "updated_at"]
    assert columns(conn, "guardians") == [
        "scope", "node_id", "model_id", "guardian_node_id", "guardian_model_id",
    ]  # fmt: skip
    assert columns(conn, "public_ids") == ["identity", "base_id", "public_id", "assigned_at"]


def test_link_defaults_are_load_if_unloaded_1_and_restore_after_borrow_0() -> None:
    conn = connect(":memory:")
    migrate(conn)
    conn.execute(
        "INSERT INTO routing_text_links (owner_node_id, owner_model_id, helper_node_id, helper_model_id)"
        " VALUES ('a', 'm', 'b', 'n')"
    )
    assert conn.execute(
        "SELECT load_if_unloaded, restore_after_borrow FROM routing_text_links"
    ).fetchone() == (1, 0)


def test_migrate_twice_is_a_no_op(tmp_path: Path) -> None:
    path, conn = _migrated_file(tmp_path)
    conn.execute(
        "INSERT INTO offload_settings (key, value, updated_at) VALUES ('offload_probe_idle', '5s', 1)"
    )
    conn.close()
    conn = connect(path)
    assert migrate(conn) == len(MIGRATIONS)
    assert conn.execute("SELECT COUNT(*) FROM schema_version").fetchone() == (len(MIGRATIONS),)
    assert conn.execute("SELECT value FROM offload_settings").fetchone() == ("5s",)


def test_v1_database_is_upgraded_by_an_added_step(tmp_path: Path) -> None:
    path, conn = _migrated_file(tmp_path)
    conn.execute(
        "INSERT INTO request_samples (model_id, section, work, duration_ms, status, finished_at)"
        " VALUES ('m', 'llm', '[1, 2]', 10.0, 'ok', 5)"
    )
    conn.close()

    def add_backfilled_column(c: sqlite3.Connection) -> None:
        c.execute("UPDATE request_samples SET tenant = 'default'")

    n = len(MIGRATIONS)
    steps = (
        *MIGRATIONS,
        Migration(
            n + 1,
            "tenant column",
            "ALTER TABLE request_samples ADD COLUMN tenant TEXT; "
            "CREATE INDEX request_samples_tenant ON request_samples (tenant);",
        ),
        Migration(n + 2, "backfill tenant", add_backfilled_column),
    )
    conn = connect(path)
    assert migrate(conn, steps) == n + 2
    assert conn.execute("SELECT model_id, tenant FROM request_samples").fetchall() == [("m", "default")]
    versions = [r[0] for r in conn.execute("SELECT version FROM schema_version ORDER BY version")]
    assert versions == list(range(1, n + 3))
    assert migrate(conn, steps) == n + 2


def test_v1_public_ids_survive_the_v2_rekeying(tmp_path: Path) -> None:
    conn = connect(str(tmp_path / "routerd.sqlite"))
    assert migrate(conn, MIGRATIONS[:1]) == 1
    conn.execute("INSERT INTO public_ids VALUES ('h:c', 'llama', 'llama-2', 5)")
    assert migrate(conn) >= 2
    assert conn.execute("SELECT identity, base_id, public_id FROM public_ids").fetchall() == [
        ("h:c", "llama", "llama-2")]
    # the same identity may now hold a public ID under a second base ID
    conn.execute("INSERT INTO public_ids VALUES ('h:c', 'alias', 'alias', 6)")
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("INSERT INTO public_ids VALUES ('x:y', 'other', 'llama-2', 7)")


def test_failing_step_rolls_back_alone_and_keeps_earlier_steps() -> None:
    conn = connect(":memory:")

    def broken(c: sqlite3.Connection) -> None:
        c.execute("CREATE TABLE half_done (x INTEGER)")
        raise RuntimeError("boom")

    steps = (*MIGRATIONS, Migration(len(MIGRATIONS) + 1, "broken", broken))
    with pytest.raises(RuntimeError, match="boom"):
        migrate(conn, steps)
    assert current_version(conn) == len(MIGRATIONS)
    assert "half_done" not in tables(conn)
    assert "request_samples" in tables(conn)


def test_database_newer_than_the_code_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    path, conn = _migrated_file(tmp_path)
    conn.execute("INSERT INTO schema_version (version, applied_at) VALUES (7, 0)")
    n = len(MIGRATIONS)
    with pytest.raises(SchemaTooNewError, match=f"version 7 is newer .*newest known: {n}") as info:
        migrate(conn)
    assert (info.value.found, info.value.known) == (7, n)
    conn.close()
    with pytest.raises(SchemaTooNewError):
        Store.open_sync(path)


def test_misnumbered_migration_list_is_rejected() -> None:
    conn = connect(":memory:")
    with pytest.raises(MigrationError, match="numbered"):
        migrate(conn, (*MIGRATIONS, Migration(len(MIGRATIONS) + 2, "gap", "SELECT 1")))


def test_split_statements_respects_semicolons_inside_literals() -> None:
    assert split_statements("INSERT INTO t VALUES ('a;b'); SELECT 1;\n") == [
        "INSERT INTO t VALUES ('a;b');",
        "SELECT 1;",
    ]
    with pytest.raises(MigrationError):
        split_statements("SELECT 1; SELECT 'unterminated")
