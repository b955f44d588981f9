"""How a node applies a reload (``process.reload`` decides what changed): the live keys of the new
config reach the parts that read them, and the cluster hears of the new models.  The
:class:`~routerd.process.reload.Reloader` is given these two steps, the config and catalog holders
and the runtimes — never the node."""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.defer import Deferred

from routerd.assembly.lifecycle import resolve_assets
from routerd.assembly.parts import NodeParts, auth_policy
from routerd.assembly.roles import apply_live_cluster, apply_live_lending
from routerd.catalog.catalog import Catalog
from routerd.config.load import reread_config
from routerd.config.schema import Config
from routerd.process.reload import Reloader


class LiveConfig:
    """The two steps of a reload that touch the node's parts."""

    def __init__(self, parts: NodeParts) -> None:
        self.p = parts

    async def apply(self, old: Config, new: Config) -> None:
        """Make the live keys of ``new`` take effect (keys, intervals, limits, lending settings)."""
        p, cluster = self.p, new.cluster
        p.policy = auth_policy(new)
        p.keepalive.default_ttl = new.models.keep_alive
        p.timeouts.first_byte = new.limits.first_byte_timeout
        p.timeouts.idle = new.limits.idle_stream_timeout
        p.local.max_queued_per_model = new.limits.max_queued_per_model
        p.keys.reload(new)
        p.lending.set_limits(new.limits.max_queued_per_model, new.queue.aging, p.keys.weights)
        p.local_side.reload(new)
        p.runtime_models.reload(new)  # scheduling.swap_batch, swap_max_wait
        p.analytics.config = new.analytics  # on or off, retentions, buffer bound: from now on
        p._analytics_loop.set_interval(new.analytics.flush_interval)
        apply_live_cluster(cluster, p.master, p.slave)
        if cluster.lending != old.cluster.lending:
            await apply_live_lending(cluster.lending, p.lending, p.store, site=p.site is not None)

    async def announce(self) -> None:
        """After a reload: the asset index follows the new models (portable configs bound again);
        a master refreshes its own records and re-polls; a slave re-registers."""
        p = self.p
        await p.assets.rebuild_index()
        resolve_assets(p)  # may pull from peers: not awaited
        if p.site is not None:
            p.site.registry.update_local(p.local_records())
            await p.site.poll_all()
        if p.slave is not None and p.slave.running:
            await p.slave.register_once()

    def reread(self) -> Config:
        """The YAML the running config came from, read again."""
        return reread_config(self.p.config)


def build_reloader(p: NodeParts, *, read_config: Callable[[], Config] | None,
                   hash_catalog: Callable[[Catalog], Deferred[Catalog]]) -> tuple[LiveConfig, Reloader]:
    live = LiveConfig(p)
    reloader = Reloader(config=p.current_config, catalog=p.current_catalog, runtimes=p.runtimes,
                        apply_live_config=live.apply, announce=live.announce,
                        read_config=read_config or live.reread, hash_catalog=hash_catalog,
                        own_loads=p.own_loads)
    return live, reloader
