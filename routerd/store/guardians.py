"""Guardian settings (table ``guardians``, contract §8): plain CRUD over a connection.

Validation (scopes, multimodal guardians, known nodes and models) is the lending layer's job; a row
is keyed by ``(scope, node_id, model_id)`` with ``''`` for the parts a scope leaves out.
"""

from __future__ import annotations

import sqlite3

import attrs

from routerd.store.runner import transaction


@attrs.frozen
class GuardianRow:
    scope: str
    node_id: str
    model_id: str
    guardian_node_id: str
    guardian_model_id: str


def list_guardians(conn: sqlite3.Connection) -> list[GuardianRow]:
    """Every row, ordered by scope, node and model."""
    rows = conn.execute(
        "SELECT scope, node_id, model_id, guardian_node_id, guardian_model_id FROM guardians"
        " ORDER BY scope, node_id, model_id")
    return [GuardianRow(str(s), str(n), str(m), str(gn), str(gm)) for s, n, m, gn, gm in rows]


def _insert(conn: sqlite3.Connection, rows: list[GuardianRow]) -> None:
    for row in rows:
        conn.execute(
            "INSERT OR REPLACE INTO guardians (scope, node_id, model_id, guardian_node_id,"
            " guardian_model_id) VALUES (?, ?, ?, ?, ?)",
            (row.scope, row.node_id, row.model_id, row.guardian_node_id, row.guardian_model_id))


def put_guardians(conn: sqlite3.Connection, rows: list[GuardianRow]) -> None:
    """Insert or replace every row (keyed by scope, node, model) in one transaction."""
    with transaction(conn):
        _insert(conn, rows)


def delete_guardian(conn: sqlite3.Connection, scope: str, node_id: str, model_id: str) -> int:
    """Delete the row of one scope key; the number removed (0 or 1)."""
    with transaction(conn):
        cursor = conn.execute("DELETE FROM guardians WHERE scope = ? AND node_id = ? AND model_id = ?",
                              (scope, node_id, model_id))
        return int(cursor.rowcount)


def replace_guardians(conn: sqlite3.Connection, rows: list[GuardianRow]) -> None:
    """Make ``rows`` every guardian setting (a slave keeping its master's push), in one transaction."""
    with transaction(conn):
        conn.execute("DELETE FROM guardians")
        _insert(conn, rows)
