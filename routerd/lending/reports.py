"""A node's own lending reports (contract §6 node API): its decision rows and its summary; the site's
merge of every node's (contract §7) is :mod:`routerd.site.reports`.

* A node's decisions: its rows newest first (the log's buffer flushed first so recent rows show).
* A node's summary: ``{node_id, build_version, settings_fingerprint, held_requests}``.
* Leases: the coordinator's live leases with ``expires_in_ms`` (a master's only).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import attrs
from twisted.internet import defer

from routerd import __version__
from routerd.store.decisions import DEFAULT_LIMIT


class _Fingerprinted(Protocol):
    def fingerprint(self) -> str: ...


class _Lending(Protocol):
    @property
    def settings(self) -> _Fingerprinted: ...

    @property
    def decisions(self) -> Any: ...  # a DecisionLog once the store is open, else None


class _DecisionSource(Protocol):
    def query_decisions(self, *, lane: str | None = None, outcome: str | None = None,
                        kind: str | None = None, limit: int = DEFAULT_LIMIT,
                        since_ms: int | None = None) -> defer.Deferred[list[dict[str, Any]]]: ...


class _Leases(Protocol):
    def live_leases(self) -> list[dict[str, Any]]: ...


@attrs.frozen
class DecisionQuery:
    """Validated filters of a decisions query."""

    lane: str | None = None
    outcome: str | None = None
    kind: str | None = None
    limit: int = DEFAULT_LIMIT
    since_ms: int | None = None

    def params(self) -> dict[str, str]:
        """The query-string parameters that reproduce these filters on a node."""
        out: dict[str, str] = {}
        for name in ("lane", "outcome", "kind"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        out["limit"] = str(self.limit)
        if self.since_ms is not None:
            out["since_ms"] = str(self.since_ms)
        return out


@attrs.define
class LendingReports:
    """This node's lending reports; ``store`` is read per call (it opens after the node is built)."""

    node_id: str
    lending: _Lending
    store: Callable[[], _DecisionSource | None]
    coordinator: _Leases | None = None

    async def decisions(self, query: DecisionQuery) -> list[dict[str, Any]]:
        """This node's rows for ``query`` (the log's buffer flushed first); [] before the store opens."""
        filters: dict[str, Any] = {"lane": query.lane, "outcome": query.outcome, "kind": query.kind,
                                   "limit": query.limit, "since_ms": query.since_ms}
        decisions = self.lending.decisions
        if decisions is not None:
            rows: list[dict[str, Any]] = await decisions.query(**filters)
            return rows
        store = self.store()
        if store is not None:
            return await store.query_decisions(**filters)
        return []

    def summary(self) -> dict[str, Any]:
        """This node's lending summary (node API document)."""
        held: list[dict[str, Any]] = getattr(self.lending, "held_requests", lambda: [])()
        # the settings folded with the guardian models (LendingService.sync_fingerprint), so in_sync
        # covers both; a lending without guardians reports the settings' own fingerprint
        fingerprint = getattr(self.lending, "sync_fingerprint", self.lending.settings.fingerprint)()
        return {"node_id": self.node_id, "build_version": __version__,
                "settings_fingerprint": fingerprint,
                "held_requests": list(held or [])}

    def leases(self) -> list[dict[str, Any]]:
        """The live leases (a master's coordinator holds them; none elsewhere)."""
        return self.coordinator.live_leases() if self.coordinator is not None else []


__all__ = [
    "DecisionQuery",
    "LendingReports",
]
