"""docs/contract.md's table of the router database (§8) is exactly the schema the migrations build:
every table and every column of each, read from an in-memory SQLite database migrated to the newest
version (``sqlite_master`` and ``pragma table_info``), so a migration that adds a table or a column
fails here until the contract says what it holds."""

from __future__ import annotations

import re
import sqlite3

from routerd.store.migrations import MIGRATIONS, migrate

from . import contract_doc

_RANGE = re.compile(r"`([a-z_]+?)(\d+)`…`\1(\d+)`")


def migrated_schema() -> dict[str, set[str]]:
    """Table → its columns, after every migration on an empty database."""
    conn = sqlite3.connect(":memory:")
    try:
        assert migrate(conn) == MIGRATIONS[-1].version
        names = [row[0] for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
        return {name: {row[1] for row in conn.execute(f'PRAGMA table_info("{name}")')} for name in names}
    finally:
        conn.close()


def _ranges(cell: str) -> set[str]:
    """The columns a range names: `d0`…`d39` is d0, d1, … d39."""
    return {f"{stem}{n}" for stem, first, last in _RANGE.findall(cell)
            for n in range(int(first), int(last) + 1)}


def contract_schema() -> dict[str, set[str]]:
    rows = contract_doc.table_after(contract_doc.section(8), "| table |")
    out: dict[str, set[str]] = {}
    for row in rows:
        for name in contract_doc.ticked(row[0]):
            assert name not in out, f"{name} is listed twice"
            out[name] = contract_doc.ticked(row[1]) | _ranges(row[1])
    return out


def test_the_migrated_schema_has_the_tables_known_to_exist() -> None:
    schema = migrated_schema()
    assert {"offload_decisions", "analytics_requests", "public_ids", "schema_version"} <= set(schema)
    assert {"priority", "key_name"} <= schema["offload_decisions"]


def test_every_table_and_column_of_the_migrations_is_in_the_contract() -> None:
    documented = contract_schema()
    missing: list[str] = []
    for table, columns in sorted(migrated_schema().items()):
        if table not in documented:
            missing.append(table)
        else:
            missing += [f"{table}.{column}" for column in sorted(columns - documented[table])]
    assert missing == []


def test_the_contract_names_no_table_or_column_the_migrations_do_not_build() -> None:
    schema = migrated_schema()
    extra = sorted(f"{table}.{column}" for table, columns in contract_schema().items()
                   for column in columns if column not in schema.get(table, set()))
    assert extra == []
