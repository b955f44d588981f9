"""Restore after borrow (spec "Reloading the model borrowed work displaced"; reference §7): the pure
plan and its performer on a fake clock."""

from __future__ import annotations

from typing import Any

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from routerd.lending.restore import RestorePlan, Restorer, Step

DELAY = 1.5


# -- the pure plan ---------------------------------------------------------------------------------------


def test_a_borrowed_acquire_with_restore_records_the_displaced_config_and_arms_the_timer() -> None:
    plan = RestorePlan()
    step = plan.acquired("text", "y.kcpps", "x.kcpps", borrowed=True, restore=True, delay=DELAY)
    assert step == Step(arm=DELAY)
    assert plan.targets == {"text": "x.kcpps"}


def test_without_the_restore_flag_nothing_is_recorded() -> None:
    plan = RestorePlan()
    assert plan.acquired("text", "y.kcpps", "x.kcpps", borrowed=True, restore=False, delay=DELAY) == Step()
    assert not plan.pending


def test_nothing_to_restore_when_the_incoming_config_is_already_loaded_or_nothing_was() -> None:
    plan = RestorePlan()
    assert plan.acquired("text", "y.kcpps", "y.kcpps", borrowed=True, restore=True, delay=DELAY) == Step()
    assert plan.acquired("text", "y.kcpps", None, borrowed=True, restore=True, delay=DELAY) == Step()
    assert not plan.pending


def test_a_run_of_borrowed_jobs_restores_the_model_from_before_the_run() -> None:
    plan = RestorePlan()
    plan.acquired("text", "y.kcpps", "x.kcpps", borrowed=True, restore=True, delay=DELAY)
    # the next borrowed job of the run finds y (or another linked z) loaded: x stays the target
    step = plan.acquired("text", "z.kcpps", "y.kcpps", borrowed=True, restore=True, delay=DELAY)
    assert step == Step(arm=DELAY)
    assert plan.targets == {"text": "x.kcpps"}


def test_a_native_acquire_cancels_the_pending_restore() -> None:
    plan = RestorePlan()
    plan.acquired("text", "y.kcpps", "x.kcpps", borrowed=True, restore=True, delay=DELAY)
    assert plan.acquired("text", "w.kcpps", "y.kcpps", borrowed=False, restore=False, delay=DELAY) == Step(
        cancel=True)
    assert not plan.pending
    assert plan.acquired("text", "w.kcpps", "y.kcpps", borrowed=False, restore=False, delay=DELAY) == Step()


def test_own_work_of_any_runtime_cancels_every_pending_target() -> None:
    """An explicit load (own work) cancels the pending restore whatever runtime it takes."""
    plan = RestorePlan()
    plan.acquired("text", "y.kcpps", "x.kcpps", borrowed=True, restore=True, delay=DELAY)
    plan.acquired("image", "sd-b.kcpps", "sd-a.kcpps", borrowed=True, restore=True, delay=DELAY)
    assert plan.own_work() == Step(cancel=True)
    assert not plan.pending
    assert plan.own_work() == Step()


def test_on_fire_work_in_flight_rearms_and_quiet_loads_every_target_then_clears() -> None:
    plan = RestorePlan()
    plan.acquired("text", "y.kcpps", "x.kcpps", borrowed=True, restore=True, delay=DELAY)
    plan.acquired("image", "sd-b.kcpps", "sd-a.kcpps", borrowed=True, restore=True, delay=DELAY)
    assert plan.fired(borrowed_in_flight=True, own_busy=False, delay=DELAY) == Step(arm=DELAY)
    assert plan.fired(borrowed_in_flight=False, own_busy=True, delay=DELAY) == Step(arm=DELAY)
    assert plan.fired(borrowed_in_flight=False, own_busy=False, delay=DELAY) == Step(
        load=(("image", "sd-a.kcpps"), ("text", "x.kcpps")))
    assert not plan.pending
    assert plan.fired(borrowed_in_flight=False, own_busy=False, delay=DELAY) == Step()


# -- the performer ------------------------------------------------------------------------------------------


@attrs.define
class Helper:
    """A helper node's runtimes as the restorer sees them."""

    clock: Clock = attrs.Factory(Clock)
    loaded: dict[str, str] = attrs.Factory(lambda: {"text": "x.kcpps"})
    borrowed: int = 0
    own: int = 0
    loads: list[tuple[str, str]] = attrs.Factory(list)
    pending_load: Deferred[None] | None = None
    idle_resets: list[float] = attrs.Factory(list)
    delay: float = DELAY

    def restorer(self) -> Restorer:
        return Restorer(clock=self.clock, delay=lambda: self.delay, loaded_config=self.loaded.get,
                        borrowed_in_flight=lambda: self.borrowed > 0, own_busy=lambda: self.own > 0,
                        load=self.load, on_loaded=lambda: self.idle_resets.append(self.clock.seconds()))

    def load(self, kind: str, config: str) -> Deferred[None]:
        self.loads.append((kind, config))
        self.pending_load = Deferred()
        self.pending_load.addCallback(lambda _: self.loaded.__setitem__(kind, config))
        return self.pending_load

    def borrowed_job(self, restorer: Restorer, config: str = "y.kcpps") -> None:
        restorer.acquired("text", config, borrowed=True, restore=True)
        self.loaded["text"] = config


def test_the_displaced_model_is_reloaded_once_the_delay_passes_quietly_and_counts_as_own_work() -> None:
    helper = Helper()
    restorer = helper.restorer()
    helper.borrowed_job(restorer)
    helper.clock.advance(DELAY - 0.01)
    assert helper.loads == []
    helper.clock.advance(0.01)
    assert helper.loads == [("text", "x.kcpps")]
    assert restorer.loading == 1  # the node is busy with its own work while it restores
    assert helper.pending_load is not None
    helper.clock.advance(2.0)
    helper.pending_load.callback(None)
    assert restorer.loading == 0
    assert helper.idle_resets == [DELAY + 2.0]  # own-idle time starts when the restore ends
    assert helper.loaded["text"] == "x.kcpps"
    assert helper.clock.getDelayedCalls() == []


def test_each_borrowed_arrival_pushes_the_restore_back_by_a_full_delay() -> None:
    helper = Helper()
    restorer = helper.restorer()
    helper.borrowed_job(restorer)
    helper.clock.advance(1.0)
    helper.borrowed_job(restorer)
    helper.clock.advance(1.0)
    assert helper.loads == []
    helper.clock.advance(0.5)
    assert helper.loads == [("text", "x.kcpps")]
    assert len(helper.clock.getDelayedCalls()) == 0


def test_a_borrowed_arrival_without_the_restore_flag_on_either_lane_still_pushes_the_restore_back() -> None:
    """Issue 21 §3: the restore waits for "no further borrowed work arriving on either lane", with or
    without the flag; an arrival without it records nothing of its own."""
    helper = Helper()
    restorer = helper.restorer()
    helper.borrowed_job(restorer)
    helper.clock.advance(1.0)
    restorer.acquired("image", "sd-b.kcpps", borrowed=True, restore=False)  # other lane, no flag
    helper.clock.advance(1.0)
    assert helper.loads == []
    restorer.acquired("text", "y.kcpps", borrowed=True, restore=False)  # same lane, no flag
    helper.clock.advance(DELAY - 0.01)
    assert helper.loads == []
    helper.clock.advance(0.01)
    assert helper.loads == [("text", "x.kcpps")]
    assert restorer.plan.targets == {}


def test_work_running_when_the_timer_fires_defers_the_restore_every_delay_until_quiet() -> None:
    helper = Helper()
    restorer = helper.restorer()
    helper.borrowed_job(restorer)
    helper.borrowed = 1
    helper.clock.advance(DELAY)
    assert helper.loads == []
    helper.borrowed, helper.own = 0, 1
    helper.clock.advance(DELAY)
    assert helper.loads == []
    helper.own = 0
    helper.clock.advance(DELAY)
    assert helper.loads == [("text", "x.kcpps")]


def test_a_native_request_arriving_first_cancels_the_pending_restore() -> None:
    helper = Helper()
    restorer = helper.restorer()
    helper.borrowed_job(restorer)
    restorer.acquired("text", "y.kcpps", borrowed=False, restore=False)
    helper.clock.advance(10 * DELAY)
    assert helper.loads == []
    assert helper.clock.getDelayedCalls() == []


def test_the_delay_setting_is_read_at_each_arm() -> None:
    helper = Helper(delay=5.0)
    restorer = helper.restorer()
    helper.borrowed_job(restorer)
    helper.clock.advance(4.9)
    assert helper.loads == []
    helper.clock.advance(0.1)
    assert helper.loads == [("text", "x.kcpps")]


def test_a_failed_restore_load_is_logged_and_leaves_the_node_idle_again() -> None:
    helper = Helper()
    restorer = helper.restorer()
    helper.borrowed_job(restorer)
    helper.clock.advance(DELAY)
    assert helper.pending_load is not None
    helper.pending_load.errback(RuntimeError("load failed"))
    assert restorer.loading == 0 and helper.idle_resets == [DELAY]


def test_stop_cancels_a_pending_restore() -> None:
    helper = Helper()
    restorer = helper.restorer()
    helper.borrowed_job(restorer)
    restorer.stop()
    assert helper.clock.getDelayedCalls() == []
    helper.clock.advance(10.0)
    assert helper.loads == []


# -- a same-node guardian model (spec "Guardian models": built on the same restore) -----------------------


def test_an_own_guardian_acquire_records_the_text_model_it_displaces_and_arms_the_timer() -> None:
    plan = RestorePlan()
    step = plan.acquired("text", "vision.kcpps", "text-only.kcpps", borrowed=False, restore=True, delay=DELAY)
    assert step == Step(arm=DELAY)
    assert plan.targets == {"text": "text-only.kcpps"}


def test_the_text_model_comes_back_after_the_guardian_once_the_node_is_quiet() -> None:
    helper = Helper()
    restorer = helper.restorer()
    helper.own = 1  # the guardian's own request runs
    restorer.acquired("text", "vision.kcpps", borrowed=False, restore=True)
    helper.loaded["text"] = "vision.kcpps"
    helper.clock.advance(DELAY)
    assert helper.loads == []  # still answering: re-armed, nothing loaded under it
    helper.own = 0
    helper.clock.advance(DELAY)
    assert helper.loads == [("text", "x.kcpps")]


def test_an_ordinary_own_request_after_the_guardian_cancels_the_restore() -> None:
    plan = RestorePlan()
    plan.acquired("text", "vision.kcpps", "text-only.kcpps", borrowed=False, restore=True, delay=DELAY)
    step = plan.acquired("text", "text-only.kcpps", "vision.kcpps", borrowed=False, restore=False,
                         delay=DELAY)
    assert step == Step(cancel=True) and not plan.pending


# -- an own acquire with nothing pending -------------------------------------------------------------------


class GeneralRestorer(Restorer):
    """A restorer that hands every acquire to the plan (no short way for an own acquire)."""

    def acquired(self, kind: str, incoming: str, *, borrowed: bool, restore: bool) -> None:
        self._do(self.plan.acquired(kind, incoming, self.loaded_config(kind), borrowed=borrowed,
                                    restore=restore, delay=self.delay()))


RESTORE_STEP = st.one_of(
    st.tuples(st.just("acquire"), st.sampled_from(["text", "image"]), st.sampled_from(["x", "y", "z"]),
              st.booleans(), st.booleans()),
    st.tuples(st.just("loaded"), st.sampled_from(["text", "image"]), st.sampled_from(["x", "y", "z"])),
    st.tuples(st.just("busy"), st.integers(0, 1), st.integers(0, 1)),
    st.tuples(st.just("advance"), st.floats(0.1, 3.0)),
    st.tuples(st.just("load_done"),),
)


@settings(max_examples=150, deadline=None)
@given(steps=st.lists(RESTORE_STEP, max_size=30))
def test_an_own_acquire_with_nothing_pending_leaves_what_the_plan_would(steps: list[tuple[Any, ...]]) -> None:
    """:meth:`Restorer.acquired` skips the plan for an own acquire while no restore is pending (it
    reads neither the loaded config nor the delay): driven through the same steps, it leaves the
    same targets, timers, loads and own-work count as a restorer that always asks the plan."""
    helpers = (Helper(), Helper())
    quick = helpers[0].restorer()
    general = GeneralRestorer(clock=helpers[1].clock, delay=lambda: helpers[1].delay,
                              loaded_config=helpers[1].loaded.get,
                              borrowed_in_flight=lambda: helpers[1].borrowed > 0,
                              own_busy=lambda: helpers[1].own > 0, load=helpers[1].load,
                              on_loaded=lambda: helpers[1].idle_resets.append(helpers[1].clock.seconds()))
    pairs = ((helpers[0], quick), (helpers[1], general))
    for step in steps:
        for helper, restorer in pairs:
            if step[0] == "acquire":
                restorer.acquired(step[1], f"{step[2]}.kcpps", borrowed=step[3], restore=step[4])
            elif step[0] == "loaded":
                helper.loaded[step[1]] = f"{step[2]}.kcpps"
            elif step[0] == "busy":
                helper.borrowed, helper.own = step[1], step[2]
            elif step[0] == "advance":
                helper.clock.advance(step[1])
            elif helper.pending_load is not None and not helper.pending_load.called:
                helper.pending_load.callback(None)
        seen = [(restorer.plan.targets, restorer.loading, helper.loads, helper.idle_resets, helper.loaded,
                 [call.getTime() for call in helper.clock.getDelayedCalls()]) for helper, restorer in pairs]
        assert seen[0] == seen[1]
