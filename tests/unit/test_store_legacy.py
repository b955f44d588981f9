"""Legacy symmetric routing groups become one-way links when the store opens (lending §2.5)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from routerd.store.migrations import convert_legacy_groups, migrate
from routerd.store.runner import connect
from routerd.store.store import Store

LINKS_SQL = (
    "SELECT owner_node_id, owner_model_id, helper_node_id, helper_model_id, load_if_unloaded,"
    " restore_after_borrow FROM {} ORDER BY 1, 2, 3, 4"
)


def legacy_db(
    path: Path,
    image_members: list[tuple[str, str, str, int]] | None = None,
    text_members: list[tuple[str, str, str, int]] | None = None,
    *,
    flags: bool = True,
) -> str:
    """A legacy database; members are (node_id, model, group_id, restore_after_borrow)."""
    conn = sqlite3.connect(path)
    flag_column = ", restore_after_borrow INTEGER NOT NULL DEFAULT 0" if flags else ""
    tables = (("routing_groups", "routing_group_members", "image_id", image_members),
              ("routing_text_groups", "routing_text_group_members", "model_id", text_members))
    for groups, members_table, id_column, members in tables:
        if members is None:
            continue
        conn.execute(f"CREATE TABLE {groups} (id TEXT PRIMARY KEY, name TEXT)")
        columns = f"node_id TEXT, {id_column} TEXT, group_id TEXT{flag_column}"
        conn.execute(f"CREATE TABLE {members_table} ({columns})")
        for node, model, group, flag in members:
            conn.execute(f"INSERT OR IGNORE INTO {groups} VALUES (?, ?)", (group, group))
            row = (node, model, group, flag) if flags else (node, model, group)
            conn.execute(f"INSERT INTO {members_table} VALUES ({', '.join('?' * len(row))})", row)
    conn.commit()
    conn.close()
    return str(path)


def links(conn: sqlite3.Connection, table: str) -> list[tuple[object, ...]]:
    return conn.execute(LINKS_SQL.format(table)).fetchall()


def legacy_tables(conn: sqlite3.Connection) -> set[str]:
    return {
        str(r[0])
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'routing_%group%'"
        )
    }


def test_every_ordered_cross_node_pair_becomes_a_link_with_the_helpers_flag(tmp_path: Path) -> None:
    path = legacy_db(
        tmp_path / "routerd.sqlite",
        image_members=[("a", "sd", "g1", 0), ("b", "sd", "g1", 1), ("c", "sdx", "g1", 0)],
        text_members=[("a", "llama", "t1", 1), ("b", "llama", "t1", 0)],
    )
    store = Store.open_sync(path)
    store.close()
    conn = connect(path)
    assert links(conn, "routing_image_links") == [
        ("a", "sd", "b", "sd", 1, 1),
        ("a", "sd", "c", "sdx", 1, 0),
        ("b", "sd", "a", "sd", 1, 0),
        ("b", "sd", "c", "sdx", 1, 0),
        ("c", "sdx", "a", "sd", 1, 0),
        ("c", "sdx", "b", "sd", 1, 1),
    ]
    assert links(conn, "routing_text_links") == [
        ("a", "llama", "b", "llama", 1, 0),
        ("b", "llama", "a", "llama", 1, 1),
    ]
    assert legacy_tables(conn) == set()


def test_members_on_the_same_node_are_not_linked_and_groups_stay_separate(tmp_path: Path) -> None:
    path = legacy_db(
        tmp_path / "routerd.sqlite",
        image_members=[
            ("a", "sd1", "g1", 0),
            ("a", "sd2", "g1", 0),
            ("b", "sd3", "g2", 0),
            ("c", "sd4", "g3", 0),
        ],
        text_members=[],
    )
    Store.open_sync(path).close()
    conn = connect(path)
    assert links(conn, "routing_image_links") == []
    assert links(conn, "routing_text_links") == []
    assert legacy_tables(conn) == set()


def test_missing_flag_column_gives_restore_after_borrow_0(tmp_path: Path) -> None:
    path = legacy_db(
        tmp_path / "routerd.sqlite", image_members=[("a", "sd", "g", 0), ("b", "sd", "g", 0)], flags=False
    )
    Store.open_sync(path).close()
    conn = connect(path)
    assert links(conn, "routing_image_links") == [("a", "sd", "b", "sd", 1, 0), ("b", "sd", "a", "sd", 1, 0)]


def test_missing_text_tables_are_tolerated(tmp_path: Path) -> None:
    path = legacy_db(tmp_path / "routerd.sqlite", image_members=[("a", "sd", "g", 1), ("b", "sd", "g", 0)])
    Store.open_sync(path).close()
    conn = connect(path)
    assert len(links(conn, "routing_image_links")) == 2
    assert links(conn, "routing_text_links") == []
    assert legacy_tables(conn) == set()


def test_existing_links_win_over_converted_ones(tmp_path: Path) -> None:
    path = str(tmp_path / "routerd.sqlite")
    conn = connect(path)
    migrate(conn)
    conn.execute("INSERT INTO routing_image_links VALUES ('a', 'sd', 'b', 'sd', 0, 0)")
    conn.close()
    legacy_db(tmp_path / "routerd.sqlite", image_members=[("a", "sd", "g", 1), ("b", "sd", "g", 1)])
    conn = connect(path)
    assert convert_legacy_groups(conn) == 1
    assert links(conn, "routing_image_links") == [("a", "sd", "b", "sd", 0, 0), ("b", "sd", "a", "sd", 1, 1)]


def test_conversion_is_idempotent(tmp_path: Path) -> None:
    path = legacy_db(tmp_path / "routerd.sqlite", text_members=[("a", "m", "t", 0), ("b", "m", "t", 1)])
    Store.open_sync(path).close()
    conn = connect(path)
    before = links(conn, "routing_text_links")
    assert convert_legacy_groups(conn) == 0
    conn.close()
    Store.open_sync(path).close()
    assert (
        links(connect(path), "routing_text_links")
        == before
        == [
            ("a", "m", "b", "m", 1, 1),
            ("b", "m", "a", "m", 1, 0),
        ]
    )


def test_a_failing_conversion_changes_nothing(tmp_path: Path) -> None:
    path = legacy_db(
        tmp_path / "routerd.sqlite",
        image_members=[("a", "sd", "g", 0), ("b", "sd", "g", 0)],
        text_members=[("a", "m", "t", 0), ("b", "m", "t", 0)],
    )
    conn = connect(path)
    migrate(conn)
    # Sabotage the text lane: its link table is gone, so the second lane fails mid-conversion.
    conn.execute("DROP TABLE routing_text_links")
    try:
        convert_legacy_groups(conn)
    except sqlite3.OperationalError:
        pass
    else:  # pragma: no cover
        raise AssertionError("conversion should have failed")
    assert links(conn, "routing_image_links") == []
    assert legacy_tables(conn) == {
        "routing_groups", "routing_group_members", "routing_text_groups", "routing_text_group_members",
    }  # fmt: skip
