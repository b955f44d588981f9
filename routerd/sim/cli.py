"""``routerd-sim FAMILY [flags]``: run one simulated backend process."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import attrs
from klein import Klein
from twisted.logger import (
    FilteringLogObserver,
    Logger,
    LogLevel,
    LogLevelFilterPredicate,
    globalLogBeginner,
)
from twisted.web.server import Site

from routerd.families import every_family
from routerd.logs import text_observer
from routerd.sim.control import Knobs
from routerd.sim.families import Family, get_family, programs
from routerd.sim.flags import SIM_FLAGS, parse_flags
from routerd.sim.runtime import Clock, SimRuntime
from routerd.sim.weights import WeightsError, load_weights

__all__ = ["SimServer", "StartupError", "main", "make_server"]

log = Logger()

#: Time a crashing process keeps running so the last answer reaches its client.
EXIT_GRACE_S = 0.1


class StartupError(Exception):
    """The process cannot start; ``code`` is its exit status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@attrs.define
class SimServer:
    family: Family
    host: str
    port: int
    runtime: SimRuntime
    app: Klein


def usage() -> str:
    # the programs in the order the backend families name them, then any other by name
    named = [program for family in every_family() for program in family.simulators.values()]
    names = " | ".join(sorted(programs(), key=lambda n: (named.index(n) if n in named else len(named), n)))
    return f"usage: routerd-sim FAMILY [flags of the real binary]\n  FAMILY: {names}\n"


def make_server(
    argv: Sequence[str],
    *,
    clock: Clock,
    on_exit: Callable[[int], None],
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> SimServer:
    """Parse ``FAMILY [flags]``, read the weights and build the (not yet listening) server.

    Raises ``StartupError`` for an unknown or unimplemented family (2) or unusable weights (1);
    argparse raises ``SystemExit`` for bad flags.
    """
    errors = err if err is not None else sys.stderr
    if not argv:
        raise StartupError(2, usage())
    name, rest = argv[0], argv[1:]
    family = get_family(name)
    if family is None:
        raise StartupError(2, f"routerd-sim: unknown backend family {name!r}\n{usage()}")
    if family.build is None or family.kind is None:
        raise StartupError(2, f"routerd-sim: {name}: not implemented yet")
    if family.prepare is not None:
        rest = family.prepare(rest)
    ns, ignored = parse_flags(f"routerd-sim {name}", rest, family.flags + SIM_FLAGS, family.validate)
    for token in ignored:
        errors.write(f"warning: {name}: ignoring unsupported argument: {token}\n")
    errors.flush()
    if family.initial is None and not ns.model:
        raise StartupError(1, f"error: {name}: no model given (use -m PATH)")
    try:
        if family.initial is not None:
            weights, weights_path = family.initial(ns)
        else:
            weights, weights_path = load_weights(ns.model, family.kind), ns.model
    except WeightsError as exc:
        raise StartupError(1, f"error: {name}: failed to load model: {exc}") from None
    knobs = Knobs(
        fail_next_load=ns.sim_fail_load,
        crash_after=ns.sim_crash_after,
        slowdown=ns.sim_slowdown,
        hang=ns.sim_hang,
    )
    runtime = SimRuntime(
        family=name, weights=weights, weights_path=weights_path, clock=clock, on_exit=on_exit,
        knobs=knobs, time_scale=ns.sim_time_scale, slots=family.slots(ns), out=out, err=err,
    )
    return SimServer(family, ns.host, ns.port, runtime, family.build(runtime, ns))


def _start_logging() -> None:
    # twisted.logger's observers are zope interfaces, which mypy cannot check without a plugin.
    text: Any = text_observer(sys.stderr)
    level: Any = LogLevelFilterPredicate(defaultLogLevel=LogLevel.info)
    observer: Any = FilteringLogObserver(text, [level])
    globalLogBeginner.beginLoggingTo([observer], redirectStandardIO=False)


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit status (0 after SIGTERM/SIGINT)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        sys.stdout.write(usage())
        return 0
    from twisted.internet import reactor as global_reactor

    reactor: Any = global_reactor  # the reactor's interfaces are zope ones, opaque to mypy
    listening_ports: list[Any] = []

    def on_exit(code: int) -> None:
        for listening in listening_ports:
            listening.stopListening()
        reactor.callLater(EXIT_GRACE_S, reactor.stop)

    try:
        server = make_server(args, clock=reactor, on_exit=on_exit)
    except StartupError as exc:
        sys.stderr.write(str(exc).rstrip("\n") + "\n")
        return exc.code
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    _start_logging()
    make_site: Any = Site  # untyped in twisted.web
    site = make_site(server.app.resource())

    def listen() -> bool:
        try:
            listening = reactor.listenTCP(server.port, site, interface=server.host)
        except Exception as exc:  # CannotListenError and friends
            sys.stderr.write(f"error: couldn't bind HTTP server socket, {server.host}:{server.port}: {exc}\n")
            return False
        listening_ports.append(listening)
        bound_port = getattr(listening.getHost(), "port", server.port)
        server.runtime.say(f"main: server is listening on http://{server.host}:{bound_port}")
        return True

    def listen_once_loaded(loaded: bool) -> None:
        if loaded and not listen():
            server.runtime.exit(1)

    if server.family.listens_when_loaded:
        reactor.callWhenRunning(lambda: server.runtime.start().addCallback(listen_once_loaded))
    else:
        if not listen():
            return 1
        reactor.callWhenRunning(server.runtime.start)
    reactor.run()
    return server.runtime.exit_code or 0
