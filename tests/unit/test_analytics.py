"""Analytics (contract §9): rows → rollups → figures, the batching recorder on a Clock, the
site's merge, and the node and site routes of a real in-memory node."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock

from routerd.config.schema import AnalyticsConfig
from routerd.errors import HTTPError
from routerd.inference.analytics import AnalyticsRecorder, LoadErrors, load_row, node_document, request_row
from routerd.routing.call import Call
from routerd.routing.classify import classify
from routerd.site.analytics import merge, parse_query
from routerd.store import analytics as sql
from routerd.store.analytics import (
    HIST_BUCKETS,
    LoadRow,
    Query,
    RequestRow,
    Sums,
    bucket_of,
    figures,
    percentile,
    rollup,
)
from routerd.store.migrations import migrate
from routerd.store.runner import connect

from .node_fixture import IMAGE, TEXT, World

HOUR = 3_600_000
DAY = 24 * HOUR
NOW = 40 * DAY + 5 * HOUR + 17 * 60_000  # a moment well inside a day


def req(at_ms: int, model: str = "chat", *, duration: float = 100.0, status: str = "ok", node: str = "a",
        lane: str = "text", **more: Any) -> RequestRow:
    return RequestRow(at_ms=at_ms, node_id=node, model_id=model, lane=lane, route="openai_chat",
                      status=status, duration_ms=duration, **more)


def db() -> sqlite3.Connection:
    conn = connect(":memory:")
    migrate(conn)
    return conn


# --- the histogram -------------------------------------------------------------------------------------

def test_histogram_buckets_double_every_two_and_percentiles_are_within_their_bucket() -> None:
    assert bucket_of(0) == 0 and bucket_of(1.0) == 0 and bucket_of(1.5) == 1 and bucket_of(2.0) == 2
    assert bucket_of(1e12) == HIST_BUCKETS - 1
    hist = [0] * HIST_BUCKETS
    for ms in [100.0] * 90 + [3000.0] * 10:
        hist[bucket_of(ms)] += 1
    p50, p95 = percentile(hist, 0.5), percentile(hist, 0.95)
    assert p50 is not None and p95 is not None
    assert 100 / 1.19 <= p50 <= 100 * 1.19  # the bucket's geometric middle: within 19 %
    assert 3000 / 1.19 <= p95 <= 3000 * 1.19
    assert percentile([0] * HIST_BUCKETS, 0.5) is None


# --- rollups ---------------------------------------------------------------------------------------------

def test_a_batch_rolls_up_into_minute_hour_and_day_buckets() -> None:
    rows = [req(NOW, prompt_tokens=10, completion_tokens=20, ttft_ms=40.0, duration=240.0),
            req(NOW + 61_000, status="http_500"),
            req(NOW + 2 * HOUR)]
    out = rollup(rows, [LoadRow(NOW, "a", "chat", "chat.kcpps", "text", "failed", 50.0)])
    minutes = sorted(k[1] for k in out if k[0] == "minute")
    hours = sorted(k[1] for k in out if k[0] == "hour")
    days = [k for k in out if k[0] == "day"]
    assert len(minutes) == 3 and len(hours) == 2 and len(days) == 1
    day = out[days[0]]
    assert day.values["requests"] == 3 and day.values["errors"] == 1
    assert day.values["loads"] == 1 and day.values["load_failures"] == 1
    assert day.values["prompt_tokens"] == 10 and day.values["completion_tokens"] == 20
    assert day.values["gen_ms"] == 200.0 and day.values["gen_tokens"] == 20  # duration minus TTFT
    assert sum(day.duration_hist) == 3 and sum(day.ttft_hist) == 1
    assert figures(day)["tokens_per_s"] == 100.0


def test_a_lent_row_counts_only_as_lent_so_the_helpers_borrowed_row_is_not_counted_twice() -> None:
    out = rollup([req(NOW, lent=True), req(NOW, borrowed=True, node="b", completion_tokens=5)], [])
    owner = next(s for k, s in out.items() if k[0] == "day" and k[2] == "a")
    helper = next(s for k, s in out.items() if k[0] == "day" and k[2] == "b")
    assert figures(owner)["requests"] == 0 and figures(owner)["lent"] == 1
    assert sum(owner.duration_hist) == 0
    assert figures(helper)["requests"] == 1 and figures(helper)["borrowed"] == 1


def test_queries_read_rollups_only_and_only_the_period() -> None:
    """The raw rows can be gone (pruned) and the figures stay: charts never scan raw rows."""
    conn = db()
    old = NOW - 3 * DAY
    sql.write_batch(conn, [req(NOW - HOUR, duration=200.0), req(NOW - 2 * HOUR, model="paint", lane="image",
                                                               images=2), req(old)], [])
    conn.execute("DELETE FROM analytics_requests")
    tables, series = sql.query(conn, Query(period="24h"), NOW)
    assert [(t[1], t[3], t[4].values["requests"]) for t in tables] == [("chat", "text", 1),
                                                                     ("paint", "image", 1)]
    start = NOW - NOW % HOUR
    assert sorted({b for b, _lane, _s in series}) == [start - 2 * HOUR, start - HOUR]
    tables, _ = sql.query(conn, Query(period="7d", lane="text"), NOW)
    assert [(t[1], t[4].values["requests"]) for t in tables] == [("chat", 2)]
    tables, _ = sql.query(conn, Query(period="30d", model="paint"), NOW)
    assert [(t[1], t[4].values["images"]) for t in tables] == [("paint", 2)]


def test_two_batches_add_into_the_same_rollup_row() -> None:
    conn = db()
    sql.write_batch(conn, [req(NOW)], [])
    sql.write_batch(conn, [req(NOW + 1000, duration=5000.0)], [])
    tables, _ = sql.query(conn, Query(period="1h"), NOW + 2000)
    assert len(tables) == 1 and tables[0][4].values["requests"] == 2 and sum(tables[0][4].duration_hist) == 2


def test_prune_drops_raw_rows_and_each_level_by_its_own_cutoff() -> None:
    conn = db()
    sql.write_batch(conn, [req(NOW - 10 * DAY), req(NOW)], [LoadRow(NOW - 10 * DAY, "a", "chat", "c", "text",
                                                                     "ok", 5.0)])
    sql.prune(conn, NOW - DAY, {"minute": NOW - HOUR, "hour": NOW - 5 * DAY, "day": 0})
    counts = sql.counts(conn)
    assert counts["analytics_requests"] == 1 and counts["analytics_loads"] == 0
    levels = dict(conn.execute("SELECT level, COUNT(*) FROM analytics_rollups GROUP BY level").fetchall())
    assert levels == {"minute": 1, "hour": 1, "day": 2}


# --- what a finished request becomes -------------------------------------------------------------------

def call_for(path: str, body: dict[str, Any], **fields: Any) -> Call:
    route = classify("POST", path)
    assert route is not None
    call = Call(reply=None, route=route, path=path, body=json.dumps(body).encode(),  # type: ignore[arg-type]
                content_type="application/json", parsed=body, stream=bool(body.get("stream")),
                request_id="r1", started=10.0, selector=body.get("model"))
    for name, value in fields.items():
        setattr(call, name, value)
    return call


def test_request_row_takes_tokens_ttft_flags_and_the_key_name_never_a_key() -> None:
    call = call_for("/v1/chat/completions", {"model": "chat", "stream": True}, key_name="team-a",
                    model_id="chat", borrowed=True)
    call.outcome.work = (12.0, 34.0)
    row = request_row(call, call.route, node_id="n", model_label="chat", status="ok", started=10.0,
                      finished=10.5, first_write=10.1)
    assert row is not None
    assert (row.prompt_tokens, row.completion_tokens, row.key_name, row.borrowed) == (12, 34, "team-a", True)
    assert row.duration_ms == pytest.approx(500.0) and row.ttft_ms == pytest.approx(100.0)
    assert row.lane == "text" and row.route == "chat" and row.at_ms == 10_500


def test_request_row_counts_images_and_vectors_and_skips_what_another_node_records() -> None:
    image = call_for("/v1/images/generations", {"model": "paint", "n": 3})
    row = request_row(image, image.route, node_id="n", model_label="-", status="ok", started=10.0,
                      finished=11.0, first_write=None)
    assert row is not None and row.images == 3 and row.lane == "image" and row.ttft_ms is None
    embed = call_for("/v1/embeddings", {"model": "e", "input": ["a", "b"]})
    row = request_row(embed, embed.route, node_id="n", model_label="-", status="ok", started=10.0,
                      finished=11.0, first_write=None)
    assert row is not None and row.vectors == 2
    forwarded = call_for("/v1/chat/completions", {"model": "chat"}, forwarded_to="slave")
    assert request_row(forwarded, forwarded.route, node_id="m", model_label="chat", status="ok",
                       started=10.0, finished=11.0, first_write=None) is None
    unreachable = request_row(forwarded, forwarded.route, node_id="m", model_label="chat",
                              status="node_unreachable", started=10.0, finished=11.0, first_write=None)
    assert unreachable is not None and unreachable.status == "node_unreachable"


def test_a_failed_load_keeps_the_backends_last_lines_apart_from_its_reason() -> None:
    row = load_row(at_ms=5, node_id="n", model_id="chat", config_filename="chat.kcpps", runtime="text",
                   ok=False, duration_ms=12.0, reason="llama-server exited with code 1; last output:\nx\ny")
    assert row.reason == "llama-server exited with code 1" and row.log_tail == ("x", "y")
    errors = LoadErrors(kept=2)
    for n in range(3):
        errors.add(attrs_evolve(row, at_ms=n))
    errors.add(attrs_evolve(row, status="ok", at_ms=9))
    assert [e["at_ms"] for e in errors.listing()] == [2, 1]  # newest first, bounded, no successes
    assert errors.clear() == 2 and errors.listing() == []


def attrs_evolve(row: LoadRow, **changes: Any) -> LoadRow:
    import attrs
    return attrs.evolve(row, **changes)


# --- the recorder: batched, off the request path -----------------------------------------------------

class FakeStore:
    def __init__(self) -> None:
        self.batches: list[tuple[list[RequestRow], list[LoadRow]]] = []
        self.pruned: list[tuple[int, dict[str, int]]] = []
        self.conn = db()

    def write_analytics(self, requests: list[RequestRow], loads: list[LoadRow],
                        captures: Any = ()) -> Deferred[None]:
        self.batches.append((list(requests), list(loads)))
        sql.write_batch(self.conn, requests, loads)
        return succeed(None)

    def prune_analytics(self, raw_before_ms: int, level_before_ms: dict[str, int],
                        capture_before_ms: int = 0) -> Deferred[int]:
        self.pruned.append((raw_before_ms, dict(level_before_ms)))
        return succeed(0)

    def query_analytics(self, query: Query, now_ms: int) -> Deferred[Any]:
        return succeed(sql.query(self.conn, query, now_ms))


def test_rows_wait_in_memory_until_the_flush_and_a_full_buffer_writes_at_once() -> None:
    clock, store = Clock(), FakeStore()
    recorder = AnalyticsRecorder(clock, AnalyticsConfig(enabled=True, max_buffered=3), "n", lambda: store)
    recorder.request(req(1))
    recorder.request(req(2))
    assert store.batches == [] and recorder.buffered == 2  # no write per request
    recorder.request(req(3))
    assert len(store.batches) == 1 and len(store.batches[0][0]) == 3 and recorder.buffered == 0
    recorder.request(req(4))
    written: list[dict[str, int]] = []
    recorder.tick().addCallback(written.append)
    assert len(store.batches) == 2 and store.pruned  # the tick flushes, and prunes (once an hour)
    clock.advance(60)
    recorder.tick()
    assert len(store.pruned) == 1
    assert recorder.written == {"requests": 4, "loads": 0}


def test_analytics_off_records_no_rows_but_failed_loads_are_still_listed() -> None:
    store = FakeStore()
    recorder = AnalyticsRecorder(Clock(), AnalyticsConfig(enabled=False), "n", lambda: store)
    recorder.request(req(1))
    recorder.load(model_id="chat", config_filename="c", runtime="text", ok=False, duration_ms=3.0,
                  reason="boom")
    assert recorder.buffered == 0
    assert [e["reason"] for e in recorder.load_errors.listing()] == ["boom"]


def test_retentions_become_cutoffs_from_the_clock() -> None:
    clock, store = Clock(), FakeStore()
    clock.advance(NOW / 1000)
    config = AnalyticsConfig(enabled=True, raw_retention=3600.0, minute_retention=60.0, hour_retention=7200.0,
                             day_retention=86400.0)
    AnalyticsRecorder(clock, config, "n", lambda: store).prune()
    assert store.pruned == [(NOW - HOUR, {"minute": NOW - 60_000, "hour": NOW - 2 * HOUR, "day": NOW - DAY})]


# --- the site's merge ----------------------------------------------------------------------------------

def node_doc(node: str, rows: list[RequestRow]) -> dict[str, Any]:
    conn = db()
    sql.write_batch(conn, rows, [])
    query = Query(period="24h")
    tables, series = sql.query(conn, query, NOW)
    return json.loads(json.dumps(node_document(node, query, NOW, True, tables, series)))


def test_the_site_merges_histograms_so_its_p95_is_the_whole_sites_not_an_average() -> None:
    fast = node_doc("a", [req(NOW - 60_000, duration=10.0, node="a") for _ in range(90)])
    slow = node_doc("b", [req(NOW - 60_000, duration=4000.0, node="b") for _ in range(10)])
    site = merge([fast, slow], Query(period="24h"), NOW)
    assert site["totals"]["requests"] == 100
    p95 = site["totals"]["p95_ms"]
    assert 4000 / 1.19 <= p95 <= 4000 * 1.19
    assert [n["node_id"] for n in site["nodes"]] == ["a", "b"]
    assert [(m["model"], m["node_id"]) for m in site["models"]] == [("chat", "a"), ("chat", "b")]
    assert len(site["series"]) == 25  # every hourly bucket of the period, zeros included
    busy = [p for p in site["series"] if p["requests"]]
    assert len(busy) == 1 and busy[0]["by_lane"] == {"text": 100, "image": 0, "stt": 0}
    assert "duration_hist" not in busy[0] and "duration_hist" not in site["models"][0]


def test_a_node_answer_with_junk_fields_counts_them_as_zero() -> None:
    doc = {"node_id": "x", "enabled": True, "models": [{"model": "m", "lane": "text", "requests": "many",
                                                        "p95_ms": "slow"}],
           "totals": {"requests": "many", "duration_hist": ["x", -1, True]},
           "series": [{"t_ms": "soon"}, "junk"]}
    site = merge([doc], Query(period="1h"), NOW)
    assert site["totals"]["requests"] == 0 and site["totals"]["p50_ms"] is None
    assert site["models"][0]["requests"] == 0 and site["models"][0]["p95_ms"] is None


def test_bad_period_or_lane_is_a_400_naming_it() -> None:
    with pytest.raises(HTTPError) as caught:
        parse_query({"period": "2d"})
    assert caught.value.status == 400 and "period" in caught.value.message
    with pytest.raises(HTTPError):
        parse_query({"lane": "video"})
    assert parse_query({}).period == "24h"


def test_sums_survive_the_wire() -> None:
    sums = Sums()
    sums.add_request(req(NOW, ttft_ms=5.0, completion_tokens=3))
    doc = json.loads(json.dumps({**figures(sums), **sql.mergeable(sums)}))
    again = Sums.from_json(doc)
    assert again.duration_hist == sums.duration_hist and again.ttft_hist == sums.ttft_hist
    assert figures(again) == figures(sums)


# --- a real node -----------------------------------------------------------------------------------------

ADMIN = {"authorization": [b"Bearer admin-key-for-analytics"]}


def standalone(tmp_path: Path, enabled: bool = True) -> tuple[World, Any]:
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT}, analytics={"enabled": enabled},
                      auth={"admin_keys": ["admin-key-for-analytics"]})
    world.start(node)
    return world, node


def test_requests_on_a_node_appear_in_its_site_analytics_as_soon_as_they_finish(tmp_path: Path) -> None:
    """A query first writes what is buffered (issue 32: a first run's Overview read 0 requests until
    the flush loop, 3 minutes later); a flush then has nothing left to write."""
    world, node = standalone(tmp_path)
    for stream in (False, True):
        response, _ = world.call("POST", node, "/v1/chat/completions", json={
            "model": "chat", "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
        assert response.code == 200
    assert node.analytics.buffered == 3  # two requests and the model's load, not yet written
    response, body = world.call("GET", node, "/router/v1/site/analytics?period=1h", headers=ADMIN)
    assert json.loads(body)["totals"]["requests"] == 2
    assert node.analytics.buffered == 0 and node.analytics.written == {"requests": 2, "loads": 1}
    response, body = world.call("POST", node, "/router/v1/site/analytics/flush", headers=ADMIN)
    assert response.code == 200 and json.loads(body)["nodes"] == [
        {"node_id": "solo", "written": {"requests": 0, "loads": 0}}]
    response, body = world.call("GET", node, "/router/v1/site/analytics?period=1h", headers=ADMIN)
    document = json.loads(body)
    assert response.code == 200 and document["node_errors"] == []
    totals = document["totals"]
    assert totals["requests"] == 2 and totals["loads"] == 1 and totals["completion_tokens"] > 0
    assert totals["ttft_p50_ms"] is not None  # the streamed one
    assert [(m["model"], m["node_id"], m["lane"]) for m in document["models"]] == [("chat", "solo", "text")]
    response, body = world.call("GET", node, "/router/v1/site/analytics?period=fortnight", headers=ADMIN)
    assert response.code == 400 and "period" in json.loads(body)["error"]["message"]
    world.run(node.stop())


def test_recent_requests_are_listed_newest_first_with_their_key_name(tmp_path: Path) -> None:
    world, node = standalone(tmp_path)
    for content in ("one", "two"):
        world.call("POST", node, "/v1/chat/completions", json={"model": "chat", "messages": [
            {"role": "user", "content": content}]})
    world.call("POST", node, "/router/v1/benchmarks/run", json={"model": "chat"}, headers=ADMIN)
    response, body = world.call("GET", node, "/router/v1/site/analytics/recent?limit=3", headers=ADMIN)
    rows = json.loads(body)["requests"]
    assert response.code == 200 and len(rows) == 3
    assert [r["key_name"] for r in rows] == ["(benchmark)", "", ""]  # a benchmark's request says so
    assert rows[0]["at_ms"] >= rows[1]["at_ms"] >= rows[2]["at_ms"] and rows[0]["ttft_ms"] is not None
    response, body = world.call("GET", node, "/router/v1/site/analytics/recent?lane=video", headers=ADMIN)
    assert response.code == 400
    world.run(node.stop())


def test_a_stop_writes_the_buffered_rows(tmp_path: Path) -> None:
    world, node = standalone(tmp_path)
    world.call("POST", node, "/v1/chat/completions", json={"model": "chat", "messages": []})
    store = world.stores["solo"]
    world.run(node.stop())
    assert node.analytics.written["requests"] == 1
    del store


def test_a_failed_load_is_listed_with_its_reason_and_can_be_cleared(tmp_path: Path) -> None:
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT, "broken": {**TEXT, "load_ms": -1}},
                      auth={"admin_keys": ["admin-key-for-analytics"]})
    world.start(node)
    response, _ = world.call("POST", node, "/v1/chat/completions", json={"model": "broken", "messages": []})
    assert response.code == 502
    response, body = world.call("GET", node, "/router/v1/site/load-errors", headers=ADMIN)
    errors = json.loads(body)["errors"]
    assert response.code == 200 and [(e["node_id"], e["model"]) for e in errors] == [("solo", "broken")]
    assert errors[0]["reason"] and isinstance(errors[0]["log_tail"], list)
    response, body = world.call("DELETE", node, "/router/v1/site/load-errors", headers=ADMIN)
    assert json.loads(body) == {"ok": True, "removed": 1, "node_errors": []}
    response, body = world.call("GET", node, "/router/v1/site/load-errors", headers=ADMIN)
    assert json.loads(body) == {"errors": [], "node_errors": []}
    world.run(node.stop())


def test_a_node_with_analytics_off_answers_enabled_false(tmp_path: Path) -> None:
    world, node = standalone(tmp_path, enabled=False)
    world.call("POST", node, "/v1/chat/completions", json={"model": "chat", "messages": []})
    response, body = world.call("GET", node, "/router/v1/site/analytics", headers=ADMIN)
    document = json.loads(body)
    assert document["nodes"] == [{"node_id": "solo", "enabled": False, **figures(Sums())}]
    assert document["totals"]["requests"] == 0
    world.run(node.stop())


def test_a_request_refused_before_it_was_parsed_is_still_a_row_with_its_status() -> None:
    route = classify("POST", "/v1/chat/completions")
    assert route is not None
    row = request_row(None, route, node_id="n", model_label="-", status="bad_request", started=1.0,
                      finished=1.002, first_write=None)
    assert row is not None and (row.status, row.model_id, row.lane) == ("bad_request", "-", "text")
    assert row.duration_ms == pytest.approx(2.0)


def test_an_image_models_requests_and_loads_share_its_row_under_its_local_id(tmp_path: Path) -> None:
    world = World(tmp_path)
    node = world.node("solo", {"paint": IMAGE}, analytics={"enabled": True},
                      auth={"admin_keys": ["admin-key-for-analytics"]})
    world.start(node)
    response, _ = world.call("POST", node, "/v1/images/generations",
                             json={"model": "paint-paint", "prompt": "a cat", "n": 2})
    assert response.code == 200
    world.call("POST", node, "/router/v1/site/analytics/flush", headers=ADMIN)
    response, body = world.call("GET", node, "/router/v1/site/analytics?period=1h&lane=image", headers=ADMIN)
    rows = json.loads(body)["models"]
    assert [(r["model"], r["requests"], r["images"], r["loads"]) for r in rows] == [("paint", 1, 2, 1)]
    world.run(node.stop())
