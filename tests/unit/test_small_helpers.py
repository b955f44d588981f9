"""The small ground-floor helpers several modules share: ``count_down`` and ``read_json_file``."""

from __future__ import annotations

from pathlib import Path

from routerd.counts import count_down
from routerd.files import read_json_file


def test_count_down_drops_the_key_at_zero() -> None:
    counts = {"a": 2, "b": 1}
    count_down(counts, "a")
    count_down(counts, "b")
    count_down(counts, "missing")
    assert counts == {"a": 1}


def test_read_json_file_reads_misses_and_reports_unreadable(tmp_path: Path) -> None:
    told: list[str] = []
    good = tmp_path / "good.json"
    good.write_text('{"x": 1}', encoding="utf-8")
    null = tmp_path / "null.json"
    null.write_text("null", encoding="utf-8")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    assert read_json_file(str(good), told.append) == ({"x": 1},)
    assert read_json_file(str(null), told.append) == (None,)
    assert read_json_file(str(tmp_path / "absent.json"), told.append) is None
    assert told == []
    assert read_json_file(str(bad), told.append) is None
    assert len(told) == 1
