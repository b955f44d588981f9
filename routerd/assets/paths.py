"""Path safety for asset operations: nothing outside the configured roots is ever exposed.

A client or a remote node never names a path directly: files are served by hash from the index, and
a management operation that takes a path takes it *relative to a root*.  :func:`resolve_in_roots`
refuses absolute paths, ``..`` components, NUL bytes and anything whose real path (symlinks
followed) leaves the root; :func:`safe_filename` accepts a bare file name only.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

MAX_NAME = 255


class UnsafePath(ValueError):
    """A path or file name that could escape its root; the message says why."""


def is_within(path: str, root: str) -> bool:
    """True when the real path of ``path`` is ``root``'s real path or below it."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    try:
        return os.path.commonpath([real_root, real]) == real_root
    except ValueError:  # different drives, or a mix of absolute and relative
        return False


def safe_filename(name: str) -> str:
    """``name`` when it is a bare, visible file name; :class:`UnsafePath` otherwise."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME:
        raise UnsafePath("a file name must be 1 to 255 characters")
    if "\x00" in name or "/" in name or "\\" in name:
        raise UnsafePath(f"{name!r} is not a bare file name")
    if name in (".", "..") or name.startswith("."):
        raise UnsafePath(f"{name!r} is not a visible file name")
    return name


def resolve_in_roots(relative: str, roots: Iterable[str]) -> str:
    """The real path of ``relative`` under the first root holding it as a regular file.

    Raises :class:`UnsafePath` for an absolute path, a ``..`` component, a NUL byte, a path that
    resolves (through symlinks) outside its root, or when no root holds such a file.
    """
    if not isinstance(relative, str) or not relative:
        raise UnsafePath("a path is required")
    if "\x00" in relative:
        raise UnsafePath("a path cannot contain NUL")
    drive = len(relative) > 1 and relative[1] == ":"
    if os.path.isabs(relative) or relative.startswith(("/", "\\")) or drive:
        raise UnsafePath("absolute paths are refused; give a path relative to a file root")
    parts = relative.replace("\\", "/").split("/")
    if any(p == ".." for p in parts):
        raise UnsafePath("'..' is refused in a path")
    for root in roots:
        candidate = os.path.join(root, *[p for p in parts if p not in ("", ".")])
        if not is_within(candidate, root):
            continue
        real = os.path.realpath(candidate)
        if os.path.isfile(real):
            return real
    raise UnsafePath(f"{relative!r} is not a file under the configured file roots")


def walk_files(root: str) -> list[str]:
    """Every regular file under ``root`` whose real path stays inside it (symlinks that leave
    the root are skipped; directory symlinks are not followed)."""
    out: list[str] = []
    if not os.path.isdir(root):
        return out
    for directory, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if name.startswith("."):
                continue
            path = os.path.join(directory, name)
            if is_within(path, root) and os.path.isfile(path):
                out.append(os.path.realpath(path))
    return sorted(out)


def shared_path(shared_dir: str, sha256: str, filename: str) -> str:
    """``<shared_dir>/sha256/<h[0:2]>/<h>/<filename>`` (reference §8.2)."""
    return os.path.join(shared_dir, "sha256", sha256[:2], sha256, safe_filename(filename))


def partial_path(shared_dir: str, sha256: str) -> str:
    return os.path.join(shared_dir, "sha256", sha256[:2], sha256, ".partial")
