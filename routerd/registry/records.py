"""Registry data: the nodes a master knows and the errors of node registration.

The model record itself is the wire type :class:`routerd.wire.records.ModelRecord`; it is
re-exported here so registry users need one import.
"""

from __future__ import annotations

from typing import Any

import attrs

from routerd.errors import StatusError
from routerd.wire.records import MINIMUM_PROTOCOL_VERSION, ModelRecord, Snapshot

__all__ = [
    "DuplicateNode",
    "IncompatibleProtocol",
    "InvalidNode",
    "ModelRecord",
    "NodeInfo",
    "RegistryError",
]


class RegistryError(StatusError):
    """A node snapshot the registry refuses; ``reason`` says why (nothing was changed)."""

    def __init__(self, status: int, reason: str, code: str) -> None:
        super().__init__(status, reason, "cluster_error", code)


class DuplicateNode(RegistryError):
    """409 ``duplicate_node``: the snapshot clashes with a known node identity or URL."""

    def __init__(self, reason: str) -> None:
        super().__init__(409, reason, "duplicate_node")


class IncompatibleProtocol(RegistryError):
    """409 ``incompatible_protocol``: the peer speaks a protocol older than we accept."""

    def __init__(self, node_id: str, build_version: str, protocol_version: int) -> None:
        build = build_version or "unknown build"
        reason = (f'node "{node_id}" ({build}) speaks protocol version {protocol_version}, '
                  f"this master needs at least {MINIMUM_PROTOCOL_VERSION}; update the peer")
        super().__init__(409, reason, "incompatible_protocol")
        self.node_id = node_id
        self.build_version = build_version
        self.protocol_version = protocol_version


class InvalidNode(RegistryError):
    """400 ``cluster_error``: the snapshot names no node or an unusable URL."""

    def __init__(self, reason: str) -> None:
        super().__init__(400, reason, "cluster_error")


@attrs.frozen
class NodeInfo:
    """A remote node as the master sees it (for inventories and health pages)."""

    node_id: str
    node_url: str
    healthy: bool
    build_version: str
    protocol_version: int
    #: The node's latest telemetry as its snapshot carried it (None before one does).
    telemetry: dict[str, Any] | None = None


@attrs.define
class NodeEntry:
    """Mutable registry state of one remote node; never removed once known."""

    node_id: str
    node_url: str  # normalised
    snapshot: Snapshot
    healthy: bool = True

    def info(self) -> NodeInfo:
        return NodeInfo(self.node_id, self.node_url, self.healthy, self.snapshot.build_version,
                        self.snapshot.protocol_version, self.snapshot.telemetry)
