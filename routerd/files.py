"""Small files a node keeps beside its database (split recipes, asset origins, the hash cache):
written whole or not at all, readable only by the node's user, and read back as JSON."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from typing import Any


def write_json_atomically(path: str, payload: Any, *, mode: int = 0o600) -> None:
    """Write ``payload`` as JSON to ``path``: a temporary file in the same folder (``mode``),
    flushed and fsynced, then renamed over ``path``; on any failure the old file stays as it was."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(payload, handle, indent=1, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


__all__ = ["write_json_atomically"]


def read_json_file(path: str, on_unreadable: Callable[[str], None]) -> tuple[Any] | None:
    """``(decoded JSON,)`` of the file at ``path``; None when there is no such file, or when it
    cannot be read or decoded (then ``on_unreadable`` is told why, to log it)."""
    try:
        with open(path, encoding="utf-8") as handle:
            return (json.load(handle),)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        on_unreadable(str(exc))
        return None
