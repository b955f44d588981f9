"""Backend process supervision: find a backend program, start it, watch it, stop it.

The runtime slots never touch ``reactor.spawnProcess`` themselves; they talk to a
:class:`ProcessLauncher`, so unit tests can hand them a fake that records argv
and lets the test decide when a process "exits".
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from twisted.internet.defer import Deferred, succeed
from twisted.internet.error import ProcessExitedAlready
from twisted.internet.protocol import ProcessProtocol
from twisted.python.failure import Failure

from routerd.backends.errors import BackendMissing
from routerd.logs import QuickLogger, gate, literal

log = QuickLogger()

#: How many of a backend's last output lines are kept for error reasons.
TAIL_LINES = 20
#: A partial line longer than this is logged as it is (a backend that never ends its lines).
_MAX_PARTIAL_LINE = 64 * 1024


class Scheduler(Protocol):
    """The part of the reactor the backends need for time (``task.Clock`` fits)."""

    def seconds(self) -> float: ...

    def callLater(  # noqa: N802 - Twisted's name
        self, delay: float, callable: Callable[..., Any], *args: Any, **kw: Any
    ) -> Any: ...


class SpawningReactor(Scheduler, Protocol):
    """A reactor that can also start processes (``IReactorProcess``)."""

    def spawnProcess(  # noqa: N802 - Twisted's name
        self,
        processProtocol: Any,  # noqa: N803
        executable: str,
        args: Sequence[str],
        env: dict[str, str] | None = None,
        path: str | None = None,
        uid: int | None = None,
        gid: int | None = None,
        usePTY: bool = False,  # noqa: N803
        childFDs: dict[int, Any] | None = None,  # noqa: N803
    ) -> Any: ...


class ProcessHandle(Protocol):
    """One started backend process."""

    @property
    def pid(self) -> int | None:
        """The OS process id (``None`` once the process is gone, or unknown)."""
        ...

    @property
    def exited(self) -> Deferred[int]:
        """Fires once the process has ended, with its exit code, or ``-signal``
        when a signal ended it.  Each access returns a fresh Deferred, so any
        number of observers can wait without disturbing one another's result."""
        ...

    def stop(self, grace_s: float = 5.0) -> Deferred[None]:
        """SIGTERM now, SIGKILL if still running after ``grace_s``; fires when
        the process has ended (at once if it already has)."""
        ...

    def last_lines(self) -> list[str]:
        """The process's last output lines (stdout and stderr interleaved)."""
        ...

    def on_output(self, listener: Callable[[str], None] | None) -> None:
        """Call ``listener(line)`` with each output line from now on (``None``: stop); one listener
        at a time, a new one replaces the last."""
        ...


class ProcessLauncher(Protocol):
    def spawn(self, argv: list[str], name: str, env: dict[str, str] | None = None) -> ProcessHandle:
        """Start ``argv`` (``argv[0]`` already resolved); ``name`` labels its log
        lines; ``env`` None means the router's own environment."""
        ...


def describe_exit(code: int) -> str:
    """``exit code 1`` / ``signal 9`` for a value fired by :attr:`ProcessHandle.exited`."""
    return f"signal {-code}" if code < 0 else f"exit code {code}"


def resolve_command(
    command: Sequence[str],
    setting: str = "llama.binary_path",
    *,
    search_path: str | None = None,
    executable: str | None = None,
) -> list[str]:
    """Turn a configured command (``BinaryConfig.command``) into an argv prefix.

    The first element, unless it is an absolute path, is looked up on ``PATH``
    (``search_path`` overrides it) and then in the directory of the running
    Python (``executable``, default ``sys.executable``), so a venv's console
    scripts (``routerd-sim``) are found when ``.venv/bin/twistd`` runs without an
    activated venv.  Raises :class:`BackendMissing` naming ``setting`` when the
    program is not found or not executable.
    """
    if not command or not command[0]:
        raise BackendMissing(f"no backend binary configured (set {setting})")
    first = command[0]
    if os.path.isabs(first):
        found: str | None = first if _is_executable(first) else None
    else:
        found = shutil.which(first, path=search_path)
        if found is None:
            here = os.path.dirname(os.path.abspath(executable or sys.executable))
            found = shutil.which(first, path=here)
    if found is None:
        raise BackendMissing(f"backend binary {first!r} not found (set {setting})")
    return [found, *command[1:]]


def _is_executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def free_port(host: str = "127.0.0.1") -> int:
    """A currently free TCP port on ``host`` (bind to port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


class ExitObservers:
    """Fan one eventual value out to any number of Deferreds."""

    def __init__(self) -> None:
        self._waiting: list[Deferred[int]] = []
        self.value: int | None = None

    def observe(self) -> Deferred[int]:
        if self.value is not None:
            return succeed(self.value)
        d: Deferred[int] = Deferred()
        self._waiting.append(d)
        return d

    def fire(self, value: int) -> None:
        self.value = value
        waiting, self._waiting = self._waiting, []
        for d in waiting:
            d.callback(value)


class _BackendProtocol(ProcessProtocol):
    """Logs every output line under the backend's name and keeps the last few."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._label = name + ": "  # each line is logged as "name: line"
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.ended = ExitObservers()
        self._partial: dict[int, bytes] = {}
        self.listener: Callable[[str], None] | None = None

    def connectionMade(self) -> None:  # noqa: N802 - Twisted's name
        transport: Any = self.transport
        transport.closeStdin()

    def childDataReceived(self, childFD: int, data: bytes) -> None:  # noqa: N802, N803
        if b"\r" in data:
            data = data.replace(b"\r", b"\n")
        buf = self._partial.get(childFD, b"") + data
        *lines, rest = buf.split(b"\n")
        if rest and len(rest) > _MAX_PARTIAL_LINE:
            lines.append(rest)
            rest = b""
        self._partial[childFD] = rest
        for raw in lines:
            self._line(raw)

    def _line(self, raw: bytes) -> None:
        line = raw.decode("utf-8", errors="replace").rstrip()
        if not line:
            return
        self.tail.append(line)
        listener = self.listener
        if listener is not None:
            try:
                listener(line)
            except Exception:
                log.failure("{backend}: output listener failed", backend=self.name)
        # one or more lines per request from a backend: rendered once (see routerd.logs.literal),
        # and not at all when info is below the node's --log-level (the tail keeps it anyway)
        if gate.info:
            log.info(literal(self._label + line), backend=self.name, line=line)

    def processEnded(self, reason: Failure) -> None:  # noqa: N802 - Twisted's name
        for fd in sorted(self._partial):
            self._line(self._partial[fd])
        self._partial.clear()
        exit_code = getattr(reason.value, "exitCode", None)
        sig = getattr(reason.value, "signal", None)
        if exit_code is not None:
            code = int(exit_code)
        elif sig is not None:
            code = -int(sig)
        else:
            code = -1
        log.info("{backend}: process ended ({how})", backend=self.name, how=describe_exit(code))
        self.ended.fire(code)


class ReactorProcess:
    """:class:`ProcessHandle` over a ``reactor.spawnProcess`` transport."""

    def __init__(self, reactor: Scheduler, transport: Any, protocol: _BackendProtocol) -> None:
        self._reactor = reactor
        self._transport = transport
        self._protocol = protocol
        self._pid: int | None = transport.pid
        self._kill_call: Any = None

    @property
    def pid(self) -> int | None:
        return None if self._protocol.ended.value is not None else self._pid

    @property
    def exited(self) -> Deferred[int]:
        return self._protocol.ended.observe()

    def last_lines(self) -> list[str]:
        return list(self._protocol.tail)

    def on_output(self, listener: Callable[[str], None] | None) -> None:
        self._protocol.listener = listener

    def stop(self, grace_s: float = 5.0) -> Deferred[None]:
        if self._protocol.ended.value is not None:
            return succeed(None)
        done: Deferred[None] = self.exited.addCallback(lambda _: None)
        if self._kill_call is None:
            self._signal("TERM")
            self._kill_call = self._reactor.callLater(grace_s, self._signal, "KILL")
            self._protocol.ended.observe().addCallback(self._cancel_kill)
        return done

    def _cancel_kill(self, code: int) -> int:
        if self._kill_call is not None and self._kill_call.active():
            self._kill_call.cancel()
        return code

    def _signal(self, sig: str) -> None:
        if self._protocol.ended.value is not None:
            return
        if sig == "KILL":
            log.warn("{backend}: still running after SIGTERM, sending SIGKILL", backend=self._protocol.name)
        try:
            self._transport.signalProcess(sig)
        except ProcessExitedAlready:
            pass


class ReactorProcessLauncher:
    """The real :class:`ProcessLauncher`: ``reactor.spawnProcess``."""

    def __init__(self, reactor: SpawningReactor) -> None:
        self._reactor = reactor

    def spawn(self, argv: list[str], name: str, env: dict[str, str] | None = None) -> ReactorProcess:
        protocol = _BackendProtocol(name)
        environment = dict(os.environ) if env is None else dict(env)
        log.info("{backend}: starting {argv}", backend=name, argv=" ".join(argv))
        transport = self._reactor.spawnProcess(protocol, argv[0], argv, env=environment)
        return ReactorProcess(self._reactor, transport, protocol)
