"""Lending setting overrides (``offload_settings``): plain CRUD over a connection.

Values arrive already normalised (``routerd.config.lending.normalise``); a
batch is stored whole or not at all.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping

from routerd.store.runner import transaction


def get_overrides(conn: sqlite3.Connection) -> dict[str, str]:
    """Key → stored value, in key order."""
    return {str(k): str(v) for k, v in conn.execute("SELECT key, value FROM offload_settings ORDER BY key")}


def get_override_times(conn: sqlite3.Connection) -> dict[str, int]:
    """Key → when its override was last written (ms)."""
    return {str(k): int(t) for k, t in conn.execute("SELECT key, updated_at FROM offload_settings")}


def set_overrides(conn: sqlite3.Connection, values: Mapping[str, str], now_ms: int) -> None:
    """Insert or update every value of the batch in one transaction."""
    with transaction(conn):
        for key, value in values.items():
            conn.execute(
                "INSERT INTO offload_settings (key, value, updated_at) VALUES (?, ?, ?)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
                (key, value, now_ms),
            )


def delete_overrides(conn: sqlite3.Connection, key: str | None = None) -> int:
    """Delete one override, or every override when ``key`` is None; return how many went."""
    if key is None:
        cursor = conn.execute("DELETE FROM offload_settings")
    else:
        cursor = conn.execute("DELETE FROM offload_settings WHERE key = ?", (key,))
    return int(cursor.rowcount)


def replace_overrides(conn: sqlite3.Connection, values: Mapping[str, str], now_ms: int) -> None:
    """Make ``values`` the whole override set (a slave keeping its master's push), in one transaction."""
    with transaction(conn):
        conn.execute("DELETE FROM offload_settings")
        set_overrides(conn, values, now_ms)
