"""One runtime slot: the backend process of one runtime kind and the config it holds.

Semantics (reference cluster.md §7.4):

* A request for the loaded config joins at once when no switch is under way
  and nobody waits in the queue.
* Anything else queues, strictly FIFO.  The head of the queue is served when it
  can be: a request for the loaded config joins; a request for another config
  waits until the users of the current one reach 0, then the slot switches
  (stop the process, start the new one, poll readiness).  When a load
  completes, every queued request for that config joins it.
* A failed load (spawn error, missing binary, process exit during the load,
  readiness deadline) fails the requests queued for that config with
  :class:`LoadFailed` and leaves the slot without a config (state ``failed``);
  the next request tries again.
* A ready process that exits without being asked to → ``dead`` (reason kept);
  its leases are detached and the next request loads again.
* ``unload`` queues like a request, waits for the users to drain, stops the
  process and leaves the slot ``empty``.

Every load is timed on the injected clock, from the moment the switch is
granted (before the old process is stopped) until readiness or failure, and
reported through ``on_load``.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import attrs
from twisted.internet.defer import Deferred, fail, gatherResults, succeed
from twisted.logger import Logger

from routerd.backends.errors import LoadFailed, RuntimeClosed, with_output
from routerd.backends.process import ProcessHandle, ProcessLauncher, Scheduler, describe_exit
from routerd.catalog.model import ModelConfig, RuntimeKind

log = Logger()

#: Overall deadline of one load, from switch start to readiness.
LOAD_TIMEOUT_S = 15 * 60.0
POLL_INITIAL_S = 0.05
POLL_FACTOR = 1.5
POLL_MAX_S = 0.5
STOP_GRACE_S = 5.0
#: How long an in-process switch (KoboldCpp reload_config) may take to come back live.
RELOAD_TIMEOUT_S = 90.0


class InvalidTransition(RuntimeError):
    """A bug: the slot tried a state change its transition table forbids."""


class SlotState(enum.Enum):
    EMPTY = "empty"  # no process, no config
    SWITCHING = "switching"  # switch granted, stopping the previous process
    LOADING = "loading"  # process started, polling readiness
    READY = "ready"  # serving its config
    STOPPING = "stopping"  # unload: stopping the process
    FAILED = "failed"  # the last load failed; no process, no config
    DEAD = "dead"  # the ready process exited on its own; no process
    CLOSED = "closed"  # stopped for good (service shutdown)


S = SlotState
#: Every legal state change.  ``_set_state`` refuses anything else, so a
#: scheduling bug shows up as an exception instead of a slot stuck in limbo.
TRANSITIONS: Mapping[SlotState, frozenset[SlotState]] = {
    S.EMPTY: frozenset({S.LOADING, S.CLOSED}),
    S.FAILED: frozenset({S.LOADING, S.EMPTY, S.CLOSED}),
    S.DEAD: frozenset({S.LOADING, S.EMPTY, S.CLOSED}),
    S.READY: frozenset({S.SWITCHING, S.STOPPING, S.DEAD, S.CLOSED}),
    S.SWITCHING: frozenset({S.LOADING, S.CLOSED}),
    S.LOADING: frozenset({S.READY, S.FAILED, S.CLOSED}),
    S.STOPPING: frozenset({S.EMPTY, S.CLOSED}),
    S.CLOSED: frozenset(),
}
#: States in which the slot is between operations and may start the next one.
_IDLE = frozenset({S.EMPTY, S.READY, S.FAILED, S.DEAD})


@attrs.frozen
class LoadEvent:
    kind: RuntimeKind
    model_id: str
    config_filename: str
    duration_ms: int
    ok: bool
    reason: str = ""


@attrs.frozen
class SlotStatus:
    kind: RuntimeKind
    state: str
    model_id: str | None
    config_filename: str | None
    users: int
    waiters: int
    pid: int | None
    port: int | None
    last_error: str | None
    last_load_ms: int | None
    #: ``seconds()`` of the injected clock when the slot entered ``state``.
    since: float

    def to_json(self) -> dict[str, Any]:
        """Wire form (snake_case, times in integer milliseconds)."""
        return {
            "kind": self.kind,
            "state": self.state,
            "model_id": self.model_id,
            "config_filename": self.config_filename,
            "users": self.users,
            "waiters": self.waiters,
            "pid": self.pid,
            "port": self.port,
            "last_error": self.last_error,
            "last_load_ms": self.last_load_ms,
            "since_ms": int(self.since * 1000),
        }


class RuntimeLease:
    """The right to send requests to a ready backend until :meth:`release`."""

    def __init__(self, kind: RuntimeKind, model: ModelConfig | None, port: int,
                 release: Callable[[], None]) -> None:
        self.kind = kind
        self.model = model
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self._release: Callable[[], None] | None = release

    @property
    def released(self) -> bool:
        return self._release is None

    def release(self) -> None:
        """Give the slot back; calling it again does nothing."""
        release, self._release = self._release, None
        if release is not None:
            release()

    def __repr__(self) -> str:
        held = self.model.local_id if self.model is not None else "-"
        return f"<RuntimeLease {self.kind} {held} {self.base_url}>"


def config_key(model: ModelConfig) -> tuple[str, str]:
    """Two configs are "the same config" when file name and content hash match."""
    return (model.filename, model.config_hash)


@attrs.define(eq=False)
class _Waiter:
    config: ModelConfig | None  # None: an unload
    deferred: Deferred[Any]
    idle_after: bool = True  # an unload: restart without a model (KoboldCpp --nomodel) afterwards


@attrs.define(eq=False)
class _Attempt:
    config: ModelConfig
    started: float
    poll_delay: float
    port: int | None = None
    process: ProcessHandle | None = None
    poll_call: Any = None
    deadline_call: Any = None
    finished: bool = False


def _fire(d: Deferred[Any], value: Any) -> None:
    if not d.called:  # a waiter popped for service may have been cancelled meanwhile
        d.callback(value)


def _fail(d: Deferred[Any], error: Exception) -> None:
    if not d.called:
        d.errback(error)


class RuntimeSlot:
    """One runtime kind's process and config.

    The state machine is a small enum with an explicit transition table rather
    than an Automat machine: the slot's behaviour depends as much on its data
    (queue head, user count, settling stop) as on its state, every input would
    need a guard in Automat, and the table plus ``_set_state`` already makes an
    illegal change fail loudly while ``status()`` reads the state directly.
    """

    def __init__(
        self,
        kind: RuntimeKind,
        *,
        clock: Scheduler,
        launcher: ProcessLauncher,
        argv_for: Callable[[ModelConfig, int], list[str]],
        probe: Callable[[str], Deferred[bool]],
        port_allocator: Callable[[], int],
        on_load: Callable[[LoadEvent], None] | None = None,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        load_timeout_s: float = LOAD_TIMEOUT_S,
        stop_grace_s: float = STOP_GRACE_S,
        poll_initial_s: float = POLL_INITIAL_S,
        poll_factor: float = POLL_FACTOR,
        poll_max_s: float = POLL_MAX_S,
        reload: Callable[[ModelConfig, int], Deferred[None]] | None = None,
        reload_timeout_s: float = RELOAD_TIMEOUT_S,
        idle_argv: Callable[[int], list[str]] | None = None,
    ) -> None:
        self.kind: RuntimeKind = kind
        self.name = name or kind
        self._clock = clock
        self._launcher = launcher
        self._argv_for = argv_for
        self._probe = probe
        self._port_allocator = port_allocator
        self._on_load = on_load
        self._env = dict(env) if env is not None else None
        self._load_timeout_s = load_timeout_s
        self._stop_grace_s = stop_grace_s
        self._poll_initial_s = poll_initial_s
        self._poll_factor = poll_factor
        self._poll_max_s = poll_max_s
        # A backend that switches configs in its running process (KoboldCpp's reload_config)
        # and one that idles without a model (``--nomodel``) instead of being stopped.
        self._reload = reload
        self._reload_timeout_s = reload_timeout_s
        self._idle_argv = idle_argv

        self._state = S.EMPTY
        self._since = clock.seconds()
        self._config: ModelConfig | None = None  # held, being loaded, or (dead) last held
        self._process: ProcessHandle | None = None  # the process we expect to keep running
        self._port: int | None = None
        self._users = 0
        self._generation = 0  # bumped whenever the leases handed out so far stop counting
        self._queue: deque[_Waiter] = deque()
        self._attempt: _Attempt | None = None
        self._settling: Deferred[Any] | None = None  # stopping a failed process before the next load
        self._stopping: set[Deferred[None]] = set()  # every stop under way (close waits for them)
        self._last_error: str | None = None
        self._last_load_ms: int | None = None
        self._hold = 0
        self._pump_pending = False

    # -- public API ---------------------------------------------------------

    @property
    def state(self) -> SlotState:
        return self._state

    @property
    def closed(self) -> bool:
        return self._state is S.CLOSED

    @property
    def has_process(self) -> bool:
        """Whether a backend process is running for this slot (read per request: no status built)."""
        process = self._process
        return process is not None and process.pid is not None

    def loaded_config(self) -> ModelConfig | None:
        """The config the slot is ready with, else ``None``."""
        return self._config if self._state is S.READY else None

    def acquire(self, model: ModelConfig) -> Deferred[RuntimeLease]:
        """A lease on a ready backend for ``model``, loading or switching if needed.

        Cancelling the returned Deferred while it waits removes the request
        from the queue; a load it started carries on for whoever else wants it.
        """
        if self._state is S.CLOSED:
            return fail(RuntimeClosed(f"{self.name} runtime is stopped"))
        if self._state is S.READY and not self._queue and self._holds(model):
            return succeed(self._lease())
        d: Deferred[RuntimeLease] = Deferred(self._cancel_waiter)
        self._queue.append(_Waiter(model, d))
        self._pump()
        return d

    def load(self, model: ModelConfig) -> Deferred[None]:
        """Make ``model`` the loaded config (acquire, then release at once)."""
        return self.acquire(model).addCallback(lambda lease: lease.release())

    def lease_current(self) -> RuntimeLease | None:
        """A lease on whatever runs now, loading nothing (reference §6.7: a selector-less request
        passes through to the running backend): the ready config (counted as a user, so a switch
        waits for it) or a process started without a model (KoboldCpp ``--nomodel``, nothing to
        count); ``None`` when no process serves or the slot is busy switching or queued."""
        if self._state is S.READY and not self._queue:
            return self._lease()
        if self._state is S.EMPTY and self._process is not None and self._port is not None:
            return RuntimeLease(self.kind, None, self._port, lambda: None)
        return None

    def unload(self, *, idle_after: bool = True) -> Deferred[None]:
        """Wait for the users to drain, stop the process, leave the slot empty.  A backend that
        idles without a model restarts that way unless ``idle_after`` is false (a family switch:
        its process must be gone)."""
        if self._state is S.CLOSED:
            return succeed(None)
        d: Deferred[None] = Deferred(self._cancel_waiter)
        self._queue.append(_Waiter(None, d, idle_after))
        self._pump()
        return d

    def start_idle(self) -> None:
        """Start the backend with no model (KoboldCpp ``--nomodel``) so the first load is an
        in-process switch; does nothing without an idle command or when a process runs."""
        if self._idle_argv is None or self._process is not None or self._state is not S.EMPTY:
            return
        try:
            port = self._port_allocator()
            handle = self._launcher.spawn(self._idle_argv(port), self.name, self._env)
        except Exception as e:
            log.error("{backend}: could not start without a model: {error}", backend=self.name, error=str(e))
            self._last_error = f"{self.name} could not start without a model: {e}"
            return
        self._port = port
        self._process = handle
        handle.exited.addCallback(self._on_exit, handle)

    def close(self) -> Deferred[None]:
        """Service shutdown: fail every waiter, stop the process now (users are
        not waited for); fires once the process is gone.  The slot stays closed."""
        if self._state is S.CLOSED:
            return succeed(None)
        attempt = self._attempt
        if attempt is not None and not attempt.finished:
            self._finish(attempt)
            self._report(attempt, ok=False, reason=f"{self.name} runtime stopped during the load")
        if self._process is not None:
            self._stop_process(self._process)
            self._process = None
        stops = list(self._stopping)
        waiters = list(self._queue)
        self._queue.clear()
        self._generation += 1
        self._users = 0
        self._config = None
        self._set_state(S.CLOSED)
        for w in waiters:
            _fail(w.deferred, RuntimeClosed(f"{self.name} runtime is stopped"))
        return gatherResults(stops, consumeErrors=True).addBoth(lambda _: None)

    def status(self) -> SlotStatus:
        process = self._process
        return SlotStatus(
            kind=self.kind,
            state=self._state.value,
            model_id=self._config.local_id if self._config else None,
            config_filename=self._config.filename if self._config else None,
            users=self._users,
            waiters=sum(1 for w in self._queue if w.config is not None),
            pid=process.pid if process is not None else None,
            port=self._port if process is not None else None,
            last_error=self._last_error,
            last_load_ms=self._last_load_ms,
            since=self._since,
        )

    # -- scheduling ---------------------------------------------------------

    def _holds(self, model: ModelConfig) -> bool:
        return self._config is not None and config_key(self._config) == config_key(model)

    def _set_state(self, new: SlotState) -> None:
        if new not in TRANSITIONS[self._state]:
            raise InvalidTransition(f"{self.name}: {self._state.value} -> {new.value}")
        self._state = new
        self._since = self._clock.seconds()

    def _lease(self) -> RuntimeLease:
        assert self._config is not None and self._port is not None
        self._users += 1
        generation = self._generation
        return RuntimeLease(self.kind, self._config, self._port, lambda: self._release(generation))

    def _release(self, generation: int) -> None:
        if generation != self._generation:
            return  # a lease on a process that died or was replaced: nothing to count
        self._users -= 1
        if self._users == 0:
            self._pump()

    def _cancel_waiter(self, d: Deferred[Any]) -> None:
        for w in self._queue:
            if w.deferred is d:
                self._queue.remove(w)
                break
        self._pump()  # the head may have gone: whoever is next can proceed

    @contextmanager
    def _holding_pump(self) -> Iterator[None]:
        """Fire Deferreds without letting their callbacks re-enter scheduling;
        a pump they ask for runs once this block is done."""
        self._hold += 1
        try:
            yield
        finally:
            self._hold -= 1
        if self._hold == 0 and self._pump_pending:
            self._pump()

    def _pump(self) -> None:
        self._pump_pending = True
        if self._hold:
            return
        with self._holding_pump():
            while self._pump_pending:
                self._pump_pending = False
                self._serve_queue()

    def _serve_queue(self) -> None:
        while self._queue and self._settling is None and self._state in _IDLE:
            head = self._queue[0]
            if head.config is None:  # unload
                if self._state is S.READY:
                    if self._users:
                        return
                    self._queue.popleft()
                    self._begin_unload(head.deferred, head.idle_after)
                    return
                self._queue.popleft()
                idle = self._process
                if idle is not None and self._state is S.EMPTY and not head.idle_after:
                    # a process without a model (--nomodel): stop it too, hold the queue till gone
                    self._process = None
                    self._port = None
                    stopping = self._stop_process(idle)
                    self._settle(stopping)
                    done: Deferred[None] = head.deferred

                    def stopped(_: object, done: Deferred[None] = done) -> None:
                        _fire(done, None)

                    stopping.addBoth(stopped)
                    return
                if self._state is not S.EMPTY:
                    self._config = None
                    self._set_state(S.EMPTY)
                _fire(head.deferred, None)
                continue
            if self._state is S.READY and self._holds(head.config):
                self._queue.popleft()
                _fire(head.deferred, self._lease())
                continue
            if self._state is S.READY and self._users:
                return  # switch waits for the current users to finish
            self._begin_load(head.config)
            return

    # -- unload -------------------------------------------------------------

    def _begin_unload(self, d: Deferred[None], idle_after: bool = True) -> None:
        process = self._process
        self._process = None
        self._generation += 1
        self._set_state(S.STOPPING)
        stopped = self._stop_process(process) if process is not None else succeed(None)

        def done(_: object) -> None:
            if self._state is S.STOPPING:
                self._config = None
                self._port = None
                self._set_state(S.EMPTY)
                if idle_after:
                    self.start_idle()  # KoboldCpp: unloading restarts it with --nomodel
            _fire(d, None)
            self._pump()

        stopped.addBoth(done)

    # -- loading ------------------------------------------------------------

    def _begin_load(self, config: ModelConfig) -> None:
        attempt = _Attempt(config, self._clock.seconds(), self._poll_initial_s)
        self._attempt = attempt
        self._generation += 1
        self._config = config
        old = self._process
        if old is not None and self._reload is not None and self._port is not None:
            self._switch_in_process(attempt, old, self._port)
            return
        self._process = None
        if old is not None:
            log.info(
                "{backend}: switching to {model}",
                backend=self.name,
                model=config.local_id,
            )
            self._set_state(S.SWITCHING)
            self._stop_process(old).addBoth(lambda _: self._spawn(attempt))
        else:
            self._spawn(attempt)

    def _switch_in_process(self, attempt: _Attempt, process: ProcessHandle, port: int) -> None:
        """Ask the running backend to load ``attempt.config`` itself, then poll until it is live
        again (at most ``reload_timeout_s``); a refused or failed reload fails the load."""
        assert self._reload is not None
        log.info("{backend}: reloading with {model}", backend=self.name, model=attempt.config.local_id)
        if self._state is S.READY:
            self._set_state(S.SWITCHING)
        self._set_state(S.LOADING)
        attempt.port = port
        attempt.process = process
        attempt.deadline_call = self._clock.callLater(self._reload_timeout_s, self._load_timed_out, attempt)
        try:
            reloading = self._reload(attempt.config, port)
        except Exception as e:
            reloading = fail(e)

        def reloaded(_: object) -> None:
            if not attempt.finished:
                attempt.poll_call = self._clock.callLater(attempt.poll_delay, self._poll, attempt)

        def refused(failure: Any) -> None:
            if not attempt.finished:
                reason = f"{self.name} could not reload with {attempt.config.local_id!r}: {failure.value}"
                self._load_failed(attempt, reason)

        reloading.addCallbacks(reloaded, refused)

    def _spawn(self, attempt: _Attempt) -> None:
        if attempt is not self._attempt or attempt.finished:
            return  # closed while the previous process was stopping
        self._set_state(S.LOADING)
        config = attempt.config
        try:
            port = self._port_allocator()
            argv = self._argv_for(config, port)
            handle = self._launcher.spawn(argv, self.name, self._env)
        except Exception as e:
            self._load_failed(attempt, f"{self.name} for {config.local_id!r} could not start: {e}")
            return
        attempt.port = port
        attempt.process = handle
        self._port = port
        self._process = handle
        attempt.deadline_call = self._clock.callLater(self._load_timeout_s, self._load_timed_out, attempt)
        attempt.poll_call = self._clock.callLater(attempt.poll_delay, self._poll, attempt)
        handle.exited.addCallback(self._on_exit, handle)

    def _poll(self, attempt: _Attempt) -> None:
        attempt.poll_call = None
        if attempt.finished or attempt.port is None:
            return
        try:
            probing = self._probe(f"http://127.0.0.1:{attempt.port}")
        except Exception:
            log.failure("{backend}: readiness probe raised", backend=self.name)
            probing = succeed(False)
        probing.addErrback(lambda _: False).addCallback(self._polled, attempt)

    def _polled(self, ready: bool, attempt: _Attempt) -> None:
        if attempt.finished:
            return
        if ready:
            self._load_succeeded(attempt)
            return
        attempt.poll_delay = min(attempt.poll_delay * self._poll_factor, self._poll_max_s)
        attempt.poll_call = self._clock.callLater(attempt.poll_delay, self._poll, attempt)

    def _load_timed_out(self, attempt: _Attempt) -> None:
        attempt.deadline_call = None
        if attempt.finished:
            return
        lines = attempt.process.last_lines() if attempt.process is not None else []
        reason = with_output(
            f"{self.name} for {attempt.config.local_id!r} not ready after {self._load_timeout_s:g}s", lines
        )
        self._load_failed(attempt, reason)

    def _on_exit(self, code: int, handle: ProcessHandle) -> int:
        if handle is not self._process:
            return code  # we stopped it (switch, unload, failed load, close)
        self._process = None
        attempt = self._attempt
        if self._state is S.LOADING and attempt is not None and attempt.process is handle:
            how = describe_exit(code)
            reason = with_output(
                f"{self.name} for {attempt.config.local_id!r} exited with {how} during the load",
                handle.last_lines(),
            )
            self._load_failed(attempt, reason)
        elif self._state is S.READY:
            model = self._config.local_id if self._config else "?"
            reason = with_output(
                f"{self.name} for {model!r} exited with {describe_exit(code)}", handle.last_lines()
            )
            log.warn("{backend}: backend died: {reason}", backend=self.name, reason=reason)
            self._generation += 1
            self._users = 0
            self._port = None
            self._last_error = reason
            self._set_state(S.DEAD)
            self._pump()
        return code

    def _finish(self, attempt: _Attempt) -> None:
        attempt.finished = True
        for call in (attempt.poll_call, attempt.deadline_call):
            if call is not None and call.active():
                call.cancel()
        attempt.poll_call = attempt.deadline_call = None
        if self._attempt is attempt:
            self._attempt = None

    def _duration_ms(self, attempt: _Attempt) -> int:
        return max(0, round((self._clock.seconds() - attempt.started) * 1000))

    def _report(self, attempt: _Attempt, *, ok: bool, reason: str) -> int:
        duration = self._duration_ms(attempt)
        event = LoadEvent(self.kind, attempt.config.local_id, attempt.config.filename, duration, ok, reason)
        if self._on_load is not None:
            try:
                self._on_load(event)
            except Exception:
                log.failure("{backend}: on_load callback failed", backend=self.name)
        return duration

    def _load_succeeded(self, attempt: _Attempt) -> None:
        self._finish(attempt)
        self._last_load_ms = self._report(attempt, ok=True, reason="")
        self._last_error = None
        self._set_state(S.READY)
        log.info(
            "{backend}: {model} ready in {ms} ms",
            backend=self.name,
            model=attempt.config.local_id,
            ms=self._last_load_ms,
        )
        # Everyone queued for this config joins now: move them to the front.
        key = config_key(attempt.config)
        joining = [w for w in self._queue if w.config is not None and config_key(w.config) == key]
        others = [w for w in self._queue if w not in joining]
        self._queue = deque(joining + others)
        self._pump()

    def _load_failed(self, attempt: _Attempt, reason: str) -> None:
        self._finish(attempt)
        log.error("{backend}: load failed: {reason}", backend=self.name, reason=reason)
        self._report(attempt, ok=False, reason=reason)
        process = attempt.process
        if process is not None and process is self._process:
            self._process = None
            self._settle(self._stop_process(process))
        self._generation += 1
        self._config = None
        self._port = None
        self._last_error = reason
        self._set_state(S.FAILED)
        key = config_key(attempt.config)
        failed = [w for w in self._queue if w.config is not None and config_key(w.config) == key]
        for w in failed:
            self._queue.remove(w)
        with self._holding_pump():
            for w in failed:
                _fail(w.deferred, LoadFailed(reason))
        self._pump()

    def _stop_process(self, process: ProcessHandle) -> Deferred[None]:
        """Stop a process we no longer want; ``close`` waits for every such stop."""
        stopping = process.stop(self._stop_grace_s)
        if not stopping.called:
            self._stopping.add(stopping)

            def stopped(result: None) -> None:
                self._stopping.discard(stopping)
                return result

            stopping.addBoth(stopped)
        return stopping

    def _settle(self, stopping: Deferred[None]) -> None:
        """Hold the queue until a failed load's process is gone."""
        self._settling = stopping

        def settled(_: object) -> None:
            if self._settling is stopping:
                self._settling = None
                self._pump()

        stopping.addBoth(settled)


__all__ = [
    "InvalidTransition",
    "LoadEvent",
    "LoadFailed",
    "RuntimeClosed",
    "RuntimeLease",
    "RuntimeSlot",
    "SlotStatus",
    "SlotState",
    "TRANSITIONS",
    "config_key",
]
