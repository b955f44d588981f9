"""What a runtime slot is and what it hands out: its states and their legal changes, the lease on a
ready backend, the status it reports and the load events it emits, and the timings it runs by.

Pure data; :mod:`routerd.backends.slot` holds the slot itself.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from routerd.catalog.model import ModelConfig, RuntimeKind

#: Overall deadline of one load, from switch start to readiness.
LOAD_TIMEOUT_S = 15 * 60.0
POLL_INITIAL_S = 0.05
POLL_FACTOR = 1.5
POLL_MAX_S = 0.5
#: A loading backend's output brings a probe at once instead of at the next poll (it printed
#: "model loaded", or any line), but probes at most once per this many seconds.
OUTPUT_PROBE_GAP_S = 0.01
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
    S.LOADING: frozenset({S.READY, S.FAILED, S.EMPTY, S.CLOSED}),
    S.STOPPING: frozenset({S.EMPTY, S.CLOSED}),
    S.CLOSED: frozenset(),
}
#: States in which the slot is between operations and may start the next one.
IDLE_STATES = frozenset({S.EMPTY, S.READY, S.FAILED, S.DEAD})


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
    """The right to send requests to a ready backend until :meth:`release`.  ``current`` says whether
    the process it was given on is still the slot's (it died, or was switched or stopped: not)."""

    def __init__(self, kind: RuntimeKind, model: ModelConfig | None, port: int,
                 release: Callable[[], None], current: Callable[[], bool] = lambda: True) -> None:
        self.kind = kind
        self.model = model
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self._release: Callable[[], None] | None = release
        self._current = current

    @property
    def released(self) -> bool:
        return self._release is None

    @property
    def outlived(self) -> bool:
        """Whether the backend process this lease was given on has gone since."""
        return not self._current()

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


__all__ = [
    "IDLE_STATES",
    "LOAD_TIMEOUT_S",
    "POLL_FACTOR",
    "POLL_INITIAL_S",
    "POLL_MAX_S",
    "RELOAD_TIMEOUT_S",
    "STOP_GRACE_S",
    "TRANSITIONS",
    "InvalidTransition",
    "LoadEvent",
    "RuntimeLease",
    "SlotState",
    "SlotStatus",
    "config_key",
]
