"""routerd.sim.control: the live knobs and their validation."""

from __future__ import annotations

import pytest

from routerd.sim.control import ControlError, Counters, Knobs, apply_control, snapshot


def test_apply_control_changes_only_the_named_knobs() -> None:
    knobs = Knobs()
    apply_control(knobs, {"slowdown": 3, "hang": True})
    assert knobs == Knobs(slowdown=3.0, hang=True)
    apply_control(knobs, {"crash_after": 2, "fail_next_load": True})
    assert knobs == Knobs(fail_next_load=True, crash_after=2, slowdown=3.0, hang=True)
    apply_control(knobs, {"crash_after": None, "hang": False})
    assert knobs.crash_after is None and not knobs.hang


@pytest.mark.parametrize(
    "body",
    [
        [],
        {"slowdown": 0},
        {"slowdown": -1},
        {"slowdown": "2"},
        {"hang": 1},
        {"fail_next_load": "yes"},
        {"crash_after": -1},
        {"crash_after": 1.5},
        {"crash_after": True},
        {"speed": 2},
        {"slowdown": 2, "hang": "no"},
    ],
)
def test_apply_control_refuses_bad_bodies_without_changing_anything(body: object) -> None:
    knobs = Knobs()
    with pytest.raises(ControlError):
        apply_control(knobs, body)
    assert knobs == Knobs()


def test_snapshot_reports_knobs_and_counters() -> None:
    state = snapshot(Knobs(crash_after=4), Counters(requests_served=2, in_flight=1))
    assert state == {
        "fail_next_load": False, "crash_after": 4, "slowdown": 1.0, "hang": False,
        "requests_served": 2, "in_flight": 1, "running": 0, "waiting": 0,
    }
