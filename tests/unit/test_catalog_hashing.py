"""routerd.catalog.hashing: file hashes, the persistent cache, model_hash, hash_models."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import attrs
import pytest
from twisted.internet.defer import Deferred, succeed

from routerd.catalog import hashing
from routerd.catalog.hashing import (
    CHUNK_SIZE,
    FileHashCache,
    hash_models,
    missing_marker,
    model_hash,
    sha256_file,
)
from routerd.catalog.model import Capabilities, ModelConfig

T = TypeVar("T")


def sync_thread(f: Callable[[], T]) -> Deferred[T]:
    return succeed(f())


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class CountingHasher:
    """A hasher that records every file it actually reads."""

    def __init__(self) -> None:
        self.reads: list[str] = []

    def __call__(self, path: str) -> str:
        self.reads.append(path)
        return sha256_file(path)


def make_file(path: Path, data: bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return str(path)


def bump_mtime(path: str) -> None:
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def config(local_id: str, **weights: str) -> ModelConfig:
    return ModelConfig(
        local_id=local_id,
        filename=f"{local_id}.kcpps",
        path=f"/cfg/{local_id}.kcpps",
        backend_mode="llama_sdcpp",
        capabilities=Capabilities(llm="text_model" in weights),
        config_hash="0" * 64,
        **weights,  # type: ignore[arg-type]
    )


# -- sha256_file ----------------------------------------------------------------


def test_sha256_file_matches_hashlib_across_chunk_boundaries(tmp_path: Path) -> None:
    data = os.urandom(1024) * (CHUNK_SIZE // 1024) + b"tail"
    assert sha256_file(make_file(tmp_path / "big.bin", data)) == sha(data)
    assert sha256_file(make_file(tmp_path / "empty.bin", b"")) == sha(b"")


def test_sha256_file_reads_in_one_mib_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sizes: list[int] = []
    real_open = open

    class Spy:
        def __init__(self, handle: object) -> None:
            self._h = handle

        def __enter__(self) -> Spy:
            return self

        def __exit__(self, *exc: object) -> None:
            self._h.close()  # type: ignore[attr-defined]

        def read(self, n: int) -> bytes:
            sizes.append(n)
            return self._h.read(n)  # type: ignore[attr-defined, no-any-return]

    monkeypatch.setattr(hashing, "open", lambda p, m: Spy(real_open(p, m)), raising=False)
    sha256_file(make_file(tmp_path / "f.bin", b"x" * (CHUNK_SIZE + 1)))
    assert sizes and set(sizes) == {CHUNK_SIZE}
    assert CHUNK_SIZE == 1024 * 1024


# -- model_hash -----------------------------------------------------------------


def test_model_hash_is_sha256_over_sorted_field_lines(tmp_path: Path) -> None:
    text = make_file(tmp_path / "t.gguf", b"text weights")
    proj = make_file(tmp_path / "p.gguf", b"projector")
    expected = sha(f"mmproj={sha(b'projector')}\nmodel={sha(b'text weights')}".encode())
    cache = FileHashCache()
    assert model_hash({"model": text, "mmproj": proj}, cache) == expected
    assert model_hash({"mmproj": proj, "model": text}, cache) == expected


def test_model_hash_is_stable_across_caches_and_directories(tmp_path: Path) -> None:
    a = make_file(tmp_path / "a" / "t.gguf", b"same")
    b = make_file(tmp_path / "b" / "renamed.gguf", b"same")
    assert model_hash({"model": a}, FileHashCache()) == model_hash({"model": b}, FileHashCache())


def test_model_hash_changes_with_content_and_with_field(tmp_path: Path) -> None:
    a = make_file(tmp_path / "a.gguf", b"one")
    b = make_file(tmp_path / "b.gguf", b"two")
    cache = FileHashCache()
    assert model_hash({"model": a}, cache) != model_hash({"model": b}, cache)
    assert model_hash({"model": a}, cache) != model_hash({"sdmodel": a}, cache)


def test_model_hash_missing_file_contributes_missing_stem(tmp_path: Path) -> None:
    text = make_file(tmp_path / "t.gguf", b"t")
    absent = str(tmp_path / "gone" / "dream.sim.json")
    expected = sha(f"model={sha(b't')}\nsdmodel=missing:dream".encode())
    assert model_hash({"sdmodel": absent, "model": text}, FileHashCache()) == expected


def test_model_hash_of_a_directory_counts_as_missing(tmp_path: Path) -> None:
    (tmp_path / "dir.gguf").mkdir()
    assert model_hash({"model": str(tmp_path / "dir.gguf")}, FileHashCache()) == sha(b"model=missing:dir")


@pytest.mark.parametrize(
    ("file", "marker"),
    [
        ("/w/x.gguf", "missing:x"),
        ("/w/x.sim.json", "missing:x"),
        ("/w/ggml-base.en.bin", "missing:ggml-base.en"),
        ("/w/noext", "missing:noext"),
    ],
)
def test_missing_marker_uses_the_file_stem(file: str, marker: str) -> None:
    assert missing_marker(file) == marker


# -- cache ----------------------------------------------------------------------


def test_cache_hit_does_not_reread_an_unchanged_file(tmp_path: Path) -> None:
    f = make_file(tmp_path / "t.gguf", b"abc")
    hasher = CountingHasher()
    cache = FileHashCache(hasher=hasher)
    assert cache.hash_file(f) == sha(b"abc")
    assert cache.hash_file(f) == sha(b"abc")
    model_hash({"model": f}, cache)
    assert hasher.reads == [f]


def test_changed_mtime_rehashes(tmp_path: Path) -> None:
    f = make_file(tmp_path / "t.gguf", b"abc")
    hasher = CountingHasher()
    cache = FileHashCache(hasher=hasher)
    cache.hash_file(f)
    st = os.stat(f)
    Path(f).write_bytes(b"xyz")  # same size, new content
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    assert cache.hash_file(f) == sha(b"xyz")
    assert hasher.reads == [f, f]


def test_changed_size_rehashes_even_with_the_same_mtime(tmp_path: Path) -> None:
    f = make_file(tmp_path / "t.gguf", b"abc")
    hasher = CountingHasher()
    cache = FileHashCache(hasher=hasher)
    cache.hash_file(f)
    st = os.stat(f)
    Path(f).write_bytes(b"abcd")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert cache.hash_file(f) == sha(b"abcd")
    assert len(hasher.reads) == 2


def test_stale_cache_entry_with_matching_stat_is_trusted(tmp_path: Path) -> None:
    """The cache keys on (path, size, mtime_ns): that is its contract, proven here."""
    f = make_file(tmp_path / "t.gguf", b"abc")
    st = os.stat(f)
    cache = FileHashCache(hasher=CountingHasher())
    cache.store(f, st.st_size, st.st_mtime_ns, "f" * 64)
    assert cache.hash_file(f) == "f" * 64


def test_cache_persists_and_a_new_instance_does_not_reread(tmp_path: Path) -> None:
    f = make_file(tmp_path / "w" / "t.gguf", b"abc")
    store = tmp_path / "store" / "hash-cache.json"
    first = FileHashCache(str(store))
    first.hash_file(f)
    assert first.dirty
    first.save()
    assert not first.dirty
    data = json.loads(store.read_text())
    assert data["version"] == 1
    assert data["entries"][f]["sha256"] == sha(b"abc")

    hasher = CountingHasher()
    second = FileHashCache(str(store), hasher=hasher)
    assert len(second) == 1
    assert second.hash_file(f) == sha(b"abc")
    assert hasher.reads == []


def test_save_is_atomic_and_leaves_no_temp_files(tmp_path: Path) -> None:
    store = tmp_path / "hash-cache.json"
    store.write_text("old")
    cache = FileHashCache(str(store))
    cache.store(str(tmp_path / "x"), 1, 2, "a" * 64)
    cache.save()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hash-cache.json"]
    assert json.loads(store.read_text())["entries"][str(tmp_path / "x")]["size"] == 1


def test_failed_save_keeps_the_previous_file_and_stays_dirty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "hash-cache.json"
    store.write_text("previous")
    cache = FileHashCache(str(store))
    cache.store(str(tmp_path / "x"), 1, 2, "a" * 64)

    def broken_replace(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        cache.save()
    assert store.read_text() == "previous"
    assert cache.dirty
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hash-cache.json"]


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "[]",
        '{"version": 99, "entries": {}}',
        '{"version": 1, "entries": []}',
        "",
        "\x00\x01",
    ],
)
def test_corrupt_cache_file_is_ignored(tmp_path: Path, content: str) -> None:
    store = tmp_path / "hash-cache.json"
    store.write_text(content)
    cache = FileHashCache(str(store))
    assert len(cache) == 0
    f = make_file(tmp_path / "t.gguf", b"abc")
    assert cache.hash_file(f) == sha(b"abc")
    cache.save()
    assert json.loads(store.read_text())["entries"][f]["sha256"] == sha(b"abc")


def test_malformed_cache_entries_are_dropped_and_good_ones_kept(tmp_path: Path) -> None:
    store = tmp_path / "hash-cache.json"
    good = {"size": 3, "mtime_ns": 5, "sha256": "b" * 64}
    store.write_text(
        json.dumps(
            {
                "version": 1,
                "entries": {
                    "/ok": good,
                    "relative": good,
                    "/bad-sha": {**good, "sha256": "XYZ"},
                    "/bad-size": {**good, "size": -1},
                    "/bool-size": {**good, "size": True},
                    "/not-obj": 3,
                },
            }
        )
    )
    cache = FileHashCache(str(store))
    assert len(cache) == 1
    assert cache.lookup("/ok", 3, 5) == "b" * 64
    assert cache.lookup("/ok", 3, 6) is None


def test_missing_cache_file_starts_empty(tmp_path: Path) -> None:
    assert len(FileHashCache(str(tmp_path / "nope" / "hash-cache.json"))) == 0


def test_prune_forgets_files_no_longer_referenced(tmp_path: Path) -> None:
    cache = FileHashCache()
    cache.store("/keep", 1, 1, "a" * 64)
    cache.store("/drop", 1, 1, "b" * 64)
    cache.prune(["/keep"])
    assert len(cache) == 1 and cache.lookup("/keep", 1, 1) == "a" * 64


# -- hash_models ------------------------------------------------------------------


def test_hash_models_fills_model_hash_through_run_in_thread(tmp_path: Path) -> None:
    text = make_file(tmp_path / "t.gguf", b"t")
    img = make_file(tmp_path / "i.safetensors", b"i")
    configs = [config("chat", text_model=text), config("sketch", sd_model=img)]
    calls: list[Callable[[], list[ModelConfig]]] = []

    def run_in_thread(f: Callable[[], list[ModelConfig]]) -> Deferred[list[ModelConfig]]:
        calls.append(f)
        return succeed(f())

    results: list[list[ModelConfig]] = []
    hash_models(configs, FileHashCache(), run_in_thread).addCallback(results.append)
    assert len(calls) == 1
    [hashed] = results
    assert [c.local_id for c in hashed] == ["chat", "sketch"]
    assert hashed[0].model_hash == sha(f"model={sha(b't')}".encode())
    assert hashed[1].model_hash == sha(f"sdmodel={sha(b'i')}".encode())
    assert [attrs.evolve(c, model_hash="") for c in hashed] == configs


def test_hash_models_does_no_work_before_run_in_thread_runs(tmp_path: Path) -> None:
    text = make_file(tmp_path / "t.gguf", b"t")
    hasher = CountingHasher()
    pending: list[Callable[[], list[ModelConfig]]] = []

    def deferred_thread(f: Callable[[], list[ModelConfig]]) -> Deferred[list[ModelConfig]]:
        pending.append(f)
        return Deferred()

    hash_models([config("chat", text_model=text)], FileHashCache(hasher=hasher), deferred_thread)
    assert hasher.reads == []
    pending[0]()
    assert hasher.reads == [text]


def test_hash_models_saves_the_cache_and_a_second_pass_reads_nothing(tmp_path: Path) -> None:
    text = make_file(tmp_path / "t.gguf", b"t")
    store = tmp_path / "store" / "hash-cache.json"
    hash_models([config("chat", text_model=text)], FileHashCache(str(store)), sync_thread)
    assert store.exists()
    hasher = CountingHasher()
    out: list[list[ModelConfig]] = []
    hash_models(
        [config("chat", text_model=text)], FileHashCache(str(store), hasher=hasher), sync_thread
    ).addCallback(out.append)
    assert hasher.reads == []
    assert out[0][0].model_hash == sha(f"model={sha(b't')}".encode())


def test_hash_models_survives_an_unwritable_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = make_file(tmp_path / "t.gguf", b"t")

    def broken_replace(src: str, dst: str) -> None:
        raise OSError("read-only")

    monkeypatch.setattr(os, "replace", broken_replace)
    out: list[list[ModelConfig]] = []
    failures: list[object] = []
    d = hash_models([config("chat", text_model=text)], FileHashCache(str(tmp_path / "c.json")), sync_thread)
    d.addCallbacks(out.append, failures.append)
    assert failures == [] and out[0][0].model_hash


def test_hash_models_marks_missing_weights(tmp_path: Path) -> None:
    out: list[list[ModelConfig]] = []
    hash_models(
        [config("gone", whisper_model="/nowhere/base.bin")], FileHashCache(), sync_thread
    ).addCallback(out.append)
    assert out[0][0].model_hash == sha(b"whispermodel=missing:base")


def test_touching_a_file_rereads_it_even_with_unchanged_content(tmp_path: Path) -> None:
    f = make_file(tmp_path / "t.gguf", b"abc")
    hasher = CountingHasher()
    cache = FileHashCache(hasher=hasher)
    cache.hash_file(f)
    bump_mtime(f)
    assert cache.hash_file(f) == sha(b"abc")
    cache.hash_file(f)
    assert hasher.reads == [f, f]
