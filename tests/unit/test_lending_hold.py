"""The pure hold rule (reference §3.6) and the lent cut-off formula (reference §3.7).

Times are milliseconds; the worked example of the reference is ``test_the_reference_burst_holds``.
"""

from __future__ import annotations

import pytest

from routerd.lending.cutoff import CutOffRule
from routerd.lending.hold import helper_finish_ms, judge_hold, overrun_at_ms, owner_finish_ms
from routerd.wire.lending import Lease

S = 1000  # one second in ms


def lease(*, job: float = 29 * S, switch: float = 6 * S, service: float = 13 * S, slots: int = 1,
          probe: bool = False) -> Lease:
    return Lease(lane="text", owner_node_id="owner", owner_model_id="A", helper_node_id="helper",
                 helper_model_id="H", load_helper_model=True, restore_helper_model=False,
                 helper_slots=slots, probe=probe, ttl_ms=30_000, owner_job_ms=job,
                 helper_switch_ms=switch, helper_service_ms=service)


def burst(**overrides: object) -> dict[str, object]:
    """The reference burst: the owner finished its first job at +29 s, one request lent at +5 s."""
    args: dict[str, object] = dict(enabled=True, lease=lease(), lease_expires_ms=1_000 * S, in_flight=1,
                                   generating_since_ms=29 * S, now_ms=29 * S, lent_at_ms=[5 * S])
    args.update(overrides)
    return args


def test_the_reference_burst_holds_because_the_helper_finishes_45_s_sooner() -> None:
    verdict = judge_hold(**burst())  # type: ignore[arg-type]
    assert verdict.hold
    assert verdict.keep_ms == 58 * S  # owner finish +58 s
    assert verdict.helper_finish_ms - 29 * S == 13 * S  # helper finish +13 s
    # the alarm: the lent request overruns after its predicted finish plus one owner job,
    # 5 + 6 + 13 + 29 = 53 s
    assert verdict.alarm_ms == 53 * S + 1


def test_a_60_s_helper_does_not_hold() -> None:
    assert not judge_hold(**burst(lease=lease(service=60 * S))).hold  # type: ignore[arg-type]


def test_two_requests_lent_at_once_finish_a_third_after_switch_plus_three_services() -> None:
    assert helper_finish_ms([100 * S, 100 * S], 100 * S, 6 * S, 13 * S) == 100 * S + 6 * S + 3 * 13 * S


def test_the_helper_starts_a_later_lent_request_when_it_arrives_not_before() -> None:
    # lent at 0 and at 100 s: the first is done at 19 s, the second runs 100..113 s, then ours
    assert helper_finish_ms([0, 100 * S], 50 * S, 6 * S, 13 * S) == 126 * S


def test_the_owner_finish_counts_its_current_job_the_others_in_flight_and_this_one() -> None:
    assert owner_finish_ms(0, 10 * S, 1, 29 * S) == 58 * S
    assert owner_finish_ms(0, 10 * S, 2, 29 * S) == 87 * S
    # a job already past its prediction: counted from now
    assert owner_finish_ms(0, 40 * S, 1, 29 * S) == 69 * S


@pytest.mark.parametrize("change", [
    {"enabled": False},
    {"lease": None},
    {"lease_expires_ms": 29 * S},  # expires now: no longer live
    {"lease": lease(probe=True)},
    {"lease": lease(job=0)},  # owner speed unmeasured
    {"lease": lease(service=0)},  # helper speed unmeasured
    {"lease": lease(slots=2)},  # a lent slot is free
    {"now_ms": 53 * S + 1, "generating_since_ms": 53 * S + 1},  # the lent request overran
    {"in_flight": 0},  # the owner would idle
])
def test_any_failing_condition_releases_the_hold(change: dict[str, object]) -> None:
    assert judge_hold(**burst()).hold  # type: ignore[arg-type]
    assert not judge_hold(**burst(**change)).hold  # type: ignore[arg-type]


def test_at_the_overrun_instant_itself_it_still_holds() -> None:
    assert overrun_at_ms(5 * S, 6 * S, 13 * S, 29 * S) == 53 * S
    assert judge_hold(**burst(now_ms=53 * S, generating_since_ms=30 * S)).hold  # type: ignore[arg-type]


def test_the_alarm_is_the_lease_expiry_when_that_comes_first() -> None:
    verdict = judge_hold(**burst(lease_expires_ms=35 * S))  # type: ignore[arg-type]
    assert verdict.hold and verdict.alarm_ms == 35 * S


def test_the_earliest_overrun_of_several_lent_requests_sets_the_alarm() -> None:
    many = burst(lease=lease(slots=2, service=5 * S), lent_at_ms=[24 * S, 25 * S])
    verdict = judge_hold(**many)  # type: ignore[arg-type]
    # two slots: the earliest may wait one service behind the other, then its own, then one owner job
    assert verdict.hold and verdict.alarm_ms == 24 * S + 6 * S + 10 * S + 29 * S + 1


def test_a_request_lent_behind_another_of_a_two_slot_lease_has_not_overrun_when_due() -> None:
    """benchmarks/lending.py (f), issue 24: owner 640 ms a job, a loaded helper 40 ms, two slots.
    The helper answered A at 42 ms (lent at 0) and got C at 43; B, lent at 0 with A, has been in
    service since 42 and is due at 82 plus the way back.  At 85 ms the helper is on schedule, so the
    next request still waits for it; the one-slot formula (0 + 2 x 40 = 80) called B overrun and
    released the hold, and the owner took a third 640 ms job (makespan 1.5 x the optimum)."""
    verdict = judge_hold(now_ms=85, **F_BURST)  # type: ignore[arg-type]
    assert verdict.hold and verdict.alarm_ms == 721  # B: 0 + 40 behind A + 40 + one owner job 640
    assert overrun_at_ms(0, 0, 40, 640, slots=2) == 720 and overrun_at_ms(0, 0, 40, 640) == 680


#: benchmarks/lending.py (f): a 16x faster loaded helper, two slots; A and B lent at 0, C at 43.
F_BURST: dict[str, object] = dict(enabled=True, lease=lease(job=640, switch=0, service=40, slots=2),
                                  lease_expires_ms=30_000, in_flight=1, generating_since_ms=0,
                                  lent_at_ms=[0, 43])


def test_a_helper_stalled_100_ms_keeps_the_held_request_instead_of_costing_a_whole_owner_job() -> None:
    """Issue 24, benchmarks/lending.py (f2): the helper's backend is descheduled for 100 ms, so B
    (due at 80 ms plus the way back) is still out at 221 ms.  Overrun was switch + (slots + 1) x
    service = 120 ms: the hold ended, the owner took the held request as a third 640 ms job and the
    burst ended at 1.4-1.5 x its optimum.  Now the helper has its predicted finish plus one owner
    job (720 ms): the request keeps waiting for it, and the helper still finishes it far sooner
    than the owner (owner 1280 ms, helper 261 ms)."""
    verdict = judge_hold(now_ms=221, **F_BURST)  # type: ignore[arg-type]
    assert verdict.hold and verdict.alarm_ms == 721
    assert (verdict.owner_finish_ms, verdict.helper_finish_ms) == (1280, 261)


def test_a_helper_later_than_its_predicted_finish_plus_one_owner_job_releases_the_hold() -> None:
    """A helper that really hangs: B still out at 721 ms, one owner job past its predicted finish
    (80 ms): released, though the (stale) prediction still says the helper would be sooner."""
    assert judge_hold(now_ms=720, **F_BURST).hold  # type: ignore[arg-type]
    verdict = judge_hold(now_ms=721, **F_BURST)  # type: ignore[arg-type]
    assert not verdict.hold


# -- cut-off ----------------------------------------------------------------------------------------


def test_the_cut_off_is_three_switch_plus_service_and_thirty_seconds() -> None:
    assert CutOffRule().give_up_ms(lease(switch=6 * S, service=13 * S)) == 3 * 19 * S + 30 * S


def test_a_loaded_helper_with_no_switch_still_has_a_limit() -> None:
    assert CutOffRule().give_up_ms(lease(switch=0, service=2 * S)) == 36 * S


@pytest.mark.parametrize("unmeasured", [lease(probe=True), lease(service=0), lease(job=0)])
def test_probes_and_unmeasured_leases_are_never_cut_off(unmeasured: Lease) -> None:
    assert CutOffRule().give_up_ms(unmeasured) is None


def test_a_free_lent_slot_holds_while_the_masters_answer_that_refills_it_is_awaited() -> None:
    """Issue 24: condition 4 counts a slot the awaited answer lends into as busy; with nothing lent
    at all the alarm is the lease's expiry (no lent request can overrun)."""
    assert not judge_hold(**burst(lease=lease(slots=2))).hold  # type: ignore[arg-type]
    assert judge_hold(**burst(lease=lease(slots=2), refilling=True)).hold  # type: ignore[arg-type]
    verdict = judge_hold(**burst(lent_at_ms=[], refilling=True, lease_expires_ms=40 * S))  # type: ignore[arg-type]
    assert verdict.hold and verdict.alarm_ms == 40 * S
