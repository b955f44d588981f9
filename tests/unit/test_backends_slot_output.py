"""A loading backend's output makes the slot probe readiness at once instead of at its next scheduled
poll: at most one extra probe per ``OUTPUT_PROBE_GAP_S``, never two probes at a time, and the back-off
schedule unchanged for a backend that prints nothing.

Pure: a ``task.Clock``, a fake launcher whose processes print when the test says, and a probe whose
answers the test gives (or the fake backend HTTP client's).
"""

from __future__ import annotations

import math

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from routerd.backends.slot import RuntimeSlot, SlotState
from routerd.backends.slot_state import OUTPUT_PROBE_GAP_S
from routerd.backends.testing import FakeLauncher, FakeProcess, PortCounter
from tests.unit.test_backends_slot import A, Harness, result_of

LOADED = "srv  load_model: model loaded"


def since(h: Harness, start: float) -> list[float]:
    """The probes' times, in ms after ``start``."""
    return [round((t - start) * 1000, 3) for t, _ in h.http.requests]


def run_to(clock: Clock, t: float) -> None:
    """Advance ``clock`` to ``t``, stopping at each scheduled call's own time as a reactor does (one
    big ``advance`` would run them all at ``t``; small steps would run them a step late)."""
    while (due := min((c.getTime() for c in clock.getDelayedCalls()), default=math.inf)) <= t:
        clock.rightNow = max(clock.rightNow, due)
        clock.advance(0)
    clock.rightNow = max(clock.rightNow, t)
    clock.advance(0)


def test_a_line_printed_while_loading_is_followed_by_a_probe_at_once_so_the_load_takes_60ms_not_125() -> None:
    h = Harness()
    d = h.slot.acquire(A)
    start = h.clock.seconds()
    h.http.listening.add(h.last.port)  # 503 while it loads
    run_to(h.clock, start + 0.06)  # the poll at 50 ms saw 503; the next is due at 125 ms
    h.http.ready.add(h.last.port)
    h.last.print(LOADED)
    assert result_of(d).model is A
    assert h.events[-1].ok and h.events[-1].duration_ms == 60
    assert since(h, start) == [50.0, 60.0]


def test_a_burst_of_lines_brings_at_most_one_extra_probe_per_gap() -> None:
    h = Harness()
    h.slot.acquire(A)
    start = h.clock.seconds()
    h.http.listening.add(h.last.port)
    for ms in range(5, 45):  # a line every millisecond from 5 to 44 ms, none of them "ready"
        run_to(h.clock, start + ms / 1000)
        h.last.print("load_tensors: loading")
    run_to(h.clock, start + 0.064)
    times = since(h, start)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert times[0] == 5.0  # the first line is probed at once
    # ~every 10 ms while the lines come (5, 15, 25, 35, 45), then the back-off's poll due at 50 ms
    # waits out the gap too: never two probes closer than the gap
    assert times == [5.0, 15.0, 25.0, 35.0, 45.0, 55.0]
    assert min(gaps) >= OUTPUT_PROBE_GAP_S * 1000 - 0.001


def test_output_probes_leave_the_back_off_schedule_of_a_silent_backend_as_it_was() -> None:
    """Polls at 50, 125 and 237.5 ms whether or not a line at 60 ms brought a probe of its own."""
    h = Harness()
    h.slot.acquire(A)
    start = h.clock.seconds()
    h.http.listening.add(h.last.port)
    run_to(h.clock, start + 0.06)
    h.last.print("load_tensors: loading")
    run_to(h.clock, start + 0.3)
    assert since(h, start) == [50.0, 60.0, 125.0, 237.5]


def test_no_probe_on_output_before_polling_starts_or_once_the_backend_is_ready() -> None:
    h = Harness()
    lease = h.loaded(A)
    probes = len(h.http.requests)
    h.last.print("srv  log_server_r: request: GET /v1/models 200")
    assert len(h.http.requests) == probes
    assert h.slot.state is SlotState.READY
    lease.release()


class Probes:
    """A probe whose answers the test gives, one Deferred per probe."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, Deferred[bool]]] = []
        self.clock: Clock | None = None

    def __call__(self, base_url: str) -> Deferred[bool]:
        assert self.clock is not None
        d: Deferred[bool] = Deferred()
        self.calls.append((self.clock.seconds(), d))
        return d

    @property
    def in_flight(self) -> int:
        return sum(1 for _, d in self.calls if not d.called)


def slot_with(probes: Probes) -> tuple[Clock, FakeLauncher, RuntimeSlot]:
    clock = Clock()
    probes.clock = clock
    launcher = FakeLauncher()
    slot = RuntimeSlot("text", clock=clock, launcher=launcher, probe=probes, port_allocator=PortCounter(),
                       argv_for=lambda m, port: ["x", "--port", str(port)], name="llama-server")
    return clock, launcher, slot


def test_output_during_a_probe_brings_no_second_probe_until_it_answers_then_one_at_once() -> None:
    probes = Probes()
    clock, launcher, slot = slot_with(probes)
    d = slot.acquire(A)
    process: FakeProcess = launcher.spawned[-1]
    clock.advance(0.05)
    assert probes.in_flight == 1
    for _ in range(5):  # the server prints while the probe waits for its answer
        clock.advance(0.004)
        process.print("load_tensors: loading")
    assert len(probes.calls) == 1
    probes.calls[0][1].callback(False)  # answered "not yet" at 70 ms, after the lines
    assert len(probes.calls) == 2 and round(probes.calls[1][0], 6) == 0.07  # at once, not at 145 ms
    probes.calls[1][1].callback(True)
    assert result_of(d).model is A


def test_output_heard_during_a_probe_waits_out_the_gap_after_it_started() -> None:
    probes = Probes()
    clock, launcher, slot = slot_with(probes)
    slot.acquire(A)
    clock.advance(0.05)
    launcher.spawned[-1].print("load_tensors: loading")
    clock.advance(0.002)
    probes.calls[0][1].callback(False)  # a quick "not yet": 2 ms after the probe began
    assert len(probes.calls) == 1
    run_to(clock, probes.calls[0][0] + OUTPUT_PROBE_GAP_S)
    assert len(probes.calls) == 2 and round(probes.calls[1][0] - probes.calls[0][0], 6) == OUTPUT_PROBE_GAP_S


def test_a_failed_probe_answer_still_counts_as_not_ready() -> None:
    probes = Probes()
    clock, launcher, slot = slot_with(probes)
    d = slot.acquire(A)
    clock.advance(0.05)
    probes.calls[0][1].errback(ConnectionRefusedError())
    launcher.spawned[-1].print(LOADED)
    clock.advance(OUTPUT_PROBE_GAP_S)
    assert len(probes.calls) == 2
    probes.calls[1][1].callback(True)
    assert result_of(d).model is A and slot.state is SlotState.READY


def test_an_in_process_switch_heeds_output_only_once_a_probe_has_seen_the_backend_loading() -> None:
    """Right after KoboldCpp takes a reload its server may still answer for the old config: a line it
    prints then brings no probe; once a poll has answered "not yet", lines bring probes again."""
    probes = Probes()
    clock = Clock()
    probes.clock = clock
    launcher = FakeLauncher()
    reloading: list[Deferred[None]] = []

    def reload(config: object, port: int) -> Deferred[None]:
        reloading.append(Deferred())
        return reloading[-1]

    slot = RuntimeSlot("text", clock=clock, launcher=launcher, probe=probes, port_allocator=PortCounter(),
                       argv_for=lambda m, port: ["x", "--port", str(port)], name="koboldcpp", reload=reload,
                       idle_argv=lambda port: ["x", "--nomodel", "--port", str(port)])
    slot.start_idle()
    process = launcher.spawned[-1]
    d = slot.acquire(A)
    reloading[-1].callback(None)
    process.print("Reloading config...")
    run_to(clock, 0.049)
    assert probes.calls == []  # the back-off's first poll, at 50 ms, is the first probe
    run_to(clock, 0.05)
    probes.calls[0][1].callback(False)
    run_to(clock, 0.07)
    process.print("Load Text Model OK: True")
    assert len(probes.calls) == 2 and round(probes.calls[1][0], 6) == 0.07
    probes.calls[1][1].callback(True)
    assert result_of(d).model is A and len(launcher.spawned) == 1
