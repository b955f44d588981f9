"""Who may hold a connection, decided when it is accepted, before a byte of it is read.

:func:`accept` is pure: from the peer's address, the connections open now (:class:`ConnectionBook`),
the server limits and the node's :class:`~routerd.cluster.auth.AuthPolicy` it returns what the
lean channel's factory does with the new connection:

- ``"foreign"``: a peer outside ``server.allowed_cidrs`` that is not a trusted proxy.  It never
  counts against ``server.max_connections``; it must send its head within ``server.head_timeout``
  of being accepted, and is then answered 403 as any request from there is (in its route's error
  family, with its access line) and closed.  Foreign connections together are held to
  ``server.max_connections`` too: beyond, one is refused at once;
- ``"counted"``: a connection that counts against ``server.max_connections``;
- ``"evict"``: the same, at the limit: the oldest connection that has sent nothing yet is closed
  to make room (idle connections that sent nothing go first);
- a :class:`~routerd.errors.Saturated` 503 ``too_many_connections``: over the limit with no such
  connection to close, or over ``server.max_connections_per_peer`` for the peer (loopback and
  trusted proxies, which carry many clients, are not capped per peer).
"""

from __future__ import annotations

import ipaddress
from typing import Literal

import attrs
from twisted.internet import protocol

from routerd.api.access import refusal
from routerd.cluster.auth import AuthPolicy
from routerd.config.schema import ServerConfig
from routerd.errors import ErrorStyle, Saturated, StatusError

Accepted = Literal["counted", "foreign", "evict"]


@attrs.define
class ConnectionBook:
    """The connections open now: how many count against the limit, how many are foreign, and
    how many each peer holds."""

    counted: int = 0
    foreign: int = 0
    per_peer: dict[str, int] = attrs.Factory(dict)

    def opened(self, peer: str, foreign: bool) -> None:
        if foreign:
            self.foreign += 1
        else:
            self.counted += 1
        self.per_peer[peer] = self.per_peer.get(peer, 0) + 1

    def closed(self, peer: str, foreign: bool) -> None:
        if foreign:
            self.foreign = max(0, self.foreign - 1)
        else:
            self.counted = max(0, self.counted - 1)
        held = self.per_peer.get(peer, 0) - 1
        if held > 0:
            self.per_peer[peer] = held
        else:
            self.per_peer.pop(peer, None)


def too_many_connections() -> Saturated:
    return Saturated(503, "this node has server.max_connections connections open; retry later",
                     "too_many_connections")


def too_many_from_peer() -> Saturated:
    return Saturated(503, "this address has server.max_connections_per_peer connections open; retry later",
                     "too_many_connections")


def accept(book: ConnectionBook, limits: ServerConfig, policy: AuthPolicy, peer: str | None,
           can_evict: bool) -> Accepted | Saturated:
    """What to do with a new connection from ``peer`` (None: not an IP peer, counted as before);
    ``can_evict``: whether a counted connection that has sent nothing is open (see the module
    docstring)."""
    if peer is not None and not policy.proxy(peer):
        if book.per_peer.get(peer, 0) >= limits.max_connections_per_peer and not _loopback(peer):
            return too_many_from_peer()
        if not policy.client_allowed(peer):
            return "foreign" if book.foreign < limits.max_connections else too_many_connections()
    if book.counted < limits.max_connections:
        return "counted"
    return "evict" if can_evict else too_many_connections()


class Refused(protocol.Protocol):
    """A connection over ``server.max_connections`` (or the peer's cap): 503 and closed, nothing
    read."""

    def __init__(self, date: bytes, family: ErrorStyle, error: StatusError) -> None:
        self._date = date
        self._family = family
        self._error = error

    def connectionMade(self) -> None:  # noqa: N802 - Twisted's name
        assert self.transport is not None
        self.transport.write(refusal(self._error, self._family, (), self._date))
        self.transport.loseConnection()


def _loopback(peer: str) -> bool:
    try:
        return ipaddress.ip_address(peer.strip("[]")).is_loopback
    except ValueError:
        return False


__all__ = ["Accepted", "ConnectionBook", "Refused", "accept", "too_many_connections", "too_many_from_peer"]
