"""DecisionLog: stamping, buffering, one batched write per flush, the cap, pruning, validation."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

import attrs
import pytest
from twisted.internet import task
from twisted.internet.defer import Deferred, fail
from twisted.logger import capturedLogs

from routerd import __version__
from routerd.lending import decisions as decisions_mod
from routerd.lending.decisions import BUFFER_CAP, DecisionLog
from routerd.store.decisions import COLUMNS
from routerd.store.store import Store
from routerd.wire.lending import PlanRow
from tests.support import fired

T = TypeVar("T")
HOUR = 3600.0




class SpyStore:
    """A real in-memory Store that counts the calls the log makes."""

    def __init__(self, clock: task.Clock) -> None:
        self.store = Store.open_sync(clock=clock)
        self.inserts: list[int] = []
        self.prunes: list[int] = []

    def insert_decision_values(self, values: Iterable[tuple[object, ...]]) -> Deferred[None]:
        rows = list(values)
        self.inserts.append(len(rows))
        return self.store.insert_decision_values(rows)

    def query_decisions(self, **filters: Any) -> Deferred[list[dict[str, Any]]]:
        return self.store.query_decisions(**filters)

    def prune_decisions(self, before_ms: int) -> Deferred[int]:
        self.prunes.append(before_ms)
        return self.store.prune_decisions(before_ms)


class BrokenStore(SpyStore):
    def insert_decision_values(self, values: Iterable[tuple[object, ...]]) -> Deferred[None]:
        self.inserts.append(len(list(values)))
        return fail(RuntimeError("disk full"))

    def prune_decisions(self, before_ms: int) -> Deferred[int]:
        raise RuntimeError("database is locked")


def make(retention_s: float = 24 * HOUR, start_at: float = 1000.0,
         store_cls: type[SpyStore] = SpyStore) -> tuple[DecisionLog, SpyStore, task.Clock]:
    clock = task.Clock()
    clock.advance(start_at)
    spy = store_cls(clock)
    return DecisionLog(spy, clock, "node-a", __version__, retention_s), spy, clock


def lent(log: DecisionLog, **extra: Any) -> None:
    log.record("dispatch", "lent", lane="image", owner_model_id="sd", helper_node_id="node-b",
               helper_model_id="sd-b", slots=2, lent_out=1, wait_ms=40, **extra)


def rows(spy: SpyStore, **filters: Any) -> list[dict[str, Any]]:
    return fired(spy.store.query_decisions(limit=5000, **filters))


def test_record_stamps_node_time_and_version_and_only_buffers() -> None:
    log, spy, clock = make()
    clock.advance(0.25)
    lent(log)
    assert spy.inserts == [] and log.pending == 1
    fired(log.flush())
    assert spy.inserts == [1] and log.pending == 0
    (only,) = rows(spy)
    assert only == {"id": 1, "recorded_at": 1_000_250, "node_id": "node-a", "kind": "dispatch",
                    "outcome": "lent", "lane": "image", "owner_model_id": "sd",
                    "helper_node_id": "node-b", "helper_model_id": "sd-b", "slots": 2, "lent_out": 1,
                    "wait_ms": 40.0, "router_version": __version__}


def test_the_loop_writes_each_seconds_buffer_in_one_batch() -> None:
    log, spy, clock = make()
    log.start()
    for _ in range(5):
        lent(log)
    clock.advance(0.5)
    assert spy.inserts == []
    clock.advance(0.5)
    assert spy.inserts == [5]
    clock.advance(1.0)  # nothing buffered: no write at all
    assert spy.inserts == [5]
    lent(log)
    lent(log)
    clock.advance(1.0)
    assert spy.inserts == [5, 2]
    assert len(rows(spy)) == 7
    lent(log)
    fired(log.stop())  # stop writes what is left, and the loop is gone
    assert spy.inserts == [5, 2, 1]
    lent(log)
    clock.advance(10)
    assert spy.inserts == [5, 2, 1] and log.pending == 1


def test_the_buffer_drops_the_oldest_rows_past_the_cap_and_logs_the_count() -> None:
    log, spy, clock = make()
    for i in range(BUFFER_CAP + 3):
        log.record("dispatch", "lent", lane="text", request_id=f"r{i}")
    assert log.pending == BUFFER_CAP
    with capturedLogs() as events:
        fired(log.flush())
    assert spy.inserts == [BUFFER_CAP]
    kept = fired(spy.store.runner.run(
        lambda conn: [r for (r,) in conn.execute("SELECT request_id FROM offload_decisions ORDER BY id")]))
    assert len(kept) == BUFFER_CAP
    assert kept[0] == "r3" and kept[-1] == f"r{BUFFER_CAP + 2}"
    dropped = [e for e in events if e.get("dropped") is not None]
    assert len(dropped) == 1 and dropped[0]["dropped"] == 3
    with capturedLogs() as events:
        fired(log.flush())
    assert not [e for e in events if e.get("dropped") is not None]


def test_prune_runs_at_most_once_a_minute_and_removes_rows_past_the_retention() -> None:
    log, spy, clock = make(retention_s=HOUR)
    fired(spy.store.insert_decisions([
        {"recorded_at": 0, "kind": "plan", "outcome": "probe", "lane": "image"},
        {"recorded_at": 2_000_000, "kind": "plan", "outcome": "probe", "lane": "image"},
    ]))
    clock.advance(HOUR)  # now 4600 s: the first cut-off is 1001 s
    log.start()
    for _ in range(130):
        clock.advance(1.0)
    # ticks at +1 s, +61 s and +121 s prune; the others only flush
    assert len(spy.prunes) == 3
    assert spy.prunes[0] == int((4601 - HOUR) * 1000)
    assert [r["recorded_at"] for r in rows(spy)] == [2_000_000]
    log.set_retention(60.0)
    for _ in range(60):
        clock.advance(1.0)
    assert len(spy.prunes) == 4
    assert rows(spy) == []
    fired(log.stop())


def test_write_and_prune_failures_are_logged_never_raised() -> None:
    log, spy, clock = make(store_cls=BrokenStore)
    lent(log)
    with capturedLogs() as events:
        assert fired(log.flush()) is None
        assert fired(log.prune()) == 0
    failures = [e for e in events if e.get("log_failure") is not None]
    assert len(failures) == 2
    assert failures[0]["count"] == 1
    # the loop keeps going after a failed write
    log.start()
    with capturedLogs():
        lent(log)
        clock.advance(1.0)
        lent(log)
        clock.advance(1.0)
    assert spy.inserts == [1, 1, 1]
    fired(log.stop())


def test_record_plan_rows_uses_the_plan_row_columns() -> None:
    log, spy, _clock = make()
    log.record_plan_rows([
        PlanRow(trigger="enqueued", lane="image", owner_node_id="a", owner_model_id="sd",
                helper_node_id="b", helper_model_id="sd-b", outcome="granted", pending_count=8,
                backlog_count=10, keep_ms=9000.0, switch_ms=2500.0, service_ms=900.0,
                owner_job_ms=1000.0, service_source="helper", helper_idle_ms=12000, slots=2),
        PlanRow(trigger="enqueued", lane="image", owner_node_id="a", owner_model_id="sd",
                helper_node_id="c", helper_model_id="sd-c", outcome="skipped", reason="outranked"),
    ])
    fired(log.flush())
    skipped, granted = sorted(rows(spy, kind="plan"), key=lambda r: r["outcome"], reverse=True)
    assert granted["slots"] == 2 and granted["service_source"] == "helper"
    assert granted["helper_idle_ms"] == 12000 and "reason" not in granted
    assert skipped["reason"] == "outranked" and "slots" not in skipped and "service_source" not in skipped


@pytest.mark.parametrize("kind,outcome,fields", [
    ("audit", "lent", {"lane": "image"}),
    ("plan", "lent", {"lane": "image", "trigger": "tick"}),
    ("dispatch", "granted", {"lane": "image"}),
    ("helper", "relay_refused", {"lane": "text"}),
    ("plan", "skipped", {"lane": "image", "trigger": "tick", "reason": "not_an_owner"}),
    ("dispatch", "relay_refused", {"lane": "image", "reason": "owner_unpriced"}),
    ("plan", "skipped", {"lane": "image", "trigger": "whenever"}),
    ("plan", "skipped", {"lane": "image"}),  # plan rows always name their trigger
    ("helper", "borrowed_returned", {"lane": "text", "trigger": "tick"}),
    ("dispatch", "lent", {"lane": "audio"}),
    ("dispatch", "lent", {}),
    ("plan", "granted", {"lane": "image", "trigger": "tick", "service_source": "guess"}),
    ("dispatch", "lent", {"lane": "image", "colour": "red"}),
    ("dispatch", "lent", {"lane": "image", "node_id": "elsewhere"}),
    ("dispatch", "lent", {"lane": "image", "slots": "2"}),
    ("dispatch", "lent", {"lane": "image", "slots": True}),
    ("dispatch", "lent", {"lane": "image", "helper_node_id": 7}),
])
def test_values_outside_the_enumerations_raise(kind: str, outcome: str, fields: dict[str, Any]) -> None:
    log, _spy, _clock = make()
    with pytest.raises(ValueError):
        log.record(kind, outcome, **fields)
    assert log.pending == 0


@pytest.mark.parametrize("kind,outcome,fields", [
    ("plan", "probe", {"trigger": "probe_due", "reason": "switch_unpriced"}),
    ("plan", "skipped", {"trigger": "tick", "reason": "helper_recently_busy"}),
    ("plan", "skipped", {"trigger": "borrowed_completed", "reason": "restore_unpriced"}),
    ("dispatch", "lease_updated", {"trigger": "grant", "slots": 2}),
    ("dispatch", "lease_cleared", {"trigger": "completed", "lent_out": 1}),
    ("dispatch", "lease_refused", {"reason": "not_an_owner"}),
    ("dispatch", "returned", {"helper_node_id": "b"}),
    ("dispatch", "held_for_helper", {"reason": "helper_finishes_sooner", "keep_ms": 3.5}),
    ("dispatch", "relay_refused", {"reason": "helper_unreachable"}),
    ("dispatch", "stall_reclaimed", {"helper_node_id": "b", "lent_out": 2}),
    ("helper", "native_waited_behind_borrowed", {"borrowed_ahead": 2, "wait_ms": 1200}),
    ("helper", "borrowed_returned", {"reason": "own_work_arrived", "request_id": None}),
    ("queue", "passed_over", {"reason": "swap_avoided", "request_id": "r1", "owner_model_id": "b",
                              "helper_model_id": "a", "wait_ms": 900, "priority": "standard"}),
])
def test_every_spec_decision_is_accepted(kind: str, outcome: str, fields: dict[str, Any]) -> None:
    log, spy, _clock = make()
    log.record(kind, outcome, lane="text", **fields)
    fired(log.flush())
    (only,) = rows(spy)
    assert only["kind"] == kind and only["outcome"] == outcome


def test_enumerations_cover_the_contract() -> None:
    assert set(decisions_mod.KINDS) == {"plan", "dispatch", "helper", "queue", "replica_choice"}
    assert {"restore_unpriced", "helper_recently_busy"} <= decisions_mod.ALL_REASONS
    assert {"held_for_helper", "relay_refused", "stall_reclaimed"} <= decisions_mod.ALL_OUTCOMES


def test_retention_must_be_positive() -> None:
    log, _spy, _clock = make()
    with pytest.raises(ValueError):
        log.set_retention(0)
    with pytest.raises(ValueError):
        make(retention_s=-1)


def test_query_flushes_first() -> None:
    log, spy, _clock = make()
    lent(log)
    lent(log, request_id="r2")
    got = fired(log.query(lane="image", limit=1))
    assert [r["request_id"] for r in got] == ["r2"]
    assert spy.inserts == [2]


def test_start_twice_keeps_one_loop() -> None:
    log, spy, clock = make()
    log.start()
    log.start()
    lent(log)
    clock.advance(1.0)
    assert spy.inserts == [1]
    fired(log.stop())
    fired(log.stop())


def plan_rows(count: int) -> list[PlanRow]:
    """A plan's rows: one granted, the rest skipped (cost_rejected / outranked alternately)."""
    out = [PlanRow(trigger="tick", lane="image", owner_node_id="a", owner_model_id="sd", helper_node_id="b",
                   helper_model_id="sd-b", outcome="granted", pending_count=8, backlog_count=10,
                   keep_ms=9000.0, switch_ms=2500.0, restore_ms=12.5, service_ms=900.0, owner_job_ms=1000.0,
                   service_source="helper", helper_idle_ms=12000, slots=2)]
    for i in range(1, count):
        out.append(PlanRow(trigger="tick", lane="image", owner_node_id="a", owner_model_id="sd",
                           helper_node_id=f"n{i}", helper_model_id="sd-n", outcome="skipped",
                           reason="cost_rejected" if i % 2 else "outranked", pending_count=8,
                           backlog_count=10, keep_ms=9000.0, service_ms=float(i), owner_job_ms=1000.0,
                           service_source="owner_fallback", helper_idle_ms=i))
    return out


def stored(spy: SpyStore) -> list[tuple[Any, ...]]:
    return fired(spy.store.runner.run(lambda conn: list(conn.execute(
        "SELECT * FROM offload_decisions ORDER BY id"))))


def test_a_plans_rows_are_stored_exactly_as_recording_them_one_by_one_stores_them() -> None:
    """The batch path (one buffer entry per plan, values made while writing) writes the very rows
    ``record`` writes for each row's columns: same values, same order, same stamps."""
    one_by_one, spy_a, clock_a = make()
    batched, spy_b, clock_b = make()
    gone = PlanRow("enqueued", "text", "x", "llm", "y", "llm-y", "skipped", "owner_unavailable")
    rows_ = [*plan_rows(5), gone]
    for row in rows_:
        columns = row.columns()
        del columns["kind"]
        outcome = str(columns.pop("outcome"))
        one_by_one.record("plan", outcome, **columns)
    batched.record_plan_rows(rows_)
    assert batched.pending == one_by_one.pending == 6
    fired(one_by_one.flush())
    fired(batched.flush())
    assert stored(spy_b) == stored(spy_a) and len(stored(spy_a)) == 6


def test_a_plan_with_one_bad_row_raises_and_buffers_none_of_its_rows() -> None:
    """Before issue 24 the rows were recorded one by one: those before the bad one stayed buffered."""
    log, spy, _clock = make()
    bad = attrs.evolve(plan_rows(1)[0], reason="no_such_reason")
    for rows_ in ([*plan_rows(3), bad], [*plan_rows(2), attrs.evolve(bad, reason=None, trigger="whenever")],
                  [*plan_rows(2), attrs.evolve(bad, reason=None, lane="audio")],
                  [*plan_rows(2), attrs.evolve(bad, reason=None, service_ms="fast")],
                  [*plan_rows(2), attrs.evolve(bad, reason=None, helper_node_id=7)],
                  [*plan_rows(2), attrs.evolve(bad, reason=None, outcome="lent")]):
        with pytest.raises(ValueError):
            log.record_plan_rows(rows_)
        assert log.pending == 0
    fired(log.flush())
    assert stored(spy) == []


def test_a_plans_rows_become_insert_values_only_when_the_store_reads_them() -> None:
    """Recording a plan makes no per-row object on the caller's turn: the store gets a lazy iterable
    (read on its own thread), and the rows come out of it as it is read."""
    log, spy, _clock = make()
    handed: list[Iterable[tuple[object, ...]]] = []

    def keep(values: Iterable[tuple[object, ...]]) -> Deferred[None]:
        handed.append(values)
        return SpyStore.insert_decision_values(spy, values)

    spy.insert_decision_values = keep  # type: ignore[method-assign]
    lent(log)
    log.record_plan_rows(plan_rows(1000))
    fired(log.flush())
    (values,) = handed
    assert not isinstance(values, Sequence)  # an iterator, not a list made beforehand
    assert spy.inserts == [1001] and len(rows(spy, kind="plan")) == 1000


def test_the_cap_drops_the_oldest_rows_first_also_inside_a_plan() -> None:
    log, spy, _clock = make()
    lent(log, request_id="first")
    lent(log, request_id="second")
    log.record_plan_rows(plan_rows(BUFFER_CAP - 1))  # one too many: "first" goes
    assert log.pending == BUFFER_CAP
    lent(log, request_id="last")  # "second" goes
    lent(log, request_id="later")  # the plan's first row goes
    assert log.pending == BUFFER_CAP
    with capturedLogs() as events:
        fired(log.flush())
    kept = stored(spy)
    assert len(kept) == BUFFER_CAP
    columns = ["id", *COLUMNS]
    first, last = (dict(zip(columns, row, strict=True)) for row in (kept[0], kept[-1]))
    assert first["kind"] == "plan" and first["helper_node_id"] == "n1"  # the granted row 0 dropped
    assert last["request_id"] == "later"
    assert [e["dropped"] for e in events if e.get("dropped") is not None] == [3]
