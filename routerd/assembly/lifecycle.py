"""A node's life: the service tree (what runs on a timer or must be stopped, in stop order), the
start (store, hashed catalog, books, the site's state, the startup model), the steps that need the
listener open, the drain and the stop."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred, ensureDeferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from routerd.assembly.parts import NodeParts
from routerd.assembly.roles import start_site
from routerd.catalog.catalog import Catalog
from routerd.inference.memory import freeze_start_up
from routerd.lending.bootstrap import install_lending_state
from routerd.services import HookService, IntervalService, OrderedServices

log = Logger()

#: How often a master probes its own backends' lanes (text, image, stt readiness).
LANE_PROBE_INTERVAL_S = 1.0


def service_tree(p: NodeParts) -> OrderedServices:
    """Start order top to bottom; stop order bottom to top, each after the one below it."""
    reactor = p.reactor
    # A master picks a local replica only when its lane is ready (spec "Registration and health").
    p.lane_probes = None if p.master is None else IntervalService(
        "lane readiness", p.runtimes.refresh_readiness, LANE_PROBE_INTERVAL_S, reactor)

    def start_decisions() -> None:
        p.decisions.start(p.store)

    services = OrderedServices()  # type: ignore[no-untyped-call]
    def stop_tracing() -> Any:
        return p.run_in_thread(p.tracer.shutdown)  # its last export waits off the reactor thread

    # the tracer stops last: every span has ended by then
    for child in (HookService("tracing", on_stop=stop_tracing),
                  HookService("connection pool", on_stop=p.clients.close),
                  HookService("router database", on_stop=store_closer(p)),
                  # analytics' buffered rows are written before the store closes
                  HookService("analytics", on_stop=p.analytics.flush),
                  p._analytics_loop,
                  HookService("backends", on_start=p.runtimes.boot, on_stop=p.runtimes.stop),
                  # stopped before the backends: running video jobs end and give their runtime back
                  HookService("video jobs", on_stop=p.jobs.stop),
                  HookService("restore after borrow", on_stop=p.restorer.stop),
                  HookService("decision log", on_start=start_decisions, on_stop=p.decisions.stop),
                  p._refit_loop, IntervalService("keep-alive", p.keepalive.tick, 1.0, reactor),
                  p.assets.retry, p.lane_probes, p.master, p.coordinator):
        if child is not None:
            child.setServiceParent(services)  # type: ignore[no-untyped-call]
    return services


def store_closer(p: NodeParts) -> Callable[[], Any]:
    """Close the store once it is open (the router database's stop)."""

    async def close_store() -> None:
        if p.store is not None:
            await p.store.close()

    return close_store


async def start(p: NodeParts, services: OrderedServices,
                hash_catalog: Callable[[Catalog], Deferred[Catalog]]) -> None:
    """Open the store, hash the catalog, load the books, bring up the site's state (a master or a
    site of one), start the service tree and preload the startup model."""
    config = p.config
    p.store = await p._open_store(os.path.join(config.cluster.store_dir, "routerd.sqlite"))
    hashing_started = p.reactor.seconds()
    log.info("hashing the weight files of {count} model configs", count=len(p.catalog.models))
    p.catalog = await hash_catalog(p.catalog)
    log.info("weight files hashed in {seconds:.1f} s", seconds=p.reactor.seconds() - hashing_started)
    p.assets.book.load()
    await p.assets.rebuild_index()
    if p.recipes is not None:
        p.recipes.book.load()
    p.bench.book.load()
    if p.site is not None:
        await start_site(p.site, p._public_ids, p.store, p.lending, config.cluster.lending, p.local_records(),
                         links=p.master is not None)
    elif p.store is not None:  # a slave: what its master pushed last, until the master pushes again
        await install_lending_state(p.store, p.lending, config.cluster.lending)
    # The first cost fit runs now but is not awaited (the refit service's first call).
    services.startService()  # type: ignore[no-untyped-call]
    startup = p.config.models.startup_model
    if startup:
        await p.admin.load(startup)
    p.phase = "ready"
    freeze_start_up()  # start-up's objects out of full collections (routerd.inference.memory)


def _resolve_failed(failure: Failure) -> None:
    log.failure("resolving model assets failed", failure=failure)


def resolve_assets(p: NodeParts) -> None:
    """Resolve portable configs in the background (peers may pull from this node meanwhile)."""
    ensureDeferred(p.assets.resolve()).addErrback(_resolve_failed)


async def after_listening(p: NodeParts, services: OrderedServices) -> None:
    """Steps that need the listener open: portable configs are resolved and a slave registers."""
    resolve_assets(p)
    if p.slave is not None:
        await p.slave.start()
        p.slave.setServiceParent(services)  # type: ignore[no-untyped-call]


async def drain(p: NodeParts, timeout: float) -> None:
    """Stop taking work and let in-flight requests finish, for up to ``timeout`` seconds
    (``/health`` answers 503 ``draining`` from now on; see ``InferenceFront.drain``)."""
    p.phase = "draining"
    await p.front.drain(timeout)


async def stop(p: NodeParts, services: OrderedServices) -> None:
    p.phase = "draining"
    if services.running:
        await services.stopService()
