"""Versioned schema of the router database.

``MIGRATIONS`` is the ordered list of steps; step *n* turns a version *n-1*
database into version *n*.  A later schema change is one more entry at the end
(never edit a released step).  ``migrate`` applies the missing steps, each in
its own transaction together with its ``schema_version`` row, so a crash leaves
the database at a whole version.  A database written by newer code (a version
above the last step) is refused with ``SchemaTooNewError``.

``convert_legacy_groups`` turns the upstream symmetric routing groups into
one-way links (lending reference §2.5); the store runs it after ``migrate``.
"""

from __future__ import annotations

import sqlite3
import time
from collections import defaultdict
from collections.abc import Callable, Sequence

import attrs

from routerd.store.analytics import SCHEMA_SQL as _V4_SQL
from routerd.store.request_log import SCHEMA_V6_SQL as _V6_SQL
from routerd.store.runner import transaction

Step = str | Sequence[str] | Callable[[sqlite3.Connection], None]


@attrs.frozen
class Migration:
    """One schema step: SQL text (one or more statements) or a function of the connection."""

    version: int
    description: str
    apply: Step


class MigrationError(RuntimeError):
    """The migration list or the database's schema history is not usable."""


class SchemaTooNewError(MigrationError):
    """The database was written by a newer routerd than this one."""

    def __init__(self, found: int, known: int) -> None:
        super().__init__(
            f"router database schema version {found} is newer than this routerd understands "
            f"(newest known: {known}); upgrade routerd or point cluster.store_dir at another directory"
        )
        self.found = found
        self.known = known


# The two lanes' link tables have one shape.
_LINKS_TABLE = """CREATE TABLE routing_{lane}_links (
    owner_node_id TEXT NOT NULL,
    owner_model_id TEXT NOT NULL,
    helper_node_id TEXT NOT NULL,
    helper_model_id TEXT NOT NULL,
    load_if_unloaded INTEGER NOT NULL DEFAULT 1,
    restore_after_borrow INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (owner_node_id, owner_model_id, helper_node_id, helper_model_id)
);
"""

_V1_SQL = """
CREATE TABLE request_samples (
    id INTEGER PRIMARY KEY,
    node_id TEXT NOT NULL DEFAULT '',
    model_id TEXT NOT NULL,
    section TEXT NOT NULL,
    work TEXT NOT NULL DEFAULT '[]',
    duration_ms REAL NOT NULL,
    status TEXT NOT NULL,
    http_status INTEGER NOT NULL DEFAULT 0,
    request_bytes INTEGER NOT NULL DEFAULT 0,
    finished_at INTEGER NOT NULL
);
CREATE INDEX request_samples_model_section_finished
    ON request_samples (model_id, section, finished_at);
CREATE INDEX request_samples_finished ON request_samples (finished_at);

CREATE TABLE load_samples (
    id INTEGER PRIMARY KEY,
    config_filename TEXT NOT NULL,
    model_id TEXT NOT NULL DEFAULT '',
    runtime TEXT NOT NULL,
    duration_ms REAL NOT NULL,
    status TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    finished_at INTEGER NOT NULL
);
CREATE INDEX load_samples_config_finished ON load_samples (config_filename, finished_at);
CREATE INDEX load_samples_finished ON load_samples (finished_at);

CREATE TABLE offload_decisions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    recorded_at INTEGER NOT NULL,
    node_id TEXT NOT NULL DEFAULT '',
    kind TEXT NOT NULL,
    "trigger" TEXT NOT NULL DEFAULT '',
    lane TEXT NOT NULL,
    owner_node_id TEXT NOT NULL DEFAULT '',
    owner_model_id TEXT NOT NULL DEFAULT '',
    helper_node_id TEXT NOT NULL DEFAULT '',
    helper_model_id TEXT NOT NULL DEFAULT '',
    outcome TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    request_id TEXT NOT NULL DEFAULT '',
    pending_count INTEGER NOT NULL DEFAULT 0,
    backlog_count INTEGER NOT NULL DEFAULT 0,
    keep_ms REAL NOT NULL DEFAULT 0,
    switch_ms REAL NOT NULL DEFAULT 0,
    restore_ms REAL NOT NULL DEFAULT 0,
    service_ms REAL NOT NULL DEFAULT 0,
    owner_job_ms REAL NOT NULL DEFAULT 0,
    service_source TEXT NOT NULL DEFAULT '',
    helper_idle_ms REAL NOT NULL DEFAULT 0,
    slots INTEGER NOT NULL DEFAULT 0,
    lent_out INTEGER NOT NULL DEFAULT 0,
    borrowed_ahead INTEGER NOT NULL DEFAULT 0,
    wait_ms REAL NOT NULL DEFAULT 0,
    router_version TEXT NOT NULL DEFAULT ''
);
CREATE INDEX offload_decisions_recorded ON offload_decisions (recorded_at DESC);

{image_links}
{text_links}
CREATE TABLE offload_settings (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    updated_at INTEGER NOT NULL
);

CREATE TABLE guardians (
    scope TEXT NOT NULL,
    node_id TEXT NOT NULL DEFAULT '',
    model_id TEXT NOT NULL DEFAULT '',
    guardian_node_id TEXT NOT NULL,
    guardian_model_id TEXT NOT NULL,
    PRIMARY KEY (scope, node_id, model_id)
);

CREATE TABLE public_ids (
    identity TEXT PRIMARY KEY,
    base_id TEXT NOT NULL,
    public_id TEXT NOT NULL UNIQUE,
    assigned_at INTEGER NOT NULL
);
""".replace("{image_links}", _LINKS_TABLE.format(lane="image")).replace(
    "{text_links}", _LINKS_TABLE.format(lane="text"))

# v2: one identity (model hash + config hash) may be configured under two base
# IDs, so a persisted public ID is keyed by both.
_V2_SQL = """
CREATE TABLE public_ids_v2 (
    identity TEXT NOT NULL,
    base_id TEXT NOT NULL,
    public_id TEXT NOT NULL UNIQUE,
    assigned_at INTEGER NOT NULL,
    PRIMARY KEY (identity, base_id)
);
INSERT INTO public_ids_v2 (identity, base_id, public_id, assigned_at)
    SELECT identity, base_id, public_id, assigned_at FROM public_ids;
DROP TABLE public_ids;
ALTER TABLE public_ids_v2 RENAME TO public_ids;
"""

# v3: a decision about a request names its priority class and its key's name.
_V3_SQL = """
ALTER TABLE offload_decisions ADD COLUMN priority TEXT NOT NULL DEFAULT '';
ALTER TABLE offload_decisions ADD COLUMN key_name TEXT NOT NULL DEFAULT '';
"""

# v5: a replica_choice decision (routing.replica_choice) names the session key's hash, the chosen
# replica's load, the mean load and the replica a key moved from.
_V5_SQL = """
ALTER TABLE offload_decisions ADD COLUMN key_hash TEXT NOT NULL DEFAULT '';
ALTER TABLE offload_decisions ADD COLUMN load_ms REAL NOT NULL DEFAULT 0;
ALTER TABLE offload_decisions ADD COLUMN mean_load_ms REAL NOT NULL DEFAULT 0;
ALTER TABLE offload_decisions ADD COLUMN moved_from TEXT NOT NULL DEFAULT '';
"""

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "samples, decision log, routing links, lending settings, guardians, public IDs", _V1_SQL),
    Migration(2, "public IDs keyed by identity and base ID", _V2_SQL),
    Migration(3, "decision log: a request's priority class and key name", _V3_SQL),
    Migration(4, "analytics: request and load rows, minute/hour/day rollups", _V4_SQL),
    Migration(5, "decision log: replica choice key hash, loads and the replica a key left", _V5_SQL),
    Migration(6, "request log: request ID, local ID, lent sides, cached tokens, reason; rollups by local ID",
              _V6_SQL),
)


def split_statements(sql: str) -> list[str]:
    """Split SQL text into complete statements (semicolons inside literals are respected)."""
    statements: list[str] = []
    pending = ""
    for piece in sql.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \t\r\n;"):
                statements.append(pending.strip())
            pending = ""
    if pending.strip(" \t\r\n;"):
        raise MigrationError(f"incomplete SQL statement in migration: {pending.strip()!r}")
    return statements


def _ensure_version_table(conn: sqlite3.Connection) -> None:
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_version ("
        " version INTEGER PRIMARY KEY, description TEXT NOT NULL DEFAULT '', applied_at INTEGER NOT NULL)"
    )


def current_version(conn: sqlite3.Connection) -> int:
    """The database's schema version (0 for a fresh database)."""
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
    ).fetchone()
    if exists is None:
        return 0
    row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    return int(row[0]) if row is not None and row[0] is not None else 0


def _check_steps(steps: Sequence[Migration]) -> None:
    for expected, step in enumerate(steps, start=1):
        if step.version != expected:
            raise MigrationError(
                f"migration steps must be numbered 1, 2, 3, ... in order; step {expected} has version "
                f"{step.version}"
            )


def _apply(conn: sqlite3.Connection, step: Migration) -> None:
    if callable(step.apply):
        step.apply(conn)
        return
    statements = split_statements(step.apply) if isinstance(step.apply, str) else list(step.apply)
    for statement in statements:
        conn.execute(statement)


def migrate(conn: sqlite3.Connection, steps: Sequence[Migration] = MIGRATIONS) -> int:
    """Bring the database up to the last of ``steps``; return the resulting version.

    Each missing step runs in its own transaction with its ``schema_version``
    row (nested as savepoints if the caller already holds a transaction).
    Running it again is a no-op.  Raises ``SchemaTooNewError`` for a database
    newer than ``steps``.
    """
    _check_steps(steps)
    newest = len(steps)
    with transaction(conn):
        _ensure_version_table(conn)
    found = current_version(conn)
    if found > newest:
        raise SchemaTooNewError(found, newest)
    for step in steps:
        with transaction(conn):
            # Re-read inside the (IMMEDIATE) transaction: another process may have just migrated.
            found = current_version(conn)
            if found > newest:
                raise SchemaTooNewError(found, newest)
            if step.version <= found:
                continue
            _apply(conn, step)
            conn.execute(
                "INSERT INTO schema_version (version, description, applied_at) VALUES (?, ?, ?)",
                (step.version, step.description, int(time.time() * 1000)),
            )
    return current_version(conn)


# --- legacy symmetric routing groups → one-way links (lending reference §2.5) ---------------------


@attrs.frozen
class _LegacyLane:
    groups_table: str
    members_table: str
    model_column: str
    links_table: str


_LEGACY_LANES = (
    _LegacyLane("routing_groups", "routing_group_members", "image_id", "routing_image_links"),
    _LegacyLane("routing_text_groups", "routing_text_group_members", "model_id", "routing_text_links"),
)


def _table_exists(conn: sqlite3.Connection, name: str) -> bool:
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone()
    return row is not None


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {str(row[1]) for row in conn.execute(f'PRAGMA table_info("{table}")')}


def _flag(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, str):
        return 1 if value.strip().lower() in ("1", "true", "t", "yes", "on") else 0
    return 1 if value else 0


def _convert_lane(conn: sqlite3.Connection, lane: _LegacyLane) -> int:
    inserted = 0
    if _table_exists(conn, lane.members_table):
        columns = _columns(conn, lane.members_table)
        flag_expr = "restore_after_borrow" if "restore_after_borrow" in columns else "0"
        rows = conn.execute(
            f"SELECT group_id, node_id, {lane.model_column}, {flag_expr} FROM {lane.members_table}"
            " ORDER BY group_id, node_id, " + lane.model_column
        ).fetchall()
        groups: dict[object, list[tuple[str, str, int]]] = defaultdict(list)
        for group_id, node_id, model_id, flag in rows:
            node = str(node_id or "").strip()
            model = str(model_id or "").strip()
            if node and model:
                groups[group_id].append((node, model, _flag(flag)))
        for members in groups.values():
            for owner_node, owner_model, _owner_flag in members:
                for helper_node, helper_model, helper_flag in members:
                    if owner_node == helper_node:
                        continue
                    cursor = conn.execute(
                        f"INSERT OR IGNORE INTO {lane.links_table} (owner_node_id, owner_model_id,"
                        " helper_node_id, helper_model_id, load_if_unloaded, restore_after_borrow)"
                        " VALUES (?, ?, ?, ?, 1, ?)",
                        (owner_node, owner_model, helper_node, helper_model, helper_flag),
                    )
                    inserted += cursor.rowcount
        conn.execute(f"DROP TABLE {lane.members_table}")
    if _table_exists(conn, lane.groups_table):
        conn.execute(f"DROP TABLE {lane.groups_table}")
    return inserted


def convert_legacy_groups(conn: sqlite3.Connection) -> int:
    """Turn legacy symmetric routing groups into links and drop the old tables.

    Every ordered pair of members of one group on different nodes becomes a
    link owner → helper with ``load_if_unloaded = 1`` and
    ``restore_after_borrow`` = the helper member's old flag (0 without that
    column).  Existing links win (conflicts ignored); blank endpoints are
    skipped; a lane whose tables are missing is skipped.  Both lanes convert in
    one transaction.  Idempotent (a second run finds nothing).  Needs the link
    tables, so run it after ``migrate``.  Returns the number of links inserted.
    """
    legacy = [
        name
        for lane in _LEGACY_LANES
        for name in (lane.groups_table, lane.members_table)
        if _table_exists(conn, name)
    ]
    if not legacy:
        return 0
    inserted = 0
    with transaction(conn):
        for lane in _LEGACY_LANES:
            inserted += _convert_lane(conn, lane)
    return inserted
