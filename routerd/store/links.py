"""Routing links, one table per lane (lending reference §2.1–2.2): plain CRUD over a connection.

Validation (eligibility, trimming, weights) is the lending layer's job; the
only rule kept here is that owner and helper sit on different nodes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

import attrs

from routerd.lanes import Lane
from routerd.store.runner import transaction

TABLES: dict[Lane, str] = {"image": "routing_image_links", "text": "routing_text_links"}


@attrs.frozen
class LinkRow:
    """One stored link: the owner lends work to the helper."""

    owner_node_id: str
    owner_model_id: str
    helper_node_id: str
    helper_model_id: str
    load_if_unloaded: bool = True
    restore_after_borrow: bool = False


class SameNodeLinkError(ValueError):
    """A link whose owner and helper are on the same node."""


def _table(lane: Lane) -> str:
    try:
        return TABLES[lane]
    except KeyError:
        raise ValueError(f"unknown lane {lane!r}; expected 'image' or 'text'") from None


def list_links(conn: sqlite3.Connection, lane: Lane) -> list[LinkRow]:
    """Every link of ``lane`` ordered by owner node, owner model, helper node, helper model."""
    rows = conn.execute(
        "SELECT owner_node_id, owner_model_id, helper_node_id, helper_model_id, load_if_unloaded,"
        f" restore_after_borrow FROM {_table(lane)}"
        " ORDER BY owner_node_id, owner_model_id, helper_node_id, helper_model_id"
    )
    return [
        LinkRow(str(on), str(om), str(hn), str(hm), bool(load), bool(restore))
        for on, om, hn, hm, load, restore in rows
    ]


def _insert(conn: sqlite3.Connection, lane: Lane, rows: Iterable[LinkRow]) -> None:
    table = _table(lane)
    for row in rows:
        if row.owner_node_id == row.helper_node_id:
            raise SameNodeLinkError(
                f"model {row.owner_model_id} cannot lend work to a model on its own node"
                f" ({row.owner_node_id})"
            )
        conn.execute(
            f"INSERT OR REPLACE INTO {table} (owner_node_id, owner_model_id, helper_node_id,"
            " helper_model_id, load_if_unloaded, restore_after_borrow) VALUES (?, ?, ?, ?, ?, ?)",
            (
                row.owner_node_id,
                row.owner_model_id,
                row.helper_node_id,
                row.helper_model_id,
                int(row.load_if_unloaded),
                int(row.restore_after_borrow),
            ),
        )


def replace_links(conn: sqlite3.Connection, lane: Lane, rows: Iterable[LinkRow]) -> None:
    """Make ``rows`` the whole link set of ``lane`` (atomically; a duplicate's last copy wins)."""
    with transaction(conn):
        conn.execute(f"DELETE FROM {_table(lane)}")
        _insert(conn, lane, rows)


def delete_anchor_links(conn: sqlite3.Connection, lane: Lane, node_id: str, model_id: str) -> int:
    """Remove every link with the anchor as owner or helper; return how many went."""
    cursor = conn.execute(
        f"DELETE FROM {_table(lane)} WHERE (owner_node_id = ? AND owner_model_id = ?)"
        " OR (helper_node_id = ? AND helper_model_id = ?)",
        (node_id, model_id, node_id, model_id),
    )
    return int(cursor.rowcount)


def replace_anchor_links(
    conn: sqlite3.Connection, lane: Lane, node_id: str, model_id: str, rows: Iterable[LinkRow]
) -> None:
    """Replace every link touching the anchor (both directions) with ``rows``, atomically."""
    with transaction(conn):
        delete_anchor_links(conn, lane, node_id, model_id)
        _insert(conn, lane, rows)
