"""One routerd node: its parts, assembled in two phases, and its life (architecture principle 4).

``Node`` owns the catalog, store, backend runtimes, metrics, lending and — by role — the master's
registry, health poller and lending coordinator or the slave's registration loop.  It decides
nothing itself: ``assembly.parts`` builds the parts, each from what already exists;
``assembly.wiring`` fills the references that point forward in one visible block; ``assembly.lifecycle``
starts, drains and stops them; ``assembly.reload`` applies a reload.  The request path is
``inference.front``, documents ``assembly.documents``, model loads ``inference.admin``, lending
``lending.service`` with its ``lending.transport``.  Several nodes can live in one reactor on
different ports; that is how integration tests build clusters cheaply.  The HTTP edge
(``routerd.api``) is built on top of a node, never the reverse.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.threads import deferToThread
from twisted.logger import Logger

from routerd.assembly import lifecycle
from routerd.assembly.clients import NodeClients
from routerd.assembly.current import Late
from routerd.assembly.parts import NodeParts, build_common, build_role, build_services
from routerd.assembly.reload import build_reloader
from routerd.assembly.wiring import wire
from routerd.catalog.catalog import Catalog
from routerd.cluster.slave import RegistrationRefused
from routerd.config.schema import Config
from routerd.lending.coordinator import Coordinator
from routerd.store.store import Store


def _ignore_fatal(_exc: BaseException) -> None:
    """Until the process sets ``on_fatal``, a refused registration is only logged."""


class Node(NodeParts):
    log = Logger()
    #: Told when the node cannot go on (a slave refused by its master); the process stops.
    on_fatal: Callable[[BaseException], None]

    def __init__(self, config: Config, reactor: Any, *, launcher: Any = None, http: Any = None,
                 agent: Any = None, port_allocator: Callable[[], int] | None = None,
                 open_store: Callable[[str], Awaitable[Store]] | None = None,
                 run_in_thread: Callable[..., Any] = deferToThread,
                 read_config: Callable[[], Config] | None = None) -> None:
        self.on_fatal = _ignore_fatal
        coordinator: Late[Coordinator] = Late("the lending coordinator")
        # phase 1: the parts, each built from what exists before it
        build_common(self, config, reactor, clients=NodeClients(reactor, agent=agent, http=http),
                     launcher=launcher, port_allocator=port_allocator, open_store=open_store,
                     run_in_thread=run_in_thread)
        build_role(self, coordinator=coordinator, on_terminal=self._fatal)
        build_services(self, on_catalog=self._assets_bound, hash_catalog=self._hash_catalog)
        self.live, self.reloader = build_reloader(self, read_config=read_config,
                                                  hash_catalog=self._hash_catalog)
        # phase 2: the references that point forward, in one block
        wire(self, coordinator)
        self.services = lifecycle.service_tree(self)
        self._refit = self._refit_loop.refit

    # -- lifecycle (assembly.lifecycle) -------------------------------------------

    async def start(self) -> None:
        """Open the store, hash the catalog, poll slaves (master), start the service tree and
        preload the startup model."""
        await lifecycle.start(self, self.services, self._hash_catalog)

    async def after_listening(self) -> None:
        """Steps that need the listener open: portable configs are resolved (in the background;
        peers may pull from this node meanwhile) and a slave registers with its master."""
        await lifecycle.after_listening(self, self.services)

    async def drain(self, timeout: float) -> None:
        """Stop taking work and let in-flight requests finish, for up to ``timeout`` seconds."""
        await lifecycle.drain(self, timeout)

    async def stop(self) -> None:
        await lifecycle.stop(self, self.services)

    # -- reload (process.reload decides; assembly.reload applies) -----------------

    async def apply_live_config(self, old: Config, new: Config) -> None:
        await self.live.apply(old, new)

    async def announce(self) -> None:
        await self.live.announce()

    # -- the catalog: hashed at start and again when portable assets bind ---------

    def _hash_catalog(self, catalog: Catalog) -> Deferred[Catalog]:
        return catalog.hashed(self.hash_cache, self._run_in_thread)

    async def _assets_bound(self, catalog: Catalog) -> None:
        current = self.catalog
        hashed = await catalog.hashed(self.hash_cache, self._run_in_thread)
        if self.catalog is not current:  # replaced while hashing: the newer one stands
            return
        self.catalog = hashed
        self.records_changed()

    def _fatal(self, exc: RegistrationRefused) -> None:
        self.log.critical("{reason}; stopping", reason=str(exc))
        self.on_fatal(exc)
