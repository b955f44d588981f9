"""HTTP header names lower-cased once: one bounded table shared by the HTTP edge's answers
(:mod:`routerd.api.lean_reply`) and the lean backend client's (:mod:`routerd.clients.backend_headers`).

Clients, backends and routerd itself send the same dozen names on every request and answer;
looking a name up here costs no call where ``name.lower()`` costs one a header, and a name read
back (an answer's ``Content-Type``) one more (``benchmarks/trees.py --profile``).  A speed trick of
the edge and the transport, fenced here.  Bounded: past :data:`KEPT` names a name is lowered each
time, so names a peer invents cannot grow it.
"""

from __future__ import annotations

__all__ = ["KEPT", "LOWER", "LOWERED", "lowered"]

#: Names as spelled -> lower-cased.  Read it as ``LOWERED[name] if name in LOWERED else
#: lowered(name)`` on a hot path (a subscript, no call).
LOWERED: dict[bytes, bytes] = {}
#: The names of :data:`LOWERED` that are lower-case already (their own lower case): one
#: membership test tells a name needs no lowering and compares as it is spelled.
LOWER: set[bytes] = set()
KEPT = 512


def lowered(name: bytes) -> bytes:
    """``name`` lower-cased, kept in :data:`LOWERED` while it has room."""
    lower = name.lower()
    if len(LOWERED) < KEPT:
        LOWERED[name] = lower
        if lower == name:
            LOWER.add(name)
    return lower
