"""The master's cluster duties: registration, health polling, the merged registry.

Every slave listed in ``cluster.slave_urls`` is polled (``GET
/router/v1/node/models``) at startup and every ``health_interval``, with
bounded concurrency; a failed poll marks that node unhealthy (its models stay
listed but unavailable) until a later poll or registration succeeds.  A poll that
fails after the node registered while it was out (the first cycle runs before a
slave listens) leaves the registration standing.  Nodes are never forgotten.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.application.service import MultiService
from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from routerd.clients.node_client import ClusterError, NodeClient
from routerd.cluster.fanout import fan_out
from routerd.errors import StatusError
from routerd.paths import NODE_RUNTIME_STATUS
from routerd.registry.records import NodeInfo
from routerd.registry.registry import Registry
from routerd.routing.stt import RoundRobinCounter
from routerd.services import IntervalService
from routerd.urls import AllowList, URLError, normalise_url
from routerd.wire.records import (
    PROTOCOL_VERSION,
    Snapshot,
    parse_snapshot,
)
from routerd.wire.status import RuntimeStatus, parse_status

log = Logger()

# Bounded, but wide enough that a 200-slave cycle of ~40 ms answers stays well under 1 s (7 rounds;
# benchmarks/cluster.py (b)).
POLL_CONCURRENCY = 32
STATUS_CONCURRENCY = 8
STATUS_DEADLINE_S = 5.0


class NotListed(StatusError):
    def __init__(self, url: str) -> None:
        super().__init__(403, f'node url "{url}" is not configured in cluster.slave_urls',
                         "cluster_error", "not_configured")


class MasterAgent(MultiService):
    def __init__(self, *, node_id: str, slave_urls: tuple[str, ...], registry: Registry,
                 client: NodeClient, routing_allowed: AllowList, clock: IReactorTime,
                 health_interval: float, local_status: Callable[[], RuntimeStatus]) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.node_id = node_id
        self.slave_urls = tuple(normalise_url(u) for u in slave_urls)
        self.registry = registry
        self.client = client
        self.routing_allowed = routing_allowed
        self.clock = clock
        self.health_interval = health_interval
        self.local_status = local_status
        self.stt_counter = RoundRobinCounter()
        # The latest answer of statuses(), when it was taken and the seconds the registry held reserved
        # then (replica choice prices with them).
        self._latest: dict[str, RuntimeStatus] = {}
        self._latest_at: float | None = None
        self._latest_reserved: dict[str, float] = {}
        self._registered: list[Callable[[str], None]] = []
        self._polled: list[Callable[[], defer.Deferred[Any]]] = []
        # Registrations accepted so far, and the count at each URL's latest one: a poll that failed
        # but was sent before a registration was accepted says nothing about the node since.
        self._registrations = 0
        self._registered_at: dict[str, int] = {}
        # Polls every health_interval (the node awaits one poll_all before it starts this
        # service, so the first cycle happens before the listener opens).
        IntervalService("health poll", self._tick, health_interval, clock).setServiceParent(self)  # type: ignore[no-untyped-call]
        self._polling: defer.Deferred[None] | None = None

    # -- health polling -------------------------------------------------------

    def stopService(self) -> defer.Deferred[None]:
        d: defer.Deferred[None] = super().stopService()  # type: ignore[no-untyped-call]
        if self._polling is not None:
            self._polling.cancel()
        return d

    def when_registered(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(node_id)`` after each accepted registration."""
        self._registered.append(callback)

    def when_polled(self, callback: Callable[[], defer.Deferred[Any]]) -> None:
        """Run ``callback()`` alongside each poll cycle (this node's own telemetry reading); the cycle
        ends when it has (a failure is logged, never the poll's)."""
        self._polled.append(callback)

    def _tick(self) -> defer.Deferred[None] | None:
        if self._polling is not None:
            return None  # a slow cycle is still running: never stack polls
        return self.poll_all()

    def poll_all(self) -> defer.Deferred[None]:
        self._polling = defer.ensureDeferred(self._poll_all())

        def done(result: object) -> object:
            self._polling = None
            return result

        return self._polling.addBoth(done)

    async def _poll_all(self) -> None:
        # Applied in configuration order, so when two URLs claim one node_id the
        # first configured one wins; as one registry change (one rebuild for the cycle).
        sent_after = self._registrations
        alongside = [defer.maybeDeferred(callback) for callback in self._polled]
        answers = await fan_out(self.slave_urls, self.client.models, POLL_CONCURRENCY)
        with self.registry.batch():
            for url, value in answers:
                if isinstance(value, Failure):
                    if self._registered_at.get(url, -1) >= sent_after:
                        continue  # the node registered while this poll was out: its answer stands
                    if self.registry.mark_unhealthy(url):
                        log.warn("health poll of {url} failed: {reason}", url=url,
                                 reason=value.getErrorMessage())
                    continue
                try:
                    self._accept(value, url, "poll")
                except StatusError:
                    pass  # logged, and the node marked unhealthy
        for ok, result in await defer.DeferredList(alongside, consumeErrors=True):
            if not ok:
                log.failure("a reading alongside the health poll failed", failure=result)

    def _accept(self, snapshot: Snapshot, url: str, how: str) -> None:
        try:
            self.registry.update_node(snapshot, url)
        except StatusError as exc:
            self.registry.mark_unhealthy(url)
            log.error("{how} from {url} refused: {reason}", how=how, url=url, reason=exc.message)
            raise
        self.routing_allowed.add(url)

    # -- registration ---------------------------------------------------------

    def register(self, body: Any) -> dict[str, Any]:
        """Handle ``POST /router/v1/node/register``; raises ``StatusError`` subclasses."""
        snapshot = parse_snapshot(body)
        try:
            url = normalise_url(snapshot.node_url)
        except URLError as exc:
            raise StatusError(400, f"node_url is invalid: {exc.reason}", "cluster_error",
                              "invalid_node_url") from None
        if url not in self.slave_urls:
            log.warn("registration of {node_id} from unlisted {url} refused", node_id=snapshot.node_id,
                     url=url)
            raise NotListed(url)
        self._accept(snapshot, url, "registration")
        self._registered_at[url] = self._registrations
        self._registrations += 1
        log.info("node {node_id} registered from {url}", node_id=snapshot.node_id, url=url)
        for callback in self._registered:
            callback(snapshot.node_id)
        return {"ok": True, "protocol_version": PROTOCOL_VERSION,
                "minimum_protocol_version": PROTOCOL_VERSION}

    # -- runtime status and STT -----------------------------------------------

    async def statuses(self) -> dict[str, RuntimeStatus]:
        """Runtime status of this node and of every healthy remote node that answers."""
        out: dict[str, RuntimeStatus] = {}
        own = self.local_status()
        out[own.node_id] = own
        nodes = [n for n in self.registry.nodes() if n.healthy]

        def ask(node: NodeInfo) -> defer.Deferred[Any]:
            return self.client.get_json(node.node_url, NODE_RUNTIME_STATUS,
                                        timeout=STATUS_DEADLINE_S)

        for node, value in await fan_out(nodes, ask, STATUS_CONCURRENCY):
            if isinstance(value, Failure):
                continue  # a node without runtime status stays usable for explicit requests only
            try:
                status = parse_status(value)
            except StatusError:
                continue
            if status.node_id == node.node_id:
                out[status.node_id] = status
        self._latest, self._latest_at = out, self.clock.seconds()
        self._latest_reserved = self.registry.reserved_seconds()
        return out

    def latest_statuses(self) -> tuple[dict[str, RuntimeStatus], float | None, dict[str, float]]:
        """The latest :meth:`statuses` answer, the clock's time it was taken (None: never) and the
        predicted seconds the registry held reserved then, by ``node:local:lane``."""
        return self._latest, self._latest_at, self._latest_reserved

    async def node_json(self, node_id: str, path: str) -> Any:
        """GET a node API document from a remote node (for the site API)."""
        node = self.registry.node(node_id)
        if node is None:
            raise StatusError(404, f"node {node_id!r} is not known", "not_found", "node_not_found")
        try:
            return await self.client.get_json(node.node_url, path)
        except ClusterError as exc:
            raise StatusError(502, f"node {node_id!r} did not answer: {exc}", "backend_error",
                              "node_unreachable") from None
