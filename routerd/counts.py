"""Counts kept in a plain dict, a key present only while its count is above zero (requests queued
per model, reservations per replica, waiting requests per class and key)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import TypeVar

__all__ = ["count_down"]

K = TypeVar("K", bound=Hashable)


def count_down(counts: dict[K, int], key: K) -> None:
    """One less of ``key``; the key leaves ``counts`` when none is left."""
    left = counts.get(key, 0) - 1
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)
