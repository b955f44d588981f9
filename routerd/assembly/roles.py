"""What each role adds to a node's common graph: a standalone node lends nowhere and is a site of
one, a master runs the registry, health poller, forwarder, lending coordinator and recipe book, a
slave registers with its master and reaches the coordinator through it.

The site API (contract §7) reads the node's *site*: the master's agent on a master, and on a
standalone node the same agent and registry with no slaves listed (never polled, holding only the
node's own records), so a standalone node serves the site API with the master's code.  A slave has
no site.

``assembly.parts`` calls one of :func:`standalone_parts`, :func:`master_parts` or :func:`slave_parts`
before the lending service exists (the service needs the role's transport), then — on a master —
:func:`recipe_router` and :func:`master_coordinator`, which need the service, the catalog and the
front.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import attrs
from twisted.internet.defer import Deferred, ensureDeferred

from routerd.catalog.catalog import Catalog
from routerd.clients.node_client import NodeClient
from routerd.cluster.master import MasterAgent
from routerd.cluster.slave import RegistrationRefused, SlaveAgent
from routerd.config.lending import LendingSettings
from routerd.config.schema import ClusterConfig
from routerd.inference.front import InferenceFront
from routerd.inference.recipes import Loader, RecipeRouter
from routerd.lending.bootstrap import install_lending_state
from routerd.lending.coordinator import Coordinator, ServeBorrowed
from routerd.lending.offload import Borrowed, offload_returned
from routerd.lending.service import LendingService
from routerd.lending.transport import InProcess, LendingTransport, NoMaster, ViaMaster
from routerd.registry.identity import MemoryPublicIdStore
from routerd.registry.recipes import FILE_NAME as RECIPES_FILE
from routerd.registry.recipes import RecipeBook, RecipeFile
from routerd.registry.registry import Registry
from routerd.registry.replicas import LocalReady
from routerd.routing.call import Incoming, Reply
from routerd.routing.classify import classify
from routerd.routing.forward import Forwarder
from routerd.routing.relay import Timeouts
from routerd.site.settings import SettingsEditor
from routerd.store.store import Store
from routerd.urls import AllowList
from routerd.wire.records import ModelRecord, Snapshot
from routerd.wire.status import RuntimeStatus


@attrs.define
class RoleParts:
    """The role's collaborators; ``None`` where the role has none."""

    transport: LendingTransport
    master: MasterAgent | None = None
    slave: SlaveAgent | None = None
    forwarder: Forwarder | None = None  # a master's, to its slaves
    client: NodeClient | None = None  # the control-plane client (asset pulls from peers)
    public_ids: MemoryPublicIdStore | None = None  # a master's public model IDs
    site: MasterAgent | None = None  # what the site API reads: the master's agent, or a site of one


def standalone_parts(cluster: ClusterConfig, reactor: Any, *, http: Any) -> RoleParts:
    """Nothing is lent; the site API reads a site of one (:func:`site_agent` with no slaves)."""
    return RoleParts(transport=NoMaster(), site=site_agent(cluster, reactor, http=http, slave_urls=(),
                                                           public_ids=MemoryPublicIdStore()))


def site_agent(cluster: ClusterConfig, reactor: Any, *, http: Any, slave_urls: tuple[str, ...],
               public_ids: MemoryPublicIdStore, local_ready: LocalReady | None = None,
               local_status: Callable[[], RuntimeStatus] | None = None) -> MasterAgent:
    """The master's agent over a registry of this node and ``slave_urls`` (none: a site of one,
    whose client may call no node at all)."""
    client = NodeClient(http, cluster.token, AllowList(slave_urls), cluster.control_timeout, reactor)
    registry = Registry(cluster.node_id, cluster.public_url, public_ids, local_ready=local_ready)
    return MasterAgent(node_id=cluster.node_id, slave_urls=slave_urls, registry=registry,
                       client=client, routing_allowed=AllowList(), clock=reactor,
                       health_interval=cluster.health_interval, local_status=local_status or _no_status)


def _no_status() -> RuntimeStatus:
    raise AssertionError("a site of one is never asked for runtime status")


def _unwired_snapshot() -> Snapshot:
    raise AssertionError("a slave registers only after the node is wired")


class Peers:
    """The other nodes a master knows (none elsewhere): where each is reached, which are healthy."""

    def __init__(self, master: MasterAgent | None) -> None:
        self.master = master

    def node_url(self, node_id: str) -> str | None:
        """Where node ``node_id`` is reached (a video job's polls go there)."""
        info = self.master.registry.node(node_id) if self.master is not None else None
        return info.node_url if info is not None else None

    def healthy_urls(self) -> list[str]:
        """The healthy nodes' URLs (where portable assets may be pulled from)."""
        if self.master is None:
            return []
        return [n.node_url for n in self.master.registry.nodes() if n.healthy]


def master_parts(cluster: ClusterConfig, reactor: Any, *, http: Any, agent: Any, timeouts: Timeouts,
                 on_public_id: Callable[[str, str, str], None], local_ready: LocalReady,
                 coordinator: Callable[[], Coordinator]) -> RoleParts:
    """The registry, health poller and forwarder; lending goes to the coordinator in process (built
    later, with the lending service: ``coordinator`` reads it).  The agent's ``local_status`` is
    wired once the node's documents exist."""
    public_ids = MemoryPublicIdStore(on_assign=on_public_id)
    master = site_agent(cluster, reactor, http=http, slave_urls=cluster.slave_urls, public_ids=public_ids,
                        local_ready=local_ready)
    return RoleParts(transport=InProcess(cluster.node_id, coordinator), master=master, client=master.client,
                     forwarder=Forwarder(agent, cluster.token, master.routing_allowed, timeouts),
                     public_ids=public_ids, site=master)


def slave_parts(cluster: ClusterConfig, reactor: Any, *, http: Any, agent: Any, timeouts: Timeouts,
                on_terminal: Callable[[RegistrationRefused], None]) -> RoleParts:
    """The registration loop; lending goes through the master's offload endpoints.  The agent's
    ``snapshot`` is wired once the node's documents exist."""
    client = NodeClient(http, cluster.token, AllowList([cluster.master_url, cluster.public_url]),
                        cluster.control_timeout, reactor)
    slave = SlaveAgent(master_url=cluster.master_url, client=client, snapshot=_unwired_snapshot,
                       clock=reactor, sync_interval=cluster.sync_interval, on_terminal=on_terminal)
    to_master = Forwarder(agent, cluster.token, AllowList([cluster.master_url]), timeouts)
    return RoleParts(transport=ViaMaster(cluster.node_id, cluster.master_url, client, to_master),
                     slave=slave, client=client)


def master_coordinator(parts: RoleParts, service: LendingService, reactor: Any, *,
                       serve_borrowed: ServeBorrowed,
                       observe_plan: Callable[[float], None]) -> Coordinator:
    """The master's lending coordinator; each accepted registration pushes links to that slave."""
    assert parts.master is not None and parts.forwarder is not None
    coordinator = Coordinator(node_id=parts.master.node_id, master=parts.master, service=service,
                              clock=reactor, forwarder=parts.forwarder, serve_borrowed=serve_borrowed,
                              observe_plan=observe_plan)
    parts.master.when_registered(coordinator.push_soon)
    return coordinator


def recipe_router(master: MasterAgent, store_dir: str, reactor: Any, *, catalog: Callable[[], Catalog],
                  runtimes: Loader) -> RecipeRouter:
    """The master's recipe book (``recipes.json`` in the store directory) and its router."""
    book = RecipeBook(RecipeFile(os.path.join(store_dir, RECIPES_FILE)), own_node_id=master.node_id,
                      records=master.registry.records, routing_only=lambda: len(catalog()) == 0,
                      now_ms=lambda: int(reactor.seconds() * 1000))
    return RecipeRouter(book=book, node_id=master.node_id, records=master.registry.records,
                        catalog=catalog, runtimes=runtimes, remote=master.client)


def apply_live_cluster(cluster: ClusterConfig, master: MasterAgent | None, slave: SlaveAgent | None) -> None:
    """A reload's new intervals and control timeout, applied to the role's agent at once."""
    if master is not None:
        master.health_interval = cluster.health_interval
        master.getServiceNamed("health poll").set_interval(cluster.health_interval)  # type: ignore[no-untyped-call]
        master.client.control_timeout = cluster.control_timeout
    if slave is not None:
        slave.sync_interval = cluster.sync_interval
        slave.getServiceNamed("registration").set_interval(cluster.sync_interval)  # type: ignore[no-untyped-call]
        slave.client.control_timeout = cluster.control_timeout


async def start_site(site: MasterAgent, public_ids: MemoryPublicIdStore | None, store: Store,
                     lending: LendingService, lending_config: LendingSettings,
                     own_records: list[ModelRecord], *, links: bool) -> None:
    """The start of a node that serves the site API: stored public IDs (a master's), links (a
    master's: a site of one has no other node to link to), settings and guardians, then its own
    records in the registry and a first poll of every slave (none on a site of one)."""
    if public_ids is not None:
        public_ids.seed(await store.public_ids())
    await install_lending_state(store, lending, lending_config, links=links)
    site.registry.update_local(own_records)
    await site.poll_all()


async def apply_live_lending(settings: LendingSettings, lending: LendingService, store: Store | None, *,
                             site: bool) -> None:
    """A reload's changed lending settings: a node serving the site API layers them (default <
    config < stored override) and pushes the result to its slaves; a slave applies them as they are."""
    lending.config_settings = settings
    if site:
        await SettingsEditor(store, lending).document(apply=True)
    else:
        lending.apply_settings(settings)


def borrowed_server(front: InferenceFront) -> ServeBorrowed:
    """How a helper serves a borrowed request: through its own front, as a cluster call."""

    def serve_borrowed(reply: Reply, incoming: Incoming, borrowed: Borrowed) -> Deferred[bytes]:
        route = classify("POST", incoming.path)
        if route is None:
            raise offload_returned(f"{incoming.path} is not an inference path")
        return ensureDeferred(front.handle(incoming, reply, route, cluster_call=True, borrowed=borrowed))

    return serve_borrowed
