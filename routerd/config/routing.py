"""The ``routing`` section (contract §2): how a master picks among the replicas of one public ID."""

from __future__ import annotations

import attrs

from routerd.replica_modes import KeySource, Mode

#: The keys of the section, in the contract's order.
ROUTING_KEYS: tuple[str, ...] = ("replica_choice", "affinity_key", "load_bound", "affinity_history")


@attrs.frozen
class RoutingConfig:
    #: The site-wide mode; a model config's ``router_replica_choice`` overrides it for that model.
    replica_choice: Mode = "rotation"
    #: Where ``affinity`` reads a request's session key.
    affinity_key: KeySource = "auto"
    #: ``c``: under ``affinity`` no replica takes more than ``c ×`` the mean load (at least 1).
    load_bound: float = 1.25
    #: Session keys remembered (least recently used dropped first).
    affinity_history: int = 10_000


__all__ = ["ROUTING_KEYS", "RoutingConfig"]
