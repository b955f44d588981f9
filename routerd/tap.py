"""``twistd routerd``: command-line options and ``makeService``."""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

from twisted.application import service
from twisted.internet import defer
from twisted.logger import ILogObserver, Logger, globalLogPublisher
from twisted.python import usage
from twisted.python.components import Componentized
from twisted.python.logfile import LogFile

from routerd import __version__
from routerd.api.channel import NodeServerFactory
from routerd.api.webui import UI_PREFIX
from routerd.catalog.catalog import CatalogError
from routerd.checking import check_config
from routerd.cluster.slave import RegistrationRefused
from routerd.config.load import ConfigError, load_config
from routerd.config.schema import Config, ServerConfig
from routerd.edge import build_site
from routerd.logs import JsonLinesObserver, fan_out, filtered, gate, parse_level, text_observer
from routerd.node import Node
from routerd.process.notify import sd_notify
from routerd.process.reload import install_sighup
from routerd.transports import lean_poll

#: Exit status of a node that must not be restarted as it is: its config is invalid or the cluster
#: refused its identity (``EX_CONFIG``; the systemd unit's ``RestartPreventExitStatus``).
EXIT_CONFIG = 78

#: How long a keep-alive connection must have been quiet since its last answer before a stop closes it.
QUIET_S = 0.1

log = Logger()


class Options(usage.Options):
    synopsis = "[--config PATH] [--check] [--json-log PATH|-] [--log-level LEVEL]"
    optParameters = [
        ["config", "c", None, "YAML config file (default: the embedded default config)"],
        ["json-log", None, None, "also write log events as flat JSON lines to this file (- : stdout, "
                                 "instead of the text log)"],
        ["log-level", None, "info", "lowest level logged: debug, info, warn, error, critical"],
    ]

    def postOptions(self) -> None:
        try:
            parse_level(self["log-level"])
        except ValueError as exc:
            raise usage.UsageError(str(exc)) from None

    def opt_version(self) -> None:
        """Print the routerd version and exit."""
        print(f"routerd {__version__}")
        sys.exit(0)
    optFlags = [["check", None, "validate the config, print ok or every error, and exit"]]


def listen_endpoint(reactor: Any, server: ServerConfig) -> Any:
    """The node's listening endpoint: ``server.bind``'s address and port, IPv6 when the host is
    one, with ``server.listen_backlog`` connections queued by the kernel before they are accepted."""
    from twisted.internet.endpoints import TCP4ServerEndpoint, TCP6ServerEndpoint

    endpoint_type = TCP6ServerEndpoint if ":" in server.host else TCP4ServerEndpoint
    return endpoint_type(reactor, server.port, backlog=server.listen_backlog, interface=server.host)


def close_listener(port: Any) -> defer.Deferred[None] | None:
    """Stop listening without resetting a connection whose client already sent its request.

    Connections the kernel completed but the reactor has not accepted yet would be reset by the
    close (their clients lose a request no node saw): every one of them is accepted first (each is
    then answered 503 draining with Retry-After), and in the same step the socket stops listening
    (``shutdown``), so a connection attempted from then on is refused, which a client knows it
    may retry.  Twisted's own ``stopListening`` closes the socket one reactor turn later and its
    accept loop takes only as many as the last turn did (down to one): the fault soak lost a
    request in that window at a master restart."""
    sock = getattr(port, "socket", None)
    if sock is not None and callable(getattr(port, "doRead", None)):
        port.numberAccepts = max(getattr(port, "numberAccepts", 1), 1 << 16)  # until the kernel has none
        port.doRead()
        try:
            sock.shutdown(socket.SHUT_RD)  # Linux: the listener closes, new connections are refused
        except OSError:  # not every system lets a listening socket be shut down: closed a turn later
            pass
    stopping: defer.Deferred[None] | None = port.stopListening()
    return stopping


def webui_address(host: str, port: int) -> str:
    """The WebUI's address a browser on this machine opens: a wildcard bind is reached on loopback."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return f"http://{f'[{host}]' if ':' in host else host}:{port}{UI_PREFIX}"


class NodeService(service.Service):
    """Opens the listener first (``/health`` answers 503 ``starting``), then starts the node
    (store, weight hashes, startup model); a stop drains before the node stops."""

    #: How long a connection between requests must have been quiet before a stop closes it.
    quiet_s = QUIET_S

    def __init__(self, node: Node, reactor: Any, exit_on_failure: bool = False) -> None:
        self.node = node
        self.reactor = reactor
        self.exit_on_failure = exit_on_failure
        self.port: Any = None
        self.connections: NodeServerFactory | None = None
        self.ready: defer.Deferred[None] = defer.Deferred()

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        defer.ensureDeferred(self._start()).addErrback(self._failed)

    async def _start(self) -> None:
        endpoint = listen_endpoint(self.reactor, self.node.config.server)
        # The lean channel's factory tracks open connections so a stop can drop them.
        self.connections = NodeServerFactory(build_site(self.node), lambda: self.node.phase)
        self.port = await endpoint.listen(self.connections)
        address = self.port.getHost()
        log.info("routerd node {node_id} ({role}) listening on http://{host}:{port} (starting)",
                 node_id=self.node.node_id, role=self.node.config.cluster.role,
                 host=address.host, port=address.port)
        await self.node.start()
        log.info("routerd node {node_id} is ready; WebUI: {webui}", node_id=self.node.node_id,
                 webui=webui_address(address.host, address.port))
        self.node.on_fatal = self._fatal
        await self.node.after_listening()
        self.ready.callback(None)
        sd_notify(f"READY=1\nSTATUS=listening on {address.host}:{address.port}")

    def _fatal(self, exc: BaseException) -> None:
        from twisted.python.failure import Failure

        self._failed(Failure(exc))

    def _failed(self, failure: Any) -> None:
        log.failure("routerd failed to start", failure=failure)
        if not self.ready.called:
            self.ready.errback(failure)
        if self.exit_on_failure and self.reactor.running:
            # A failed start (e.g. the startup model does not load) must not
            # leave a silent process behind: stop, exiting with status 1 (78 when
            # the master refused this node's identity: restarting cannot help).
            status = EXIT_CONFIG if failure.check(RegistrationRefused) else 1
            self.reactor.addSystemEventTrigger("after", "shutdown", os._exit, status)
            self.reactor.stop()

    async def _stop(self) -> None:
        """Drain: stop accepting, let in-flight requests finish (``server.drain_timeout``), then
        drop what is left and stop the node (backends, then the store)."""
        self.node.phase = "draining"
        port, self.port = self.port, None
        if port is not None:
            stopping = close_listener(port)
            if stopping is not None:
                await stopping
            if self.ready.called:
                await self.node.drain(self.node.config.server.drain_timeout)
            await self._close_connections()
        await self.node.stop()

    async def _close_connections(self, grace: float = 1.0) -> None:
        """Close the open connections, each once nothing is under way on it and what was written
        has gone out (an answer that just finished must reach its client whole); abort any still
        open after ``grace`` s.  Open keep-alive connections would otherwise go on being served.

        A connection between requests is closed once it has been quiet for :attr:`quiet_s` since
        its last answer: a client that reuses its keep-alive connection at once (a busy pool) may
        have its next request on the way, and closing under it loses that request unheard (the
        fault soak lost one so at a master restart); a request that arrives is answered (503
        draining with Retry-After).  One that has sent nothing yet is given the grace to send its
        request, answered likewise: its client connected before the listener closed (Go's
        ``http.Server.Shutdown`` gives new connections the same grace).  One mid-request is given
        the grace to finish."""
        from twisted.internet import task

        deadline = self.reactor.seconds() + grace
        closed: set[Any] = set()
        while self.connections and self.connections.protocols and self.reactor.seconds() < deadline:
            now = self.reactor.seconds()
            for connection in list(self.connections.protocols):
                if (connection not in closed and connection.between_requests()
                        and now - connection.deadline()[1] >= self.quiet_s):
                    closed.add(connection)
                    connection.close()
            await task.deferLater(self.reactor, 0.02, lambda: None)
        for connection in list(self.connections.protocols if self.connections else ()):
            connection.abort()

    def stopService(self) -> defer.Deferred[None]:
        super().stopService()  # type: ignore[no-untyped-call]
        return defer.ensureDeferred(self._stop())


class _LoggingTop(service.MultiService):
    """The top service; when twistd attaches it to its application, it hands twistd the node's log
    observer (level filter, no factory noise, JSON lines) in place of twistd's default text one."""

    def __init__(self, observer: ILogObserver | None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.observer = observer

    def setServiceParent(self, parent: Any) -> None:
        if self.observer is not None and isinstance(parent, Componentized):
            parent.setComponent(ILogObserver, self.observer)
        super().setServiceParent(parent)  # type: ignore[no-untyped-call]


def _log_observer(options: Options) -> ILogObserver | None:
    """The observer twistd should log to, or ``None`` when ``--logger`` chose one (then the JSON
    observer, if any, is added beside it)."""
    level = parse_level(options["log-level"])
    parent = getattr(options, "parent", None) or {}
    json_target = options["json-log"]
    json_observer = None
    if json_target:
        stream = sys.stdout if json_target == "-" else open(json_target, "a", encoding="utf-8")  # noqa: SIM115
        json_observer = JsonLinesObserver(stream)
    if parent.get("logger"):
        if json_observer is not None:
            globalLogPublisher.addObserver(filtered(json_observer, level))
        return None
    observers: list[ILogObserver] = []
    logfile_name = parent.get("logfile") or ""
    if logfile_name not in ("", "-"):
        observers.append(text_observer(LogFile.fromFullPath(logfile_name)))
    elif json_target != "-":
        observers.append(text_observer(sys.stdout))
    if json_observer is not None:
        observers.append(json_observer)
    gate.set(level)  # every event reaches the observers through this filter: below it, skip rendering
    return filtered(fan_out(observers), level)


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
        sys.exit(EXIT_CONFIG)
    top = _LoggingTop(_log_observer(options))
    try:
        node = Node(config, reactor)
    except CatalogError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    install_sighup(reactor, node.reloader)
    lean_poll(reactor)  # the reactor's turn without the legacy log context (routerd.transports)
    svc = NodeService(node, reactor, exit_on_failure=True)
    svc.ready.addErrback(lambda _failure: None)  # already logged by _failed
    svc.setServiceParent(top)  # type: ignore[no-untyped-call]
    return top
