"""Asset safety units (issue 15): single-range parsing, file-root confinement (property-tested with
generated paths), safe file names, lookup-body validation and the index's change detection."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from routerd.assets.index import AssetIndex, LookupError400, build_index_blocking, parse_hashes
from routerd.assets.paths import UnsafePath, is_within, resolve_in_roots, safe_filename, walk_files
from routerd.assets.ranges import ByteRange, RangeNotSatisfiable, parse_content_range, parse_range
from routerd.catalog.hashing import FileHashCache


@pytest.mark.parametrize("header, expected", [
    (None, None),
    ("bytes=0-9", ByteRange(0, 9)),
    ("bytes=90-", ByteRange(90, 99)),
    ("bytes=-10", ByteRange(90, 99)),
    ("bytes=95-200", ByteRange(95, 99)),  # an end past the file is clipped
    ("bytes=-500", ByteRange(0, 99)),
])
def test_one_range_is_parsed_and_clipped_to_the_file(header: str | None, expected: ByteRange | None) -> None:
    assert parse_range(header, 100) == expected


@pytest.mark.parametrize("header", ["bytes=0-1,4-5", "bytes=100-", "bytes=5-2", "bytes=-", "items=0-1",
                                    "bytes=a-b", "bytes=-0", "0-1"])
def test_multi_malformed_or_outside_ranges_are_not_satisfiable(header: str) -> None:
    with pytest.raises(RangeNotSatisfiable):
        parse_range(header, 100)


def test_a_position_of_thousands_of_digits_is_not_satisfiable_not_a_500() -> None:
    """Issue 20: int() of a 5,000-digit position raised ValueError (a 500)."""
    for header in ("bytes=" + "9" * 5000 + "-", "bytes=0-" + "9" * 5000, "bytes=-" + "9" * 20):
        with pytest.raises(RangeNotSatisfiable):
            parse_range(header, 100)


def test_content_range_round_trips() -> None:
    assert parse_content_range(ByteRange(10, 19).content_range(100)) == (10, 19, 100)
    assert parse_content_range("bytes */100") is None


@pytest.mark.parametrize("name", ["", ".", "..", ".hidden", "a/b", "a\\b", "x\x00y", "n" * 256])
def test_unsafe_file_names_are_refused(name: str) -> None:
    with pytest.raises(UnsafePath):
        safe_filename(name)


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a.gguf").write_bytes(b"a")
    (root / "b.gguf").write_bytes(b"b")
    outside = tmp_path / "secret"
    outside.mkdir()
    (outside / "key").write_bytes(b"s")
    os.symlink(outside, root / "link-dir")
    os.symlink(outside / "key", root / "link-file")
    os.symlink(root / "b.gguf", root / "sub" / "inside-link")
    return root, outside


def test_resolution_stays_inside_the_roots(tmp_path: Path) -> None:
    root, outside = _tree(tmp_path)
    assert resolve_in_roots("sub/a.gguf", [str(root)]) == str((root / "sub" / "a.gguf").resolve())
    assert resolve_in_roots("sub/inside-link", [str(root)]) == str((root / "b.gguf").resolve())
    for bad in ("../secret/key", "link-dir/key", "link-file", str(outside / "key"), "/etc/passwd",
                "sub/../../secret/key", "C:\\x", "", "nope.gguf", "sub"):
        with pytest.raises(UnsafePath):
            resolve_in_roots(bad, [str(root)])
    listed = walk_files(str(root))
    assert all(is_within(p, str(root)) for p in listed)
    assert str((outside / "key").resolve()) not in listed


_SEGMENTS = st.sampled_from(["..", ".", "", "sub", "a.gguf", "b.gguf", "link-dir", "link-file", "key",
                             "secret", "root", "inside-link", "/", "\\", "%2e%2e", "..."])


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(parts=st.lists(_SEGMENTS, min_size=1, max_size=6), absolute=st.booleans())
def test_no_generated_path_ever_resolves_outside_its_root(tmp_path: Path, parts: list[str],
                                                          absolute: bool) -> None:
    root = tmp_path / "root"
    if not root.exists():
        _tree(tmp_path)
    candidate = ("/" if absolute else "") + "/".join(parts)
    try:
        real = resolve_in_roots(candidate, [str(root)])
    except UnsafePath:
        return
    assert is_within(real, str(root))
    assert os.path.isfile(real)
    assert not absolute and ".." not in candidate.split("/")


def test_lookup_bodies_are_validated_and_deduplicated() -> None:
    h = "a" * 64
    assert parse_hashes({"hashes": [h, h]}) == [h]
    for body in ({}, {"hashes": "x"}, {"hashes": ["A" * 64]}, {"hashes": ["a" * 63]},
                 {"hashes": [h] * 257}, {"hashes": [1]}):
        with pytest.raises(LookupError400):
            parse_hashes(body)


def test_the_index_serves_a_file_only_while_it_is_unchanged(tmp_path: Path) -> None:
    root, _ = _tree(tmp_path)
    reads: list[str] = []

    def hasher(path: str) -> str:
        reads.append(path)
        import hashlib
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()

    cache = FileHashCache(str(tmp_path / "cache.json"), hasher=hasher)
    assets = build_index_blocking([], [str(root)], "", cache)
    index = AssetIndex(assets)
    assert {a.filename for a in assets} == {"a.gguf", "b.gguf"}  # nothing outside the root
    import hashlib
    sha = hashlib.sha256(b"a").hexdigest()
    assert index.get(sha) is not None
    before = len(reads)
    build_index_blocking([], [str(root)], "", cache)
    assert len(reads) == before  # the hash cache spares unchanged files
    (root / "sub" / "a.gguf").write_bytes(b"changed!")
    assert index.get(sha) is None
