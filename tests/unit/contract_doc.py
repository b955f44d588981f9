"""Reading ``docs/contract.md`` for the tests that keep it whole: its numbered sections, the
bullets of a section, and the rows of a Markdown table, each cell's backticked names.

The names the tests look for come from the code's own tables (the config loader's key lists, the
route declarations, the migrations, the header constants, the enumerations); this module only
finds where in the contract they must stand.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

CONTRACT = Path(__file__).resolve().parents[2] / "docs" / "contract.md"

_TICKED = re.compile(r"`([^`]+)`")


@cache
def text() -> str:
    return CONTRACT.read_text(encoding="utf-8")


def section(number: int) -> str:
    """The text of ``## <number>. …`` up to the next ``## `` heading."""
    body = text()
    start = body.index(f"\n## {number}. ")
    end = body.find("\n## ", start + 1)
    return body[start:] if end < 0 else body[start:end]


def bullets(block: str) -> list[str]:
    """The top-level bullets of ``block`` (a line starting ``- `` and the lines continuing it)."""
    out: list[str] = []
    open_bullet = False
    for line in block.splitlines():
        if line.startswith("- "):
            out.append(line)
            open_bullet = True
        elif open_bullet and line.startswith("  ") and line.strip():
            out[-1] += "\n" + line
        else:
            open_bullet = False
    return out


def ticked(fragment: str) -> set[str]:
    """The backticked names of ``fragment``."""
    return set(_TICKED.findall(fragment))


def table_after(block: str, caption: str) -> list[list[str]]:
    """The body rows (cells stripped) of the first Markdown table whose head row holds ``caption``."""
    rest = block[block.rfind("\n", 0, block.index(caption)) + 1:]
    rows: list[list[str]] = []
    started = False
    for line in rest.splitlines():
        if line.startswith("|"):
            started = True
            guarded = _TICKED.sub(lambda m: m.group(0).replace("|", "\0"), line.strip().strip("|"))
            cells = [cell.strip().replace("\0", "|") for cell in guarded.split("|")]  # a `a|b` is one cell
            if all(set(cell) <= set("-: ") for cell in cells):
                continue  # the separator row
            rows.append(cells)
        elif started:
            break
    return rows[1:]  # without the head row
