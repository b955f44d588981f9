"""The ``routing`` section (contract §2): how a master picks among the replicas of one public ID."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from routerd.replica_modes import KEY_SOURCES, MODES, KeySource, Mode

if TYPE_CHECKING:  # the reader's module imports the schema, which holds this section
    from routerd.config.reader import Reader

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


def read_routing(section: Mapping[str, Any], reader: Reader) -> RoutingConfig:
    """The ``routing`` section, every problem added to the reader's errors."""
    default = RoutingConfig()
    mode = reader.string(section, "routing", "replica_choice", default.replica_choice)
    if mode not in MODES:
        reader.errs.add("routing.replica_choice", f"must be one of {', '.join(MODES)}, got {mode!r}")
        mode = default.replica_choice
    source = reader.string(section, "routing", "affinity_key", default.affinity_key)
    if source not in KEY_SOURCES:
        reader.errs.add("routing.affinity_key", f"must be one of {', '.join(KEY_SOURCES)}, got {source!r}")
        source = default.affinity_key
    bound = reader.number(section, "routing", "load_bound", default.load_bound)
    if bound < 1.0:
        reader.errs.add("routing.load_bound", f"must be at least 1, got {bound}")
        bound = default.load_bound
    history = reader.integer(section, "routing", "affinity_history", default.affinity_history, 1, 10_000_000)
    reader.unknown(section, "routing", ROUTING_KEYS)
    return RoutingConfig(replica_choice=mode, affinity_key=source,  # type: ignore[arg-type]
                         load_bound=bound, affinity_history=history)


__all__ = ["ROUTING_KEYS", "RoutingConfig", "read_routing"]
