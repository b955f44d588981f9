"""The node's asset index: ``sha256 -> file`` for every weight file it may hand to a peer.

Built off the reactor thread (:func:`build_index_blocking` through an injected ``run_in_thread``)
from the catalog's weight files, every file under ``models.file_roots`` and the peer-pulled files
under ``models.shared_dir``, hashed through the catalog's :class:`FileHashCache` so an unchanged
file is never read twice.  A file is served only while its size and mtime still match the indexed
ones, and only ever by hash: no client-supplied path reaches the file system.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable
from typing import Any, TypeGuard

import attrs

from routerd.assets.paths import is_within, walk_files
from routerd.catalog.hashing import FileHashCache

MAX_LOOKUP_HASHES = 256
_HEX = re.compile(r"^[0-9a-f]{64}$")


class LookupError400(ValueError):
    """A lookup body that does not follow reference §8.3."""


@attrs.frozen
class Asset:
    sha256: str
    path: str
    filename: str
    size: int
    mtime_ns: int
    source: str  # catalog | file_root | shared | peer_sha256

    def to_json(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "filename": self.filename, "size": self.size}


def is_sha256(value: Any) -> TypeGuard[str]:
    return isinstance(value, str) and _HEX.fullmatch(value) is not None


def parse_hashes(body: Any) -> list[str]:
    """The ``hashes`` of a lookup body: ≤256, each 64 lowercase hex, duplicates dropped."""
    hashes = body.get("hashes") if isinstance(body, dict) else None
    if not isinstance(hashes, list):
        raise LookupError400("hashes must be a list of sha256 hex strings")
    if len(hashes) > MAX_LOOKUP_HASHES:
        raise LookupError400(f"at most {MAX_LOOKUP_HASHES} hashes per lookup")
    out: list[str] = []
    for value in hashes:
        if not is_sha256(value):
            raise LookupError400(f"{str(value)[:80]!r} is not a lowercase sha256 hex string")
        if value not in out:
            out.append(value)
    return out


def _entry(path: str, source: str, cache: FileHashCache) -> Asset | None:
    try:
        before = os.stat(path)
        sha = cache.hash_file(path)
    except OSError:
        return None
    return Asset(sha256=sha, path=os.path.realpath(path), filename=os.path.basename(path),
                 size=before.st_size, mtime_ns=before.st_mtime_ns, source=source)


def build_index_blocking(weight_files: Iterable[str], file_roots: Iterable[str], shared_dir: str,
                         cache: FileHashCache) -> list[Asset]:
    """Blocking: hash (through the cache) every candidate file; call off the reactor thread."""
    out: list[Asset] = []
    seen: set[str] = set()

    def add(path: str, source: str) -> None:
        real = os.path.realpath(path)
        if real in seen or not os.path.isfile(real):
            return
        seen.add(real)
        entry = _entry(real, source, cache)
        if entry is not None:
            out.append(entry)

    for path in weight_files:
        add(path, "catalog")
    for root in file_roots:
        for path in walk_files(root):
            add(path, "file_root")
    store = os.path.join(shared_dir, "sha256") if shared_dir else ""
    if store and os.path.isdir(store):
        for path in walk_files(store):
            if is_within(path, store):
                add(path, "shared")
    cache.save_if_dirty()
    return out


class AssetIndex:
    """Thread-safe ``sha256 -> Asset``; the first file indexed for a hash answers."""

    def __init__(self, assets: Iterable[Asset] = ()) -> None:
        self._lock = threading.Lock()
        self._by_hash: dict[str, Asset] = {}
        self.replace(assets)

    def replace(self, assets: Iterable[Asset]) -> None:
        table: dict[str, Asset] = {}
        for asset in assets:
            table.setdefault(asset.sha256, asset)
        with self._lock:
            self._by_hash = table

    def add(self, asset: Asset) -> None:
        with self._lock:
            self._by_hash[asset.sha256] = asset

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_hash)

    def get(self, sha256: str) -> Asset | None:
        """The asset while its file is unchanged since it was hashed, else None."""
        with self._lock:
            asset = self._by_hash.get(sha256)
        if asset is None:
            return None
        try:
            st = os.stat(asset.path)
        except OSError:
            return None
        if (st.st_size, st.st_mtime_ns) != (asset.size, asset.mtime_ns):
            return None
        return asset

    def all(self) -> list[Asset]:
        with self._lock:
            return list(self._by_hash.values())

    def lookup(self, hashes: Iterable[str]) -> list[Asset]:
        return [a for a in (self.get(h) for h in hashes) if a is not None]
