"""``twistd routerd``: command-line options and ``makeService``."""

from __future__ import annotations

import os
import sys
from typing import Any

from twisted.application import service
from twisted.internet import defer
from twisted.logger import Logger, globalLogPublisher, jsonFileLogObserver
from twisted.protocols.policies import WrappingFactory
from twisted.python import usage

from routerd.api.app import build_site
from routerd.catalog.catalog import CatalogError
from routerd.config.load import ConfigError, load_config
from routerd.config.schema import Config
from routerd.node import Node

log = Logger()


class Options(usage.Options):
    synopsis = "[--config PATH] [--check] [--json-log PATH]"
    optParameters = [
        ["config", "c", None, "YAML config file (default: the embedded default config)"],
        ["json-log", None, None, "also write log events as JSON lines to this file"],
    ]
    optFlags = [["check", None, "validate the config, print ok or every error, and exit"]]


class NodeService(service.Service):
    """Starts a node (store, hashes, startup model) and only then opens its listener."""

    def __init__(self, node: Node, reactor: Any, exit_on_failure: bool = False) -> None:
        self.node = node
        self.reactor = reactor
        self.exit_on_failure = exit_on_failure
        self.port: Any = None
        self.connections: WrappingFactory | None = None
        self.ready: defer.Deferred[None] = defer.Deferred()

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        defer.ensureDeferred(self._start()).addErrback(self._failed)

    async def _start(self) -> None:
        from twisted.internet.endpoints import TCP4ServerEndpoint, TCP6ServerEndpoint

        await self.node.start()
        server = self.node.config.server
        endpoint_type = TCP6ServerEndpoint if ":" in server.host else TCP4ServerEndpoint
        endpoint = endpoint_type(self.reactor, server.port, interface=server.host)
        # WrappingFactory tracks open connections so a stop can drop them.
        self.connections = WrappingFactory(build_site(self.node))
        self.port = await endpoint.listen(self.connections)  # type: ignore[no-untyped-call]
        address = self.port.getHost()
        log.info("routerd node {node_id} ({role}) listening on http://{host}:{port}",
                 node_id=self.node.node_id, role=self.node.config.cluster.role,
                 host=address.host, port=address.port)
        self.node.on_fatal = self._fatal
        await self.node.after_listening()
        self.ready.callback(None)

    def _fatal(self, exc: BaseException) -> None:
        from twisted.python.failure import Failure

        self._failed(Failure(exc))

    def _failed(self, failure: Any) -> None:
        log.failure("routerd failed to start", failure=failure)
        if not self.ready.called:
            self.ready.errback(failure)
        if self.exit_on_failure and self.reactor.running:
            # A failed start (e.g. the startup model does not load) must not
            # leave a silent process behind: stop, exiting with status 1.
            self.reactor.addSystemEventTrigger("after", "shutdown", os._exit, 1)
            self.reactor.stop()

    async def _stop(self) -> None:
        port, self.port = self.port, None
        if port is not None:
            stopping = port.stopListening()
            if stopping is not None:
                await stopping
            # Open keep-alive connections would otherwise go on being served.
            for connection in list(self.connections.protocols if self.connections else ()):
                connection.transport.abortConnection()
        await self.node.stop()

    def stopService(self) -> defer.Deferred[None]:
        super().stopService()  # type: ignore[no-untyped-call]
        return defer.ensureDeferred(self._stop())


def check_config(path: str | None) -> tuple[bool, list[str]]:
    try:
        config = load_config(path)
    except ConfigError as exc:
        return False, exc.errors
    try:
        from routerd.catalog.catalog import Catalog

        catalog = Catalog.scan(config.models.config_dir, config.backend.mode)
    except CatalogError as exc:
        return False, [f"models.config_dir: {exc}"]
    from routerd.backends.check import check_families

    errors, notes = check_families(config, catalog.models)
    for note in notes:  # which binary each family would run (stdout stays "ok" or the errors)
        print(note, file=sys.stderr)
    return not errors, errors


def makeService(options: Options) -> service.MultiService:
    from twisted.internet import reactor

    path = options["config"]
    if options["check"]:
        ok, errors = check_config(path)
        if ok:
            print("ok")
            sys.exit(0)
        for line in errors:
            print(line)
        sys.exit(1)
    try:
        config: Config = load_config(path)
    except ConfigError as exc:
        for line in exc.errors:
            print(f"config error: {line}", file=sys.stderr)
        sys.exit(1)
    if options["json-log"]:
        globalLogPublisher.addObserver(jsonFileLogObserver(open(options["json-log"], "a")))
    top = service.MultiService()
    node = Node(config, reactor)
    svc = NodeService(node, reactor, exit_on_failure=True)
    svc.ready.addErrback(lambda _failure: None)  # already logged by _failed
    svc.setServiceParent(top)  # type: ignore[no-untyped-call]
    return top
