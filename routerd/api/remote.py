"""A site route that asks another node: that node's error answered as it gave it, or 502 when it
did not answer (one rule for every route that forwards through the master)."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from routerd.clients.node_client import ClusterError, RemoteError
from routerd.errors import HTTPError


async def remote_answer(work: Awaitable[Any]) -> Any:
    """Await a call that talks to other nodes; their errors answered as given, or 502."""
    try:
        return await work
    except RemoteError as exc:
        raise HTTPError(exc.status, exc.message, exc.type, exc.code) from None
    except ClusterError as exc:
        raise HTTPError(502, f"a node did not answer: {exc.reason}", "backend_error",
                        "node_unreachable") from None


__all__ = ["remote_answer"]
