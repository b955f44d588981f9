"""A node's asset records (cluster reference §8.1, §8.6): bound Hugging Face origins and confirmed
substitutions, kept in ``<store_dir>/model-assets.json`` (mode 0600, replaced atomically).

* An **origin** (``bind``) says where a hash can be fetched from outside the cluster:
  ``hf://owner/repo@commit/path``, recorded only after the Hub confirmed the path at that commit has
  that LFS sha256.
* A **substitution** (``substitute``) says that a portable field asking for ``expected_sha256`` may be
  bound to the file with ``sha256`` instead (an operator-confirmed replacement, e.g. a re-quantised
  file); the resolver then looks for the replacement.
"""

from __future__ import annotations

import threading
from typing import Any

import attrs
from twisted.logger import Logger

from routerd.assets.index import is_sha256
from routerd.files import read_json_file, write_json_atomically

BOOK_FILE = "model-assets.json"
_log = Logger(namespace="routerd.assets.book")


@attrs.frozen
class Substitution:
    expected_sha256: str
    sha256: str
    recorded_ms: int
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


class AssetBook:
    """Origins and substitutions; every change is written before it is visible."""

    def __init__(self, path: str | None) -> None:
        self.path = path  # None: in memory only (tests)
        self._lock = threading.Lock()
        self.origins: dict[str, str] = {}
        self.substitutions: dict[str, Substitution] = {}

    def load(self) -> None:
        if self.path is None:
            return
        path = self.path
        read = read_json_file(path, lambda error: _log.warn(
            "ignoring unreadable asset book {path}: {error}", path=path, error=error))
        if read is None:
            return
        (data,) = read
        origins = data.get("hf_origins") if isinstance(data, dict) else None
        for sha, hf in (origins.items() if isinstance(origins, dict) else ()):
            if is_sha256(sha) and isinstance(hf, str):
                self.origins[sha] = hf
        subs = data.get("substitutions") if isinstance(data, dict) else None
        for item in subs if isinstance(subs, list) else []:
            if (isinstance(item, dict) and is_sha256(item.get("expected_sha256"))
                    and is_sha256(item.get("sha256"))):
                self.substitutions[item["expected_sha256"]] = Substitution(
                    item["expected_sha256"], item["sha256"], int(item.get("recorded_ms") or 0),
                    str(item.get("note") or ""))

    def origin(self, sha256: str) -> str | None:
        return self.origins.get(sha256)

    def substitute_for(self, sha256: str) -> str | None:
        sub = self.substitutions.get(sha256)
        return sub.sha256 if sub is not None else None

    def bind(self, sha256: str, hf: str) -> None:
        with self._lock:
            origins = {**self.origins, sha256: hf}
            self._save(origins, self.substitutions)
            self.origins = origins

    def substitute(self, sub: Substitution) -> None:
        with self._lock:
            subs = {**self.substitutions, sub.expected_sha256: sub}
            self._save(self.origins, subs)
            self.substitutions = subs

    def _save(self, origins: dict[str, str], subs: dict[str, Substitution]) -> None:
        if self.path is None:
            return
        payload = {"version": 1, "hf_origins": origins,
                   "substitutions": [s.to_json() for s in sorted(subs.values(),
                                                                 key=lambda s: s.expected_sha256)]}
        write_json_atomically(self.path, payload)
