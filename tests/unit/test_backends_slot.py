"""RuntimeSlot: join, switch, FIFO, load timing, failures, death, cancel, unload.

Pure: a ``task.Clock`` for time, a fake launcher whose processes the test ends,
a fake backend HTTP client whose readiness the test flips.
"""

from __future__ import annotations

from typing import Any, TypeVar

import pytest
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from routerd.backends.errors import LoadFailed, RuntimeClosed, split_output
from routerd.backends.readiness import probe_text
from routerd.backends.slot import (
    TRANSITIONS,
    InvalidTransition,
    LoadEvent,
    RuntimeLease,
    RuntimeSlot,
    SlotState,
)
from routerd.backends.testing import FakeBackendHTTP, FakeLauncher, FakeProcess, PortCounter
from routerd.catalog.model import Capabilities, ModelConfig

T = TypeVar("T")


def model(local_id: str, config_hash: str = "h") -> ModelConfig:
    return ModelConfig(
        local_id=local_id,
        filename=f"{local_id}.kcpps",
        path=f"/models/{local_id}.kcpps",
        backend_mode="llama_sdcpp",
        capabilities=Capabilities(llm=True),
        config_hash=config_hash,
        text_model=f"/weights/{local_id}.gguf",
    )


A, B, C = model("a"), model("b"), model("c")


def result_of(d: Deferred[T]) -> T:
    out: list[Any] = []
    d.addBoth(out.append)
    assert out, "the Deferred has not fired"
    if isinstance(out[0], Failure):
        out[0].raiseException()
    value: T = out[0]
    return value


def failure_of(d: Deferred[Any], error: type[BaseException]) -> BaseException:
    out: list[Any] = []
    d.addBoth(out.append)
    assert out, "the Deferred has not fired"
    assert isinstance(out[0], Failure), f"expected a failure, got {out[0]!r}"
    assert out[0].check(error), out[0]
    exc: BaseException = out[0].value
    return exc


class Harness:
    def __init__(self, **slot_kw: Any) -> None:
        self.clock = Clock()
        self.clock.advance(1000)
        self.launcher = FakeLauncher()
        self.http = FakeBackendHTTP(self.clock.seconds)
        self.events: list[LoadEvent] = []
        self.slot = RuntimeSlot(
            "text",
            clock=self.clock,
            launcher=self.launcher,
            argv_for=lambda m, port: ["llama-server", "--port", str(port), "-m", m.text_model or ""],
            probe=lambda base_url: probe_text(self.http, base_url),
            port_allocator=PortCounter(),
            on_load=slot_kw.pop("on_load", self.events.append),
            name="llama-server",
            **slot_kw,
        )

    @property
    def last(self) -> FakeProcess:
        return self.launcher.spawned[-1]

    def become_ready(self, process: FakeProcess | None = None) -> None:
        """The newest process finishes loading; the next poll sees it."""
        self.http.ready.add((process or self.last).port)
        self.clock.advance(0.5)

    def loaded(self, config: ModelConfig) -> RuntimeLease:
        d = self.slot.acquire(config)
        self.become_ready()
        return result_of(d)


def test_first_acquire_starts_the_backend_and_leases_it_once_ready() -> None:
    h = Harness()
    d = h.slot.acquire(A)
    assert h.slot.state is SlotState.LOADING
    assert len(h.launcher.spawned) == 1
    h.http.listening.add(h.last.port)  # answering 503 while it loads
    h.clock.advance(2)
    assert not d.called
    h.become_ready()
    lease = result_of(d)
    assert lease.base_url == f"http://127.0.0.1:{h.last.port}"
    st = h.slot.status()
    assert (st.state, st.model_id, st.config_filename, st.users, st.pid) == (
        "ready",
        "a",
        "a.kcpps",
        1,
        h.last.pid,
    )


def test_request_for_loaded_config_joins_at_once_without_a_new_process() -> None:
    h = Harness()
    h.loaded(A)
    second = result_of(h.slot.acquire(A))
    assert second.model is A
    assert len(h.launcher.spawned) == 1
    assert h.slot.status().users == 2


def test_same_filename_with_changed_content_is_another_config() -> None:
    h = Harness()
    h.loaded(A).release()
    h.slot.acquire(model("a", config_hash="edited"))
    assert len(h.launcher.spawned) == 2


def test_switch_waits_for_users_to_reach_zero_then_stops_and_loads() -> None:
    h = Harness()
    lease1, lease2 = h.loaded(A), result_of(h.slot.acquire(A))
    first = h.last
    d = h.slot.acquire(B)
    assert h.slot.status().waiters == 1
    lease1.release()
    assert first.running and len(h.launcher.spawned) == 1
    lease2.release()
    assert not first.running  # stopped once the last user left
    assert len(h.launcher.spawned) == 2 and h.last.argv[-1] == "/weights/b.gguf"
    assert h.slot.state is SlotState.LOADING
    h.become_ready()
    assert result_of(d).model is B
    assert h.slot.status().model_id == "b"


def test_request_for_loaded_config_queues_while_someone_waits_to_switch() -> None:
    h = Harness()
    lease = h.loaded(A)
    to_b = h.slot.acquire(B)
    late_a = h.slot.acquire(A)  # must not overtake the B waiter (no starvation)
    assert not late_a.called
    lease.release()
    h.become_ready()
    result_of(to_b).release()
    h.become_ready()  # switches back to A for the late request
    assert result_of(late_a).model is A
    assert [p.argv[-1] for p in h.launcher.spawned] == [
        "/weights/a.gguf",
        "/weights/b.gguf",
        "/weights/a.gguf",
    ]


def test_third_config_queues_strictly_fifo_behind_the_second() -> None:
    h = Harness()
    lease = h.loaded(A)
    to_b = h.slot.acquire(B)
    to_c = h.slot.acquire(C)
    lease.release()
    h.become_ready()
    b_lease = result_of(to_b)
    assert not to_c.called and h.slot.status().model_id == "b"
    b_lease.release()
    h.become_ready()
    assert result_of(to_c).model is C
    assert [p.argv[-1] for p in h.launcher.spawned] == [
        "/weights/a.gguf",
        "/weights/b.gguf",
        "/weights/c.gguf",
    ]


def test_requests_queued_for_the_config_being_loaded_all_join_when_ready() -> None:
    h = Harness()
    lease = h.loaded(A)
    b1 = h.slot.acquire(B)
    c1 = h.slot.acquire(C)
    b2 = h.slot.acquire(B)
    lease.release()
    h.become_ready()
    assert result_of(b1).model is B and result_of(b2).model is B
    assert not c1.called
    assert h.slot.status().users == 2 and h.slot.status().waiters == 1


def test_load_is_timed_on_the_clock_from_switch_start_to_readiness_and_reported() -> None:
    h = Harness()
    lease = h.loaded(A)
    old = h.last
    old.hold_stop = True  # the old backend takes 2 s to shut down
    d = h.slot.acquire(B)
    h.clock.advance(7)
    switch_start = h.clock.seconds()
    lease.release()
    assert h.slot.state is SlotState.SWITCHING
    h.clock.advance(2)
    old.exit(0)
    assert h.slot.state is SlotState.LOADING
    h.http.listening.add(h.last.port)
    h.clock.advance(3)
    h.become_ready()
    result_of(d)
    expected_ms = round((h.clock.seconds() - switch_start) * 1000)
    assert expected_ms >= 5000
    event = h.events[-1]
    assert event == LoadEvent("text", "b", "b.kcpps", expected_ms, True, "")
    assert h.slot.status().last_load_ms == expected_ms


def test_readiness_is_polled_every_50ms_growing_by_half_up_to_500ms() -> None:
    h = Harness()
    h.slot.acquire(A)
    start = h.clock.seconds()
    h.clock.pump([0.01] * 500)  # 5 s in 10 ms steps
    times = [round(t - start, 4) for t, _ in h.http.requests]
    gaps = [round(b - a, 4) for a, b in zip([0.0, *times], times, strict=False)]
    assert gaps[:5] == [0.05, 0.08, 0.12, 0.17, 0.26]  # 50, 75, 112.5, … ms (10 ms clock steps)
    assert max(gaps) == pytest.approx(0.5, abs=0.011)
    assert all(url.endswith("/v1/models") for _, url in h.http.requests)


def test_process_exit_during_load_fails_the_waiter_with_its_output_and_empties_the_slot() -> None:
    h = Harness()
    d = h.slot.acquire(A)
    h.last.exit(1, "loading model /weights/a.gguf", "error: failed to open /weights/a.gguf")
    err = failure_of(d, LoadFailed)
    assert isinstance(err, LoadFailed)
    assert "exit code 1" in err.reason and "error: failed to open /weights/a.gguf" in err.reason
    st = h.slot.status()
    assert (st.state, st.model_id, st.pid, st.users) == ("failed", None, None, 0)
    assert st.last_error == err.reason
    assert h.events[-1].ok is False and h.events[-1].reason == err.reason
    # the next request tries again
    again = h.slot.acquire(A)
    assert len(h.launcher.spawned) == 2
    h.become_ready()
    assert result_of(again).model is A
    assert h.slot.status().last_error is None


def test_a_failed_loads_reason_is_the_backends_own_error_line_not_only_its_exit_code() -> None:
    h = Harness()
    d = h.slot.acquire(A)
    h.last.exit(1, "0.00.005.069 I srv    load_model: loading model '/weights/a.gguf'",
                "0.00.005.629 E llama_model_load: error loading model: unknown model architecture: 'x'",
                "0.00.006.666 E srv  llama_server: exiting due to model loading error")
    err = failure_of(d, LoadFailed)
    assert isinstance(err, LoadFailed)
    message, tail = split_output(err.reason)
    assert message == ("llama-server for 'a': llama_model_load: error loading model: unknown model "
                       "architecture: 'x' (exited with exit code 1 during the load)")
    assert len(tail) == 3
    assert h.events[-1].reason == err.reason == h.slot.status().last_error


def test_a_ready_backend_that_dies_says_why_in_its_own_words() -> None:
    h = Harness()
    h.loaded(A)
    h.last.exit(-6, "0.01.000.000 E ggml_abort: GGML_ASSERT(n_tokens <= n_batch) failed", "Aborted")
    message, _ = split_output(h.slot.status().last_error or "")
    assert message == ("llama-server for 'a': ggml_abort: GGML_ASSERT(n_tokens <= n_batch) failed "
                       "(exited with signal 6)")


def test_failed_load_fails_every_request_queued_for_that_config_but_not_others() -> None:
    h = Harness()
    lease = h.loaded(A)
    b1, c1, b2 = h.slot.acquire(B), h.slot.acquire(C), h.slot.acquire(B)
    lease.release()
    h.last.exit(2, "boom")
    failure_of(b1, LoadFailed)
    failure_of(b2, LoadFailed)
    assert not c1.called
    assert h.last.argv[-1] == "/weights/c.gguf"  # C loads next
    h.become_ready()
    assert result_of(c1).model is C


def test_readiness_deadline_fails_the_load_stops_the_process_and_next_acquire_retries() -> None:
    h = Harness(load_timeout_s=60)
    d = h.slot.acquire(A)
    stuck = h.last
    stuck.output.append("still loading tensors")
    stuck.hold_stop = True
    h.http.listening.add(stuck.port)
    h.clock.advance(59.5)
    assert not d.called
    h.clock.advance(0.5)
    err = failure_of(d, LoadFailed)
    assert isinstance(err, LoadFailed)
    assert "not ready after 60s" in err.reason and "still loading tensors" in err.reason
    assert stuck.stop_calls and stuck.running
    assert h.events[-1].ok is False and h.events[-1].duration_ms == 60000
    again = h.slot.acquire(A)
    assert len(h.launcher.spawned) == 1  # waits until the stuck process is gone
    stuck.exit(-15)
    assert len(h.launcher.spawned) == 2
    h.become_ready()
    result_of(again)


def test_a_hanging_probe_still_ends_at_the_deadline() -> None:
    h = Harness(load_timeout_s=10)
    h.http.pending = True
    d = h.slot.acquire(A)
    h.clock.advance(11)
    failure_of(d, LoadFailed)


def test_spawn_error_fails_the_load_and_the_next_acquire_retries() -> None:
    h = Harness()
    h.launcher.error = OSError("exec format error")
    d = h.slot.acquire(A)
    err = failure_of(d, LoadFailed)
    assert isinstance(err, LoadFailed) and "exec format error" in err.reason
    assert h.slot.state is SlotState.FAILED
    assert h.events[-1].ok is False
    h.launcher.error = None
    again = h.slot.acquire(A)
    h.become_ready()
    result_of(again)


def test_ready_backend_that_dies_goes_dead_and_the_next_acquire_restarts_it() -> None:
    h = Harness()
    lease = h.loaded(A)
    h.last.exit(-9, "Segmentation fault")
    st = h.slot.status()
    assert st.state == "dead" and st.pid is None and st.users == 0
    assert st.last_error is not None and "signal 9" in st.last_error and "Segmentation fault" in st.last_error
    lease.release()  # a lease on the dead process counts for nothing
    assert h.slot.status().users == 0
    d = h.slot.acquire(A)
    assert len(h.launcher.spawned) == 2 and h.slot.state is SlotState.LOADING
    h.become_ready()
    assert result_of(d).port == h.last.port
    assert h.events[-1].ok is True


def test_death_while_a_switch_waits_for_users_lets_the_switch_proceed() -> None:
    h = Harness()
    h.loaded(A)  # never released: its client hangs on the dead backend
    d = h.slot.acquire(B)
    h.last.exit(1)
    assert h.last.argv[-1] == "/weights/b.gguf"
    h.become_ready()
    result_of(d)


def test_cancelling_a_waiting_acquire_removes_the_waiter_and_leaks_nothing() -> None:
    h = Harness()
    lease = h.loaded(A)
    d = h.slot.acquire(B)
    d.cancel()
    failure_of(d, CancelledError)
    assert h.slot.status().waiters == 0
    lease.release()
    st = h.slot.status()
    assert (st.state, st.model_id, st.users) == ("ready", "a", 0)
    assert len(h.launcher.spawned) == 1  # no switch for a request that left
    assert result_of(h.slot.acquire(A)).model is A  # joins at once again


def test_cancelling_the_head_waiter_lets_requests_behind_it_join() -> None:
    h = Harness()
    h.loaded(A)
    to_b = h.slot.acquire(B)
    late_a = h.slot.acquire(A)
    assert not late_a.called
    to_b.cancel()
    assert result_of(late_a).model is A


def test_cancelling_the_request_that_started_a_load_leaves_the_load_to_finish() -> None:
    h = Harness()
    d = h.slot.acquire(A)
    d.cancel()
    h.become_ready()
    st = h.slot.status()
    assert (st.state, st.users, st.waiters) == ("ready", 0, 0)
    to_b = h.slot.acquire(B)  # not stuck: another config can switch in at once
    assert h.last.argv[-1] == "/weights/b.gguf"
    h.become_ready()
    result_of(to_b)


def test_lease_release_is_idempotent() -> None:
    h = Harness()
    lease = h.loaded(A)
    other = result_of(h.slot.acquire(A))
    lease.release()
    lease.release()
    assert h.slot.status().users == 1 and lease.released and not other.released


def test_explicit_load_acquires_and_releases() -> None:
    h = Harness()
    d = h.slot.load(A)
    h.become_ready()
    assert result_of(d) is None
    assert h.slot.status().users == 0 and h.slot.loaded_config() is A


def test_unload_waits_for_users_to_drain_then_stops_and_empties_the_slot() -> None:
    h = Harness()
    lease = h.loaded(A)
    d = h.slot.unload()
    late = h.slot.acquire(A)  # arrives after the unload: queues behind it
    assert not d.called and h.last.running
    lease.release()
    assert result_of(d) is None
    assert not h.launcher.spawned[0].running
    # the late request then loads A again
    assert len(h.launcher.spawned) == 2
    h.become_ready()
    result_of(late)


def test_unload_of_an_idle_slot_stops_it_at_once() -> None:
    h = Harness()
    h.loaded(A).release()
    assert result_of(h.slot.unload()) is None
    st = h.slot.status()
    assert (st.state, st.model_id, st.pid) == ("empty", None, None)
    assert h.slot.loaded_config() is None


def test_unload_clears_a_dead_or_empty_slot() -> None:
    h = Harness()
    assert result_of(h.slot.unload()) is None
    h.loaded(A)
    h.last.exit(1)
    assert result_of(h.slot.unload()) is None
    assert h.slot.state is SlotState.EMPTY


def test_close_fails_waiters_stops_the_process_and_refuses_new_requests() -> None:
    h = Harness()
    h.loaded(A)
    waiting = h.slot.acquire(B)
    proc = h.last
    proc.hold_stop = True
    closed = h.slot.close()
    failure_of(waiting, RuntimeClosed)
    assert not closed.called
    proc.exit(-15)
    assert result_of(closed) is None
    assert h.slot.state is SlotState.CLOSED
    failure_of(h.slot.acquire(A), RuntimeClosed)


def test_close_during_a_switch_waits_for_the_old_process_and_starts_no_new_one() -> None:
    h = Harness()
    lease = h.loaded(A)
    old = h.last
    old.hold_stop = True
    d = h.slot.acquire(B)
    lease.release()
    closed = h.slot.close()
    failure_of(d, RuntimeClosed)
    assert not closed.called
    old.exit(-15)
    result_of(closed)
    assert len(h.launcher.spawned) == 1
    assert h.events[-1].ok is False


def test_on_load_callback_errors_do_not_break_the_slot() -> None:
    def broken(event: LoadEvent) -> None:
        raise RuntimeError("store is down")

    h = Harness(on_load=broken)
    lease = h.loaded(A)
    assert h.slot.state is SlotState.READY and lease.model is A


def test_transition_table_refuses_illegal_state_changes() -> None:
    h = Harness()
    assert SlotState.READY not in TRANSITIONS[SlotState.EMPTY]
    with pytest.raises(InvalidTransition):
        h.slot._set_state(SlotState.READY)
    assert TRANSITIONS[SlotState.CLOSED] == frozenset()


@pytest.mark.parametrize("state", list(SlotState))
@pytest.mark.parametrize("process", ["none", "running", "ended"])
def test_occupied_says_what_the_state_and_process_properties_say(state: SlotState, process: str) -> None:
    """``occupied()`` (read per request for every other family's slot) against the reading it
    replaced, for every state with no process, a running one and one that has just ended."""
    h = Harness()
    if process != "none":
        h.slot._process = FakeProcess(["x"], "x", None, pid=42)
        if process == "ended":
            h.slot._process.exit(0)
    h.slot._state = state
    s = h.slot
    assert s.occupied() == (not s.closed and (s.has_process or s.state.value in
                                              {"ready", "loading", "switching", "stopping"}))


# -- borrowed work that gives up waiting takes its load with it (spec "A helper's own work") --------------


def test_a_load_begun_only_for_borrowed_work_stops_when_that_work_gives_up() -> None:
    h = Harness()
    h.loaded(A).release()
    borrowed = h.slot.acquire(B, yields=True)
    assert h.slot.state is SlotState.LOADING and h.last.argv[-1] == "/weights/b.gguf"
    loading_b = h.last
    borrowed.cancel()  # handed back to its owner
    failure_of(borrowed, CancelledError)
    own = h.slot.acquire(A)  # the node's own request (in the same turn)
    h.clock.advance(0)
    assert loading_b.stop_calls and not loading_b.running
    # the own request loads straight away, not after b
    assert h.last is not loading_b and h.last.argv[-1] == "/weights/a.gguf"
    h.become_ready()
    assert result_of(own).model is A
    assert [e.model_id for e in h.events] == ["a", "a"]  # the stopped load is not a load sample


def test_a_load_another_waiter_wants_goes_on_when_the_borrowed_waiter_gives_up() -> None:
    h = Harness()
    borrowed = h.slot.acquire(B, yields=True)
    own = h.slot.acquire(B)
    borrowed.cancel()
    h.clock.advance(0)
    assert h.slot.state is SlotState.LOADING and h.last.stop_calls == []
    h.become_ready()
    assert result_of(own).model is B


def test_own_work_for_the_same_config_joining_as_it_takes_the_borrowed_waiter_back_keeps_the_load() -> None:
    """The helper's own request for the model being loaded hands the borrowed one back first and
    joins the queue in the same turn: the load goes on for it."""
    h = Harness()
    borrowed = h.slot.acquire(B, yields=True)
    borrowed.cancel()
    own = h.slot.acquire(B)
    h.clock.advance(0)
    assert len(h.launcher.spawned) == 1 and h.last.stop_calls == []
    h.become_ready()
    assert result_of(own).model is B


def test_an_own_waiter_giving_up_still_leaves_its_load_to_finish() -> None:
    h = Harness()
    own = h.slot.acquire(B)
    own.cancel()
    assert h.slot.state is SlotState.LOADING
    h.become_ready()
    assert h.slot.status().state == "ready"
