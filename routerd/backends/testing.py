"""Test doubles for the backends: a launcher whose processes the test ends, and a
backend HTTP client whose readiness the test flips.  No sockets, no processes.

Also useful to other parts' unit tests (a node built on fake backends).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from twisted.internet.defer import Deferred, fail, succeed

from routerd.backends.process import ExitObservers


class FakeProcess:
    """A :class:`~routerd.backends.process.ProcessHandle` the test drives.

    ``stop()`` ends it at once with ``-15`` unless ``hold_stop`` is set, in which
    case it stays running until the test calls :meth:`exit`.
    """

    def __init__(self, argv: list[str], name: str, env: dict[str, str] | None, pid: int) -> None:
        self.argv = argv
        self.name = name
        self.env = env
        self._pid = pid
        self.output: list[str] = []
        self.stop_calls: list[float] = []
        self.hold_stop = False
        self._ended = ExitObservers()
        self._listener: Callable[[str], None] | None = None

    @property
    def port(self) -> int:
        """The value after ``--port``/``--listen-port`` in argv."""
        for flag in ("--port", "--listen-port"):
            if flag in self.argv:
                return int(self.argv[self.argv.index(flag) + 1])
        raise ValueError(f"no port in {self.argv}")

    @property
    def code(self) -> int | None:
        return self._ended.value

    @property
    def running(self) -> bool:
        return self.code is None

    @property
    def pid(self) -> int | None:
        return self._pid if self.code is None else None

    @property
    def exited(self) -> Deferred[int]:
        return self._ended.observe()

    def last_lines(self) -> list[str]:
        return self.output[-20:]

    def on_output(self, listener: Callable[[str], None] | None) -> None:
        self._listener = listener

    def print(self, *lines: str) -> None:
        """The process prints ``lines`` (each one told to the output listener, as a real one is)."""
        for line in lines:
            self.output.append(line)
            if self._listener is not None:
                self._listener(line)

    def stop(self, grace_s: float = 5.0) -> Deferred[None]:
        self.stop_calls.append(grace_s)
        done = self.exited.addCallback(lambda _: None)
        if not self.hold_stop:
            self.exit(-15)
        return done

    def exit(self, code: int, *lines: str) -> None:
        """End the process with ``code`` after printing ``lines``."""
        if self.code is not None:
            return
        self.output.extend(lines)
        self._ended.fire(code)


class FakeLauncher:
    """A :class:`~routerd.backends.process.ProcessLauncher` recording every spawn.

    Set ``error`` to make the next spawns raise it."""

    def __init__(self) -> None:
        self.spawned: list[FakeProcess] = []
        self.error: Exception | None = None
        self._next_pid = 1000

    def spawn(self, argv: list[str], name: str, env: dict[str, str] | None = None) -> FakeProcess:
        if self.error is not None:
            raise self.error
        self._next_pid += 1
        process = FakeProcess(list(argv), name, env, self._next_pid)
        self.spawned.append(process)
        return process

    @property
    def running(self) -> list[FakeProcess]:
        return [p for p in self.spawned if p.running]


class FakeResponse:
    def __init__(self, code: int, body: bytes) -> None:
        self.code = code
        self._body = body

    def content(self) -> Deferred[bytes]:
        return succeed(self._body)

    def json(self) -> Deferred[Any]:
        return succeed(json.loads(self._body))


class FakeBackendHTTP:
    """Answers readiness probes like llama-server, sd-server and whisper-server.

    A port in ``ready`` answers 200 with a model listed (``ids[port]``, default
    ``"model"``); a port in ``listening`` answers 503 (loading); anything else
    refuses the connection.  ``pending`` makes every probe hang (a stuck backend).
    Every requested URL is recorded in ``requests`` with the time ``clock()`` gave.
    """

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self.ready: set[int] = set()
        self.listening: set[int] = set()
        self.ids: dict[int, str] = {}
        self.pending = False
        self.requests: list[tuple[float, str]] = []
        self._clock = clock or (lambda: 0.0)
        #: KoboldCpp: the ``/api/extra/version`` body per port (default: no capabilities).
        self.versions: dict[int, dict[str, Any]] = {}
        #: Ports whose probes time out (a hung backend); the others still answer.
        self.hung: set[int] = set()
        #: ``(url, body)`` of every POST; ``post_answer`` is the (code, body) they get.
        self.posts: list[tuple[str, bytes]] = []
        self.post_answer: tuple[int, bytes] = (200, b'{"success": true}')

    def post(self, url: str, *, data: bytes, headers: Any = None,
             timeout: float | None = None) -> Deferred[Any]:
        self.posts.append((url, data))
        port = urlsplit(url).port or 80
        if port not in self.ready and port not in self.listening:
            return fail(ConnectionRefusedError(url))
        return succeed(FakeResponse(*self.post_answer))

    def get(self, url: str, *, timeout: float | None = None) -> Deferred[Any]:
        self.requests.append((self._clock(), url))
        if self.pending:
            return Deferred()
        parts = urlsplit(url)
        port = parts.port or 80
        if port in self.hung:
            return fail(TimeoutError(url))
        if port in self.ready:
            model = self.ids.get(port, "model")
            if parts.path == "/api/extra/version":
                return succeed(FakeResponse(200, json.dumps(self.versions.get(port, {})).encode()))
            return succeed(FakeResponse(200, json.dumps(self._body(parts.path, model)).encode()))
        if port in self.listening:
            return succeed(FakeResponse(503, b'{"error": "loading model"}'))
        return fail(ConnectionRefusedError(url))

    @staticmethod
    def _body(path: str, model: str) -> Any:
        if path == "/sdapi/v1/sd-models":
            return [{"title": model, "model_name": model}]
        if path == "/health":
            return {"status": "ok"}
        return {"object": "list", "data": [{"id": model, "object": "model"}]}


class PortCounter:
    """A deterministic ``port_allocator``: 41001, 41002, …"""

    def __init__(self, first: int = 41001) -> None:
        self.next = first

    def __call__(self) -> int:
        port = self.next
        self.next += 1
        return port
