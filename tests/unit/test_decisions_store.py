"""The ``offload_decisions`` table through the Store: insert, query filters/order/limit, pruning."""

from __future__ import annotations

from typing import Any, TypeVar

import pytest

from routerd.store.decisions import COLUMNS, MAX_LIMIT
from routerd.store.store import Store
from tests.support import fired

T = TypeVar("T")




class FixedClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def seconds(self) -> float:
        return self.now


def row(at: int, **fields: Any) -> dict[str, Any]:
    return {"recorded_at": at, "node_id": "n1", "kind": "plan", "outcome": "skipped", "lane": "image",
            "router_version": "0.1.0", **fields}


def test_insert_then_query_round_trips_every_column_and_omits_empty_ones() -> None:
    store = Store.open_sync()
    full = row(1000, trigger="enqueued", owner_node_id="a", owner_model_id="m", helper_node_id="b",
               helper_model_id="h", reason="cost_rejected", request_id="r1", pending_count=3,
               backlog_count=5, keep_ms=1200.5, switch_ms=300.0, restore_ms=50.0, service_ms=400.0,
               owner_job_ms=240.0, service_source="owner_fallback", helper_idle_ms=7000,
               slots=2, lent_out=1, borrowed_ahead=1, wait_ms=15, priority="batch", key_name="nightly",
               key_hash="0123456789abcdef", load_ms=2200.0, mean_load_ms=1800.0, moved_from="a:m")
    sparse = {"recorded_at": 2000, "kind": "helper", "outcome": "borrowed_returned", "lane": "text"}
    fired(store.insert_decisions([full, sparse]))
    newest, oldest = fired(store.query_decisions())
    # the sparse row keeps its identifying columns even when empty, and nothing else
    assert newest == {"id": 2, "recorded_at": 2000, "node_id": "", "kind": "helper",
                      "outcome": "borrowed_returned", "lane": "text", "router_version": ""}
    assert oldest == {"id": 1, **full}
    assert set(oldest) == {"id", *COLUMNS}
    assert isinstance(oldest["keep_ms"], float) and isinstance(oldest["slots"], int)


def test_missing_recorded_at_defaults_to_the_store_clock() -> None:
    store = Store.open_sync(clock=FixedClock(12.345))
    fired(store.insert_decisions([{"kind": "plan", "outcome": "probe", "lane": "image"}]))
    assert fired(store.query_decisions())[0]["recorded_at"] == 12345


def test_zero_numbers_and_none_are_omitted() -> None:
    store = Store.open_sync()
    fired(store.insert_decisions([row(1, slots=0, keep_ms=0.0, reason=None, pending_count=None)]))
    (only,) = fired(store.query_decisions())
    assert "slots" not in only and "keep_ms" not in only and "reason" not in only
    assert "pending_count" not in only


def test_insert_is_one_transaction_and_refuses_unknown_columns() -> None:
    store = Store.open_sync()
    with pytest.raises(ValueError, match="no column"):
        fired(store.insert_decisions([row(1), {**row(2), "colour": "red"}]))
    with pytest.raises(ValueError, match="number"):
        fired(store.insert_decisions([row(1, slots="two")]))
    assert fired(store.query_decisions()) == []


def test_empty_insert_does_nothing() -> None:
    store = Store.open_sync()
    assert fired(store.insert_decisions([])) is None
    assert fired(store.query_decisions()) == []


def test_query_orders_newest_first_then_by_id_and_applies_every_filter() -> None:
    store = Store.open_sync()
    fired(store.insert_decisions([
        row(100, lane="image", outcome="granted"),
        row(300, lane="text", outcome="skipped"),
        row(300, lane="image", outcome="skipped"),
        row(200, lane="image", kind="dispatch", outcome="lent"),
        row(50, lane="text", kind="helper", outcome="borrowed_returned"),
    ]))
    ids = [r["id"] for r in fired(store.query_decisions())]
    assert ids == [3, 2, 4, 1, 5]
    assert [r["id"] for r in fired(store.query_decisions(lane="image"))] == [3, 4, 1]
    assert [r["id"] for r in fired(store.query_decisions(outcome="skipped"))] == [3, 2]
    assert [r["id"] for r in fired(store.query_decisions(kind="dispatch"))] == [4]
    assert [r["id"] for r in fired(store.query_decisions(since_ms=200))] == [3, 2, 4]
    assert [r["id"] for r in fired(store.query_decisions(lane="image", outcome="skipped",
                                                          kind="plan", since_ms=300))] == [3]
    assert [r["id"] for r in fired(store.query_decisions(limit=2))] == [3, 2]


def test_limit_defaults_to_200_and_is_capped() -> None:
    store = Store.open_sync()
    fired(store.insert_decisions([row(i) for i in range(MAX_LIMIT + 10)]))
    assert len(fired(store.query_decisions())) == 200
    assert len(fired(store.query_decisions(limit=10**6))) == MAX_LIMIT
    with pytest.raises(ValueError):
        fired(store.query_decisions(limit=0))


def test_prune_removes_rows_recorded_before_the_cut_off() -> None:
    store = Store.open_sync()
    fired(store.insert_decisions([row(100), row(199), row(200), row(300)]))
    assert fired(store.prune_decisions(200)) == 2
    assert [r["recorded_at"] for r in fired(store.query_decisions())] == [300, 200]
    assert fired(store.prune_decisions(200)) == 0


def test_insert_decision_values_reads_a_lazy_iterable_inside_the_write() -> None:
    """Rows made while the store writes them (issue 24: a plan's 8,192 rows are made on the store's
    thread): a generator is consumed by the insert itself, in order."""
    store = Store.open_sync()
    made: list[int] = []

    def values() -> Any:
        for at in (1000, 2000):
            made.append(at)
            yield (at, "n1", "plan", "tick", "image", "a", "m", "b", "h", "skipped", "outranked", "", 3, 5,
                   1200.5, 0.0, 0.0, 400.0, 240.0, "helper", 7000, 0, 0, 0, 0.0, "0.1.0", "", "", "", 0.0,
                   0.0, "")

    d = store.insert_decision_values(values())
    fired(d)
    assert made == [1000, 2000]
    newest, oldest = fired(store.query_decisions())
    assert (newest["recorded_at"], oldest["recorded_at"]) == (2000, 1000)
    assert oldest["reason"] == "outranked" and oldest["helper_idle_ms"] == 7000 and "slots" not in oldest
    assert len(COLUMNS) == 32
