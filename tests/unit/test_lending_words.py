"""The Lending page shows each decision-log value in words (issue 32 item 6): every kind, outcome,
reason, trigger and service source the decision log accepts has words in the page's table
(``webui/js/lending-words.json``), read from the code's own tables, so a value added to the code
without words fails here; and the table names no value the code cannot write."""

from __future__ import annotations

import json
from pathlib import Path
from typing import get_args

import pytest

from routerd.lending.decisions import KINDS, OUTCOMES_BY_KIND, REASONS_BY_KIND, TRIGGERS_BY_KIND
from routerd.wire.lending import ServiceSource

WORDS_FILE = Path(__file__).resolve().parents[2] / "webui" / "js" / "lending-words.json"


def _every(table: dict[str, frozenset[str]]) -> set[str]:
    return {value for values in table.values() for value in values if value}


#: (the words table's section, every value the code can write there).
SECTIONS: list[tuple[str, set[str]]] = [
    ("kinds", set(KINDS)),
    ("outcomes", _every(dict(OUTCOMES_BY_KIND))),
    ("reasons", _every(dict(REASONS_BY_KIND))),
    ("triggers", _every(dict(TRIGGERS_BY_KIND))),
    ("service_sources", set(get_args(ServiceSource))),
]


def _words() -> dict[str, dict[str, str]]:
    loaded = json.loads(WORDS_FILE.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def test_the_words_table_has_exactly_the_sections_the_page_reads() -> None:
    assert sorted(_words()) == sorted(name for name, _ in SECTIONS)


@pytest.mark.parametrize(("section", "values"), SECTIONS, ids=[name for name, _ in SECTIONS])
def test_every_value_the_decision_log_can_write_has_words(section: str, values: set[str]) -> None:
    words = _words()[section]
    missing = sorted(v for v in values if not str(words.get(v, "")).strip())
    assert missing == [], f"{section} without words in {WORDS_FILE.name}: {missing}"


@pytest.mark.parametrize(("section", "values"), SECTIONS, ids=[name for name, _ in SECTIONS])
def test_the_words_table_names_no_value_the_code_cannot_write(section: str, values: set[str]) -> None:
    stale = sorted(set(_words()[section]) - values)
    assert stale == [], f"{section} in {WORDS_FILE.name} the code never writes: {stale}"


def test_no_two_outcomes_or_reasons_read_the_same() -> None:
    """Words stand for the code on the page: two values with the same words could not be told apart."""
    for section in ("outcomes", "reasons", "triggers"):
        texts = list(_words()[section].values())
        assert len(texts) == len(set(texts)), section
