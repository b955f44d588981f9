"""The process side of a runtime slot: its fields, its state changes, and how one load goes (spawn or
in-process switch, readiness polling with back-off and a probe at once when the backend prints, the
deadline, an exit during the load or after it, the outcome reported as a :class:`LoadEvent`), plus
stopping processes it no longer wants.

:class:`SlotProcess` is the base of :class:`routerd.backends.slot.RuntimeSlot`, which adds the
queue: who is served next and when a switch may start.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import attrs
from twisted.internet.defer import Deferred, fail, succeed
from twisted.logger import Logger

from routerd.backends.errors import LoadFailed, exit_reason, with_output
from routerd.backends.process import ProcessHandle, ProcessLauncher, Scheduler, describe_exit
from routerd.backends.slot_state import (
    LOAD_TIMEOUT_S,
    OUTPUT_PROBE_GAP_S,
    POLL_FACTOR,
    POLL_INITIAL_S,
    POLL_MAX_S,
    RELOAD_TIMEOUT_S,
    STOP_GRACE_S,
    TRANSITIONS,
    InvalidTransition,
    LoadEvent,
    SlotState,
    config_key,
)
from routerd.catalog.model import ModelConfig, RuntimeKind

log = Logger()
S = SlotState


@attrs.define(eq=False)
class Waiter:
    config: ModelConfig | None  # None: an unload
    deferred: Deferred[Any]
    idle_after: bool = True  # an unload: restart without a model (KoboldCpp --nomodel) afterwards
    yields: bool = False  # borrowed work: a load begun only for it stops when it gives up waiting


@attrs.define(eq=False)
class _Attempt:
    config: ModelConfig
    started: float
    poll_delay: float  # the back-off's current step
    port: int | None = None
    process: ProcessHandle | None = None
    poll_call: Any = None  # the next probe: the back-off's, or one the backend's output asked for
    poll_due: float = math.inf  # when the back-off wants its next probe
    probing: bool = False  # a probe is in flight
    backoff_probe: bool = False  # the probe in flight (or the last one) is the back-off's
    probed_at: float = -math.inf  # when the last probe began
    heard: bool = False  # the backend printed while a probe was in flight
    listening: bool = False  # the backend's output brings probes
    deadline_call: Any = None
    finished: bool = False


def fire(d: Deferred[Any], value: Any) -> None:
    if not d.called:  # a waiter popped for service may have been cancelled meanwhile
        d.callback(value)


def fail_waiter(d: Deferred[Any], error: Exception) -> None:
    if not d.called:
        d.errback(error)


class SlotProcess:
    """A slot's process and the config it holds or is loading; the queue policy that decides when
    a load starts is the subclass's (:meth:`_serve_queue`)."""

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
        self._queue: deque[Waiter] = deque()
        self._attempt: _Attempt | None = None
        self._settling: Deferred[Any] | None = None  # stopping a failed process before the next load
        self._stopping: set[Deferred[None]] = set()  # every stop under way (close waits for them)
        self._last_error: str | None = None
        self._last_load_ms: int | None = None
        self._hold = 0
        self._pump_pending = False
        #: Told after every change of what :meth:`occupied` reads (the state, the process).
        self._watchers: list[Callable[[SlotProcess], None]] = []

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

    def occupied(self) -> bool:
        """Whether the slot runs a process or holds (or is getting) a config: what another family's
        request waits for (:meth:`watch` tells when the answer may have changed)."""
        state = self._state
        if state is S.READY or state is S.LOADING or state is S.SWITCHING or state is S.STOPPING:
            return True
        return state is not S.CLOSED and self.has_process

    def watch(self, changed: Callable[[SlotProcess], None]) -> None:
        """Call ``changed(slot)`` after every change of the state or the process (what
        :meth:`occupied` reads), so a reader keeps its answer instead of asking per request."""
        self._watchers.append(changed)

    def _changed(self) -> None:
        for changed in self._watchers:
            changed(self)

    def _set_process(self, handle: ProcessHandle | None) -> None:
        """The one writer of the process the slot keeps running (its watchers are told)."""
        self._process = handle
        self._changed()

    def loaded_config(self) -> ModelConfig | None:
        """The config the slot is ready with, else ``None``."""
        return self._config if self._state is S.READY else None

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
        self._set_process(handle)
        handle.exited.addCallback(self._on_exit, handle)

    # -- scheduling primitives ------------------------------------------------

    def _set_state(self, new: SlotState) -> None:
        if new not in TRANSITIONS[self._state]:
            raise InvalidTransition(f"{self.name}: {self._state.value} -> {new.value}")
        self._state = new
        self._since = self._clock.seconds()
        self._changed()

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
        raise NotImplementedError

    # -- loading ------------------------------------------------------------

    def _begin_load(self, config: ModelConfig) -> None:
        attempt = _Attempt(config, self._clock.seconds(), self._poll_initial_s)
        self._attempt = attempt
        self._generation += 1
        held = self._config if self._state is S.READY else None
        self._config = config
        old = self._process
        if old is not None and self._reload is not None and self._port is not None:
            self._switch_in_process(attempt, old, self._port)
            return
        self._set_process(None)
        if old is not None:
            log.info("{backend}: switching to {model}", backend=self.name, model=config.local_id)
            self._set_state(S.SWITCHING)
            self._retire(old, held, self._port).addBoth(lambda _: self._spawn(attempt))
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
            if not attempt.finished:  # its output is heeded once a poll has seen it loading
                self._start_polling(attempt, process, listen=False)

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
        self._set_process(handle)
        attempt.deadline_call = self._clock.callLater(self._load_timeout_s, self._load_timed_out, attempt)
        self._start_polling(attempt, handle, listen=True)
        handle.exited.addCallback(self._on_exit, handle)

    def _start_polling(self, attempt: _Attempt, process: ProcessHandle, *, listen: bool) -> None:
        """Poll on the back-off, and probe at once when the backend prints (its "model loaded" line:
        the back-off alone overshoots a 0.1 s load by half), at most once per OUTPUT_PROBE_GAP_S, one
        probe at a time.  A new process is heard from its first line (its port answers nothing before
        it is ready), one switching in place once a probe has seen it loading."""
        attempt.poll_due = self._clock.seconds() + attempt.poll_delay
        self._schedule_poll(attempt, attempt.poll_due, backoff=True)
        if listen:
            self._listen(attempt, process)

    def _listen(self, attempt: _Attempt, process: ProcessHandle) -> None:
        attempt.listening = True
        process.on_output(lambda _line: self._heard(attempt))

    def _schedule_poll(self, attempt: _Attempt, at: float, *, backoff: bool) -> None:
        if attempt.poll_call is not None and attempt.poll_call.active():
            attempt.poll_call.cancel()
        delay = at - self._clock.seconds()
        if delay <= 0:
            self._poll(attempt, backoff)  # at once: no turn of the reactor in between
            return
        attempt.poll_call = self._clock.callLater(delay, self._poll, attempt, backoff)

    def _heard(self, attempt: _Attempt) -> None:
        """The loading backend printed a line: probe now, or once the gap after the last probe is over
        (after the answer of a probe in flight)."""
        if attempt.probing or attempt.finished:
            attempt.heard = True  # a probe in flight: another at once if it answers "not yet"
            return
        at = max(self._clock.seconds(), attempt.probed_at + OUTPUT_PROBE_GAP_S)
        if attempt.poll_call is None or at < attempt.poll_call.getTime():
            self._schedule_poll(attempt, at, backoff=False)

    def _next_poll(self, attempt: _Attempt) -> None:
        """After a "not yet": the back-off's next probe, or a sooner one for output heard meanwhile."""
        gap_over = attempt.probed_at + OUTPUT_PROBE_GAP_S
        if attempt.heard and max(self._clock.seconds(), gap_over) < attempt.poll_due:
            self._schedule_poll(attempt, max(self._clock.seconds(), gap_over), backoff=False)
        else:
            self._schedule_poll(attempt, max(attempt.poll_due, gap_over), backoff=True)

    def _poll(self, attempt: _Attempt, backoff: bool = True) -> None:
        attempt.poll_call = None
        if attempt.finished or attempt.port is None:
            return
        attempt.probing, attempt.backoff_probe, attempt.heard = True, backoff, False
        attempt.probed_at = self._clock.seconds()
        try:
            probing = self._probe(f"http://127.0.0.1:{attempt.port}")
        except Exception:
            log.failure("{backend}: readiness probe raised", backend=self.name)
            probing = succeed(False)
        probing.addErrback(lambda _: False).addCallback(self._polled, attempt)

    def _polled(self, ready: bool, attempt: _Attempt) -> None:
        attempt.probing = False
        if attempt.finished:
            return
        if ready:
            self._load_succeeded(attempt)
            return
        if attempt.backoff_probe:
            attempt.poll_delay = min(attempt.poll_delay * self._poll_factor, self._poll_max_s)
            attempt.poll_due = self._clock.seconds() + attempt.poll_delay
        if not attempt.listening and attempt.process is not None:
            self._listen(attempt, attempt.process)
        self._next_poll(attempt)

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
        self._set_process(None)
        attempt = self._attempt
        if self._state is S.LOADING and attempt is not None and attempt.process is handle:
            reason = exit_reason(f"{self.name} for {attempt.config.local_id!r}",
                                 f"exited with {describe_exit(code)} during the load", handle.last_lines())
            self._load_failed(attempt, reason)
        elif self._state is S.READY:
            model = self._config.local_id if self._config else "?"
            reason = exit_reason(f"{self.name} for {model!r}", f"exited with {describe_exit(code)}",
                                 handle.last_lines())
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
        if attempt.process is not None:
            attempt.process.on_output(None)
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
        log.info("{backend}: {model} ready in {ms} ms", backend=self.name, model=attempt.config.local_id,
                 ms=self._last_load_ms)
        # Everyone queued for this config joins now: move them to the front.
        key = config_key(attempt.config)
        joining = [w for w in self._queue if w.config is not None and config_key(w.config) == key]
        others = [w for w in self._queue if w not in joining]
        self._queue = deque(joining + others)
        self._pump()

    def _drop_attempt(self, attempt: _Attempt) -> None:
        """End ``attempt`` without a ready backend: its process (when it is the slot's) is stopped,
        the queue held until it is gone, and the slot holds no config."""
        self._finish(attempt)
        process = attempt.process
        if process is not None and process is self._process:
            self._set_process(None)
            self._settle(self._stop_process(process))
        self._generation += 1
        self._config = None
        self._port = None

    def _load_failed(self, attempt: _Attempt, reason: str) -> None:
        self._drop_attempt(attempt)
        log.error("{backend}: load failed: {reason}", backend=self.name, reason=reason)
        self._report(attempt, ok=False, reason=reason)
        self._last_error = reason
        self._set_state(S.FAILED)
        key = config_key(attempt.config)
        failed = [w for w in self._queue if w.config is not None and config_key(w.config) == key]
        for w in failed:
            self._queue.remove(w)
        with self._holding_pump():
            for w in failed:
                fail_waiter(w.deferred, LoadFailed(reason))
        self._pump()

    def _retire(self, process: ProcessHandle, held: ModelConfig | None, port: int | None) -> Deferred[None]:
        """Stop a process that served ``held`` at ``port`` on purpose (a switch, an unload)."""
        raise NotImplementedError

    def _stop_process(self, process: ProcessHandle) -> Deferred[None]:
        """Stop a process we no longer want; ``close`` waits for every such stop."""
        return self._track_stop(process.stop(self._stop_grace_s))

    def _track_stop(self, stopping: Deferred[None]) -> Deferred[None]:
        """Count a stop under way until it ends (``close`` waits for every one)."""
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


__all__ = ["SlotProcess", "Waiter", "fail_waiter", "fire"]
