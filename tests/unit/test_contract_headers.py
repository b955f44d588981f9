"""docs/contract.md's header table (§4 "Headers") lists every ``X-Routerd-*`` header the code sets
or reads, and no other.  routerd spells its header names as string or bytes literals where it sets
or reads them (a module's constant, a ``set_header`` call, a relay's header map), so the names are
collected from the literals of every module of ``routerd`` (its AST, comments left out; a docstring
naming a header counts, as the code that reads it is near)."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import routerd

from . import contract_doc

_NAME = re.compile(r"\bx-routerd(?:-[a-z]+)+", re.IGNORECASE)
PACKAGE = Path(routerd.__file__).resolve().parent


def _spelled(name: str) -> str:
    """The header's canonical spelling (``x-routerd-lent-to`` → ``X-Routerd-Lent-To``)."""
    return "-".join(part.capitalize() for part in name.split("-"))


@cache
def code_headers() -> dict[str, set[str]]:
    """Header name → the modules whose literals name it."""
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
                value = node.value.decode("latin-1") if isinstance(node.value, bytes) else node.value
                for match in _NAME.findall(value):
                    found.setdefault(_spelled(match), set()).add(str(path.relative_to(PACKAGE)))
    return found


def contract_headers() -> set[str]:
    rows = contract_doc.table_after(contract_doc.section(4), "| header |")
    return {_spelled(name) for row in rows for name in contract_doc.ticked(row[0])}


def test_the_scan_finds_the_headers_routerd_is_known_to_use() -> None:
    found = code_headers()
    for name in ("X-Routerd-Request-Id", "X-Routerd-Node", "X-Routerd-Lent-To", "X-Routerd-Offload",
                 "X-Routerd-Offload-Helper-Model", "X-Routerd-Key-Class", "X-Routerd-Queue-Position"):
        assert name in found, name


def test_every_header_the_code_sets_or_reads_is_in_the_contract_table() -> None:
    documented = contract_headers()
    missing = {name: sorted(where) for name, where in code_headers().items() if name not in documented}
    assert missing == {}


def test_the_header_table_names_no_header_the_code_does_not_use() -> None:
    assert sorted(contract_headers() - set(code_headers())) == []
