"""Weight-file hashing for ``model_hash`` (contract §3), with a persistent cache.

Hashing multi-gigabyte weights is slow, so it never runs on the reactor
thread: :func:`hash_models` hands the whole batch to an injected
``run_in_thread`` (production: ``lambda f: deferToThread(f)``; tests: a
synchronous ``lambda f: succeed(f())``).

:class:`FileHashCache` remembers ``sha256`` per absolute path together with the
file's size and ``mtime_ns``; an entry is used only while both still match, so
an unchanged file is never read twice and a touched or resized file is
re-hashed.  It persists as JSON (``<store_dir>/hash-cache.json``)::

    {"version": 1, "entries": {"/abs/path": {"size": N, "mtime_ns": N, "sha256": "hex"}}}

Loading tolerates a missing or corrupt file (it starts empty); saving writes a
temporary file in the same directory and moves it into place with ``os.replace``.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeGuard

import attrs
from twisted.internet.defer import Deferred
from twisted.logger import Logger

from routerd.catalog.kcpps import strip_weights_ending, weights_file_name
from routerd.catalog.model import ModelConfig
from routerd.files import read_json_file

CHUNK_SIZE = 1024 * 1024
CACHE_VERSION = 1

RunInThread = Callable[[Callable[[], list[ModelConfig]]], "Deferred[list[ModelConfig]]"]
"""Runs a blocking callable off the reactor thread and fires with its result."""

_log = Logger(namespace="routerd.catalog.hashing")


def sha256_file(path: str) -> str:
    """sha256 hex of a file's content, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK_SIZE):
            digest.update(chunk)
    return digest.hexdigest()


def _is_sha256_hex(value: Any) -> TypeGuard[str]:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def _is_count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@attrs.frozen
class _Entry:
    size: int
    mtime_ns: int
    sha256: str


class FileHashCache:
    """``(absolute path, size, mtime_ns) -> sha256``; thread-safe.

    ``path`` is the JSON file it persists to (``None``: memory only).
    ``hasher`` reads and hashes a file (injectable so tests can count reads).
    """

    def __init__(self, path: str | None = None, hasher: Callable[[str], str] = sha256_file) -> None:
        self._path = os.path.abspath(path) if path is not None else None
        self._hasher = hasher
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._dirty = False
        if self._path is not None:
            self._entries = self._load(self._path)

    @property
    def path(self) -> str | None:
        return self._path

    @property
    def dirty(self) -> bool:
        """True when entries changed since the last load or save."""
        with self._lock:
            return self._dirty

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @staticmethod
    def _load(path: str) -> dict[str, _Entry]:
        read = read_json_file(path, lambda error: _log.warn(
            "ignoring unreadable hash cache {path}: {error}", path=path, error=error))
        if read is None:
            return {}
        (data,) = read
        entries: dict[str, _Entry] = {}
        raw = data.get("entries") if isinstance(data, dict) else None
        if not isinstance(raw, dict) or data.get("version") != CACHE_VERSION:
            _log.warn("ignoring hash cache {path} in an unknown format", path=path)
            return {}
        for key, value in raw.items():
            if not (isinstance(value, dict) and os.path.isabs(key)):
                continue
            size, mtime_ns, sha = value.get("size"), value.get("mtime_ns"), value.get("sha256")
            if _is_count(size) and isinstance(mtime_ns, int) and _is_sha256_hex(sha):
                entries[key] = _Entry(size=size, mtime_ns=mtime_ns, sha256=sha)
        return entries

    def lookup(self, path: str, size: int, mtime_ns: int) -> str | None:
        """The cached sha256 for this exact (path, size, mtime_ns), else None."""
        with self._lock:
            entry = self._entries.get(os.path.abspath(path))
        if entry is not None and entry.size == size and entry.mtime_ns == mtime_ns:
            return entry.sha256
        return None

    def store(self, path: str, size: int, mtime_ns: int, sha256: str) -> None:
        entry = _Entry(size=size, mtime_ns=mtime_ns, sha256=sha256)
        key = os.path.abspath(path)
        with self._lock:
            if self._entries.get(key) != entry:
                self._entries[key] = entry
                self._dirty = True

    def hash_file(self, path: str) -> str:
        """sha256 of ``path``, read only when the cache has no entry for its
        current size and mtime.  Raises ``OSError`` if the file cannot be read
        (or is not a regular file)."""
        abs_path = os.path.abspath(path)
        before = os.stat(abs_path)
        if not stat.S_ISREG(before.st_mode):
            raise IsADirectoryError(abs_path)
        cached = self.lookup(abs_path, before.st_size, before.st_mtime_ns)
        if cached is not None:
            return cached
        digest = self._hasher(abs_path)
        after = os.stat(abs_path)
        if (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns):
            # Only remember a hash of a file that did not change while we read it.
            self.store(abs_path, after.st_size, after.st_mtime_ns, digest)
        return digest

    def prune(self, keep: Iterable[str]) -> None:
        """Forget every entry whose path is not in ``keep``."""
        wanted = {os.path.abspath(p) for p in keep}
        with self._lock:
            for key in [k for k in self._entries if k not in wanted]:
                del self._entries[key]
                self._dirty = True

    def save(self) -> None:
        """Write the cache atomically (temp file + ``os.replace``).  Raises
        ``OSError`` on failure; the previous file is then left intact."""
        if self._path is None:
            return
        with self._lock:
            payload = {
                "version": CACHE_VERSION,
                "entries": {
                    key: {"size": e.size, "mtime_ns": e.mtime_ns, "sha256": e.sha256}
                    for key, e in sorted(self._entries.items())
                },
            }
            self._dirty = False
        directory = os.path.dirname(self._path)
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".hash-cache.", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(payload, handle, separators=(",", ":"))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self._path)
        except BaseException:
            with self._lock:
                self._dirty = True
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def save_if_dirty(self) -> None:
        """:meth:`save` when anything changed since the last save; a failure is logged, not raised."""
        if not self.dirty:
            return
        try:
            self.save()
        except OSError as exc:
            _log.warn("cannot save hash cache {path}: {error}", path=self.path, error=str(exc))


def missing_marker(file: str) -> str:
    """``missing:<stem>`` for a weight file that cannot be hashed."""
    name = weights_file_name(file)
    stem = strip_weights_ending(name)
    return f"missing:{stem if stem != name else os.path.splitext(name)[0]}"


def model_hash(files: Mapping[str, str], cache: FileHashCache) -> str:
    """sha256 hex over the sorted ``field=<sha256 of file>`` lines joined by
    ``"\\n"``; a file that cannot be hashed contributes ``field=missing:<stem>``."""
    lines = []
    for field, file in files.items():
        try:
            value = cache.hash_file(file)
        except OSError:
            value = missing_marker(file)
        lines.append(f"{field}={value}")
    return hashlib.sha256("\n".join(sorted(lines)).encode("utf-8")).hexdigest()


def hash_configs_blocking(configs: Iterable[ModelConfig], cache: FileHashCache) -> list[ModelConfig]:
    """Blocking: every config with ``model_hash`` filled, then the cache saved
    (a save failure is logged, not raised).  Call only off the reactor thread."""
    out = [attrs.evolve(c, model_hash=model_hash(c.weight_files(), cache)) for c in configs]
    cache.save_if_dirty()
    return out


def hash_models(
    configs: Iterable[ModelConfig], cache: FileHashCache, run_in_thread: RunInThread
) -> Deferred[list[ModelConfig]]:
    """Fill ``model_hash`` on every config, hashing off the reactor thread via
    ``run_in_thread``; fires with the configs in the given order."""
    batch = list(configs)
    return run_in_thread(lambda: hash_configs_blocking(batch, cache))


__all__ = [
    "CHUNK_SIZE",
    "FileHashCache",
    "RunInThread",
    "hash_configs_blocking",
    "hash_models",
    "missing_marker",
    "model_hash",
    "sha256_file",
]
