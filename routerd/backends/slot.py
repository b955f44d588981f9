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
* A waiter that ``yields`` (borrowed work) and gives up waiting takes a load no
  other waiter wants with it: the new process is stopped and the slot is
  ``empty``, free for what the node wants next (its own request).  Any other
  waiter that gives up leaves the load to finish for whoever else wants it.

Every load is timed on the injected clock, from the moment the switch is
granted (before the old process is stopped) until readiness or failure, and
reported through ``on_load``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from twisted.internet.defer import Deferred, fail, gatherResults, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater
from twisted.logger import Logger

from routerd.backends.errors import LoadFailed, RuntimeClosed
from routerd.backends.process import ProcessHandle
from routerd.backends.slot_load import SlotProcess, Waiter, fail_waiter, fire
from routerd.backends.slot_state import (
    IDLE_STATES,
    TRANSITIONS,
    InvalidTransition,
    LoadEvent,
    RuntimeLease,
    SlotState,
    SlotStatus,
    config_key,
)
from routerd.catalog.model import ModelConfig, RuntimeKind

S = SlotState
log = Logger()


class RuntimeSlot(SlotProcess):
    """One runtime kind's process and config.

    The state machine is a small enum with an explicit transition table rather
    than an Automat machine: the slot's behaviour depends as much on its data
    (queue head, user count, settling stop) as on its state, every input would
    need a guard in Automat, and the table plus ``_set_state`` already makes an
    illegal change fail loudly while ``status()`` reads the state directly.
    """

    def __init__(self, kind: RuntimeKind, *,
                 before_stop: Callable[[ModelConfig, int], Deferred[None]] | None = None,
                 **options: Any) -> None:
        super().__init__(kind, **options)
        # Told before a ready process is stopped on purpose (a switch, an unload), its users gone;
        # the stop waits for it (llama-server's KV slots saved: ``routerd.backends.kv_slots``).
        self._before_stop = before_stop

    # -- public API ---------------------------------------------------------

    def acquire(self, model: ModelConfig, *, yields: bool = False) -> Deferred[RuntimeLease]:
        """A lease on a ready backend for ``model``, loading or switching if needed.

        Cancelling the returned Deferred while it waits removes the request
        from the queue; a load it started carries on for whoever else wants it,
        unless it ``yields`` (borrowed work) and no other waiter wants that load.
        """
        if self._state is S.CLOSED:
            return fail(RuntimeClosed(f"{self.name} runtime is stopped"))
        # the very config object it holds (the loaded catalog entry) needs no config_key
        if self._state is S.READY and not self._queue and (self._config is model or self._holds(model)):
            return succeed(self._lease())
        d: Deferred[RuntimeLease] = Deferred(self._cancel_waiter)
        self._queue.append(Waiter(model, d, yields=yields))
        self._pump()
        return d

    def load(self, model: ModelConfig) -> Deferred[None]:
        """Make ``model`` the loaded config (acquire, then release at once)."""
        return self.acquire(model).addCallback(lambda lease: lease.release())

    def held_config(self) -> ModelConfig | None:
        """The config the slot is ready with or loading (switching to), else ``None``: what a
        request reaching it next runs without a switch."""
        state = self._state
        return self._config if state is S.READY or state is S.LOADING or state is S.SWITCHING else None

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
        self._queue.append(Waiter(None, d, idle_after))
        self._pump()
        return d

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
            self._set_process(None)
        stops = list(self._stopping)
        waiters = list(self._queue)
        self._queue.clear()
        self._generation += 1
        self._users = 0
        self._config = None
        self._set_state(S.CLOSED)
        for w in waiters:
            fail_waiter(w.deferred, RuntimeClosed(f"{self.name} runtime is stopped"))
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

    def _lease(self) -> RuntimeLease:
        assert self._config is not None and self._port is not None
        self._users += 1
        return RuntimeLease(self.kind, self._config, self._port, partial(self._release, self._generation),
                            partial(self._is_current, self._generation))

    def _is_current(self, generation: int) -> bool:
        return generation == self._generation

    def _release(self, generation: int) -> None:
        if generation != self._generation:
            return  # a lease on a process that died or was replaced: nothing to count
        self._users -= 1
        if self._users == 0 and self._queue:  # nobody waits: nothing to serve (~10 calls a request)
            self._pump()

    def _cancel_waiter(self, d: Deferred[Any]) -> None:
        for w in self._queue:
            if w.deferred is d:
                self._queue.remove(w)
                if w.yields and self._attempt is not None:
                    # judged once the own work that took it back has joined the queue (same turn)
                    self._clock.callLater(0, self._drop_unwanted_load, self._attempt)
                break
        self._pump()  # the head may have gone: whoever is next can proceed

    def _drop_unwanted_load(self, began: object) -> None:
        """Stop a load no waiter wants any more (borrowed work it was begun for went back, and the
        own work that took it back wants another config): its process is stopped and the slot is
        empty, so the node's own work does not wait for it.  A backend that loads in its running
        process (KoboldCpp) is left to finish."""
        attempt = self._attempt
        if attempt is None or attempt is not began or self._state is not S.LOADING:
            return
        if self._reload is not None:
            return
        key = config_key(attempt.config)
        if any(w.config is not None and config_key(w.config) == key for w in self._queue):
            return
        log.info("{backend}: the load of {model} is stopped: nobody waits for it any more",
                 backend=self.name, model=attempt.config.local_id)
        self._drop_attempt(attempt)
        self._set_state(S.EMPTY)
        self._pump()

    def _serve_queue(self) -> None:
        while self._queue and self._settling is None and self._state in IDLE_STATES:
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
                    self._set_process(None)
                    self._port = None
                    stopping = self._stop_process(idle)
                    self._settle(stopping)
                    done: Deferred[None] = head.deferred

                    def stopped(_: object, done: Deferred[None] = done) -> None:
                        fire(done, None)

                    stopping.addBoth(stopped)
                    return
                if self._state is not S.EMPTY:
                    self._config = None
                    self._set_state(S.EMPTY)
                fire(head.deferred, None)
                continue
            if self._state is S.READY and self._holds(head.config):
                self._queue.popleft()
                fire(head.deferred, self._lease())
                continue
            if self._state is S.READY and self._users:
                return  # switch waits for the current users to finish
            self._begin_load(head.config)
            return

    # -- unload -------------------------------------------------------------

    def _begin_unload(self, d: Deferred[None], idle_after: bool = True) -> None:
        process = self._process
        held, port = self._config, self._port
        self._set_process(None)
        self._generation += 1
        self._set_state(S.STOPPING)
        stopped = self._retire(process, held, port) if process is not None else succeed(None)

        def done(_: object) -> None:
            if self._state is S.STOPPING:
                self._config = None
                self._port = None
                self._set_state(S.EMPTY)
                if idle_after:
                    self.start_idle()  # KoboldCpp: unloading restarts it with --nomodel
            fire(d, None)
            self._pump()

        stopped.addBoth(done)

    def _retire(self, process: ProcessHandle, held: ModelConfig | None, port: int | None) -> Deferred[None]:
        """Stop a ready process on purpose: the ``before_stop`` hook first (its failure is logged and the
        stop goes on), then :meth:`_stop_process`; ``close`` waits for the whole of it."""
        hook = self._before_stop
        if hook is None or held is None or port is None:
            return self._stop_process(process)
        try:
            before = hook(held, port)
        except Exception:
            log.failure("{backend}: before stopping", backend=self.name)
            before = succeed(None)

        def hook_failed(failure: Any) -> None:
            log.failure("{backend}: before stopping", failure, backend=self.name)

        return self._track_stop(before.addErrback(hook_failed).addCallback(
            lambda _: self._stop_process(process)))


#: The waits (s) for a slot to see its process end after a request to it was refused (a killed
#: process's sockets close a moment before it is reaped).
REAP_WAIT_S = (0.02, 0.05, 0.1)


async def outlived(lease: RuntimeLease, clock: IReactorTime) -> bool:
    """Whether ``lease``'s backend process has gone, waiting up to ``REAP_WAIT_S`` for its slot to
    see it end."""
    for delay in REAP_WAIT_S:
        if lease.outlived:
            return True
        await deferLater(clock, delay, lambda: None)
    return lease.outlived


__all__ = [
    "InvalidTransition",
    "LoadEvent",
    "LoadFailed",
    "REAP_WAIT_S",
    "RuntimeClosed",
    "RuntimeLease",
    "RuntimeSlot",
    "SlotStatus",
    "SlotState",
    "TRANSITIONS",
    "config_key",
    "outlived",
]
