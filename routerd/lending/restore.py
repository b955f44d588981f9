"""Restore after borrow on a helper (spec "Reloading the model borrowed work displaced";
reference §7 "Restore after borrow"; ``offload_restore_delay``).

:class:`RestorePlan` is the pure state machine, told of every model acquire on this node and of
its timer firing; it answers with what to do (:class:`Step`).  Its rules:

* a native (own) acquire, or an explicit load (an operator's, a preload, the startup model, a
  reload: own work too), cancels any pending restore;
* a borrowed acquire whose lease asks for a restore — or an own acquire by a same-node guardian
  model (spec "Guardian models": the text-only model is loaded back once the node is quiet), which
  asks for one too — records the runtime's currently loaded
  config as the target — only if none is recorded yet for that runtime and it differs from the
  incoming config, so a run of borrowed jobs restores what was there before the run — and
  (re)arms the timer for one delay; a borrowed acquire without the flag records nothing but, while
  a restore is pending, re-arms the timer too ("no further borrowed work arriving on either lane");
* when the timer fires: borrowed work in flight (either lane) or own work running → re-arm for
  another delay; otherwise load every target as own work, then forget them.

Without the restore flag nothing is recorded (the helper keeps the linked model).

:class:`Restorer` performs it on an injected clock: one timer, loads through an injected
``load``; while a restore load runs it counts as the node's own work (``loading``), and
``on_loaded`` lets the node reset its own-idle time (a restore is own work, reference §7).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import attrs
from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

log = Logger()


@attrs.frozen
class Step:
    """What the plan asks for: ``arm`` the timer (seconds), ``cancel`` it, or ``load`` these
    (runtime kind, config filename) targets now.  An empty step changes nothing."""

    arm: float | None = None
    cancel: bool = False
    load: tuple[tuple[str, str], ...] = ()


NOTHING = Step()


class RestorePlan:
    def __init__(self) -> None:
        self.targets: dict[str, str] = {}  # runtime kind → config filename to restore

    @property
    def pending(self) -> bool:
        return bool(self.targets)

    def acquired(self, kind: str, incoming: str, loaded: str | None, *, borrowed: bool, restore: bool,
                 delay: float) -> Step:
        """A request is about to acquire the ``kind`` runtime for config ``incoming``;
        ``loaded`` is the config that runtime holds now (None: nothing ready)."""
        if not borrowed and not restore:
            return self.own_work()
        if not restore:
            # borrowed work without the flag restores nothing of its own, but it is borrowed work
            # arriving: a pending restore waits a full delay again (either lane)
            return Step(arm=delay) if self.targets else NOTHING
        if kind not in self.targets and loaded and loaded != incoming:
            self.targets[kind] = loaded
        if not self.targets:
            return NOTHING
        return Step(arm=delay)

    def own_work(self) -> Step:
        """Own work takes a runtime (an own request, or an explicit load: admin, Ollama preload,
        startup, reload, recipe): any pending restore is cancelled, whatever runtime it named."""
        if not self.targets:
            return NOTHING
        self.targets.clear()
        return Step(cancel=True)

    def fired(self, *, borrowed_in_flight: bool, own_busy: bool, delay: float) -> Step:
        if not self.targets:
            return NOTHING
        if borrowed_in_flight or own_busy:
            return Step(arm=delay)
        targets = tuple(sorted(self.targets.items()))
        self.targets.clear()
        return Step(load=targets)


@attrs.define(kw_only=True, eq=False)
class Restorer:
    clock: IReactorTime
    delay: Callable[[], float]
    loaded_config: Callable[[str], str | None]
    borrowed_in_flight: Callable[[], bool]
    own_busy: Callable[[], bool]
    load: Callable[[str, str], Awaitable[object]]
    on_loaded: Callable[[], None] = lambda: None
    plan: RestorePlan = attrs.field(init=False, factory=RestorePlan)
    loading: int = attrs.field(init=False, default=0)  # restore loads under way (own work)
    _timer: IDelayedCall | None = attrs.field(init=False, default=None)

    def acquired(self, kind: str, incoming: str, *, borrowed: bool, restore: bool) -> None:
        """Tell the restore of a model acquire (call it before the runtime is acquired)."""
        if not borrowed and not restore and not self.plan.targets:
            return  # an own acquire with no restore pending: the plan changes nothing (RestorePlan.acquired)
        self._do(self.plan.acquired(kind, incoming, self.loaded_config(kind), borrowed=borrowed,
                                    restore=restore, delay=self.delay()))

    def own_load(self) -> None:
        """An explicit load (own work) is starting: it cancels any pending restore, so the restore
        never loads over what the operator asked for."""
        self._do(self.plan.own_work())

    def stop(self) -> None:
        self._disarm()
        self.plan.targets.clear()

    def _fire(self) -> None:
        self._timer = None
        self._do(self.plan.fired(borrowed_in_flight=self.borrowed_in_flight(), own_busy=self.own_busy(),
                                 delay=self.delay()))

    def _do(self, step: Step) -> None:
        if step.cancel:
            self._disarm()
        if step.arm is not None:
            self._disarm()
            self._timer = self.clock.callLater(step.arm, self._fire)
        for kind, config in step.load:
            if self.loaded_config(kind) == config:
                continue
            self.loading += 1
            log.info("restoring {config} on the {runtime} runtime after borrowed work", config=config,
                     runtime=kind)
            defer.ensureDeferred(self._load(kind, config))

    async def _load(self, kind: str, config: str) -> None:
        try:
            await self.load(kind, config)
        except Exception as exc:  # noqa: BLE001 - a failed restore is logged; the next request loads
            log.warn("restoring {config} on the {runtime} runtime failed: {reason}", config=config,
                     runtime=kind, reason=str(exc))
        finally:
            self.loading -= 1
            self.on_loaded()

    def _disarm(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
