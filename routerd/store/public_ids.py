"""Persisted public-ID assignments (``public_ids``): plain SQL over a connection."""

from __future__ import annotations

import sqlite3


def list_public_ids(conn: sqlite3.Connection) -> list[tuple[str, str, str]]:
    """Every ``(identity, base_id, public_id)``, in public-ID order."""
    rows = conn.execute("SELECT identity, base_id, public_id FROM public_ids ORDER BY public_id")
    return [(str(a), str(b), str(c)) for a, b, c in rows]


def save_public_id(
    conn: sqlite3.Connection, identity: str, base_id: str, public_id: str, now_ms: int
) -> None:
    """Give ``public_id`` to this identity alone (replacing the identity's earlier one)."""
    conn.execute("DELETE FROM public_ids WHERE public_id = ? AND NOT (identity = ? AND base_id = ?)",
                 (public_id, identity, base_id))
    conn.execute("INSERT OR REPLACE INTO public_ids (identity, base_id, public_id, assigned_at) "
                 "VALUES (?, ?, ?, ?)", (identity, base_id, public_id, now_ms))
