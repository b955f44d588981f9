"""Issue 32: one name per model in analytics rows, and the request log (contract §9 "Request log").

Recording: a row names the public ID the client asked for and the local ID that served it, a lent
request's other side, the request ID, the backend's reason and cached tokens.  Store: schema step 6
on a database with version-5 rows, the log's filters, paging, bounds, and that each filter reads an
index.  Routes (a real in-memory node): the page, its filters and its 400s."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.defer import succeed
from twisted.internet.task import Clock

from routerd.config.load import ConfigError, parse_config
from routerd.config.schema import AnalyticsConfig
from routerd.errors import HTTPError
from routerd.inference.analytics import AnalyticsRecorder, recent_json, request_json, request_row
from routerd.routing.forward import key_headers, record_headers
from routerd.routing.work import cached_tokens
from routerd.site.analytics import one_row_each
from routerd.site.names import SiteNames
from routerd.site.requests import before_on, node_cursor, parse_log, site_cursor
from routerd.store import analytics as sql
from routerd.store.migrations import MIGRATIONS, migrate
from routerd.store.request_log import LogQuery, query_log
from routerd.store.runner import connect
from routerd.wire.records import ModelRecord

from .node_fixture import TEXT, World
from .test_analytics import ADMIN, NOW, call_for, db, req, standalone

# --- recording ---------------------------------------------------------------------------------------


def test_a_row_names_the_public_id_the_client_asked_for_and_the_local_id_that_served_it() -> None:
    call = call_for("/v1/chat/completions", {"model": "twin"}, model_id="twin", public_model="twin-2",
                    key_name="team-a")
    call.outcome.work = (10.0, 5.0)
    call.outcome.cached_tokens = 7
    row = request_row(call, call.route, node_id="right", model_label="twin", status="ok", started=10.0,
                      finished=10.2, first_write=None)
    assert row is not None
    assert (row.model_id, row.local_id, row.request_id, row.cached_tokens) == ("twin-2", "twin", "r1", 7)
    failed = call_for("/v1/chat/completions", {"model": "twin"}, model_id="twin", public_model="twin-2")
    failed.outcome.reason = "the backend failed: connection refused"
    row = request_row(failed, failed.route, node_id="right", model_label="twin", status="backend_error",
                      started=10.0, finished=10.2, first_write=None)
    assert row is not None and row.reason == "the backend failed: connection refused"


def test_the_node_a_request_is_sent_to_is_told_the_public_id_the_guardian_mark_and_the_key_name() -> None:
    call = call_for("/v1/chat/completions", {"model": "text"}, public_model="text", guardian=True,
                    key_name="team-a")
    assert record_headers(call) == ((b"x-routerd-key-name", b"team-a"), (b"x-routerd-public-model", b"text"),
                                    (b"x-routerd-as-guardian", b"1"))
    assert key_headers(call)[0] == (b"x-routerd-key-class", b"standard")  # and the key's class when forwarded
    plain = call_for("/v1/chat/completions", {"model": "text"})
    assert record_headers(plain) == ()


def test_a_lent_request_names_owner_and_helper_and_the_owners_successful_half_is_not_listed() -> None:
    owner = req(NOW, "alpha", node="owner", lent=True, local_id="alpha", lent_to="helper/beta",
                request_id="x")
    helper = req(NOW + 5, "alpha", node="helper", borrowed=True, local_id="beta", lent_from="owner/alpha",
                 request_id="x")
    shown = request_json(helper)
    assert (shown["owner"], shown["helper"], shown["lent"], shown["model"], shown["local_id"]) == (
        "owner/alpha", "helper/beta", True, "alpha", "beta")
    assert request_json(owner)["helper"] == "helper/beta"
    assert recent_json([owner]) == []  # its helper's row is the request's one row
    failed = owner._replace(status="stream_broken")
    assert [r["status"] for r in recent_json([failed])] == ["stream_broken"]
    # a failed owner half is dropped by the site where the helper's row is on the same page
    rows = [request_json(helper), request_json(failed)]
    assert [r["node_id"] for r in one_row_each(rows, SiteNames([]))] == ["helper"]


def test_cached_tokens_are_read_from_usage_details_or_llama_timings() -> None:
    answer = b'{"usage": {"prompt_tokens": 40, "prompt_tokens_details": {"cached_tokens": 32}}}'
    assert cached_tokens(answer) == 32
    assert cached_tokens(b'data: {"timings": {"cache_n": 12, "prompt_n": 3}}\n\ndata: [DONE]\n\n') == 12
    assert cached_tokens(b'{"usage": {"prompt_tokens": 4}}') == 0


def record(node: str, local: str, public: str, image: str | None = None) -> ModelRecord:
    return ModelRecord(node_id=node, local_id=local, filename=f"{local}.kcpps", public_id=public,
                       public_image_id=image)


def test_site_names_turn_a_local_name_into_the_public_id_and_an_image_id_into_its_model() -> None:
    names = SiteNames([record("left", "twin", "twin"), record("right", "twin", "twin-2"),
                       record("left", "paint", "paint", "paint-paint")])
    assert names.canonical("paint-paint") == "paint" and names.canonical("twin-2") == "twin-2"
    assert names.of_row("right", "twin", "twin") == "twin-2"  # recorded under its local name
    assert names.of_row("right", "text", "big") == "text"  # a guardian's row keeps the asked model
    assert names.locals_of("twin-2", "right") == ("twin",) and names.locals_of("twin-2", "left") == ()


# --- the store ---------------------------------------------------------------------------------------


def test_step_6_keeps_older_rows_under_their_local_id_and_their_rollups() -> None:
    conn = connect(":memory:")
    migrate(conn, MIGRATIONS[:5])
    conn.execute("INSERT INTO analytics_requests (at_ms, node_id, model_id, lane, route, status, "
                 "duration_ms) VALUES (?, 'a', 'chat', 'text', 'chat', 'ok', 5.0)", (NOW,))
    conn.execute("INSERT INTO analytics_rollups (level, bucket_ms, node_id, model_id, lane, requests) "
                 "VALUES ('hour', ?, 'a', 'chat', 'text', 3)", (NOW - NOW % 3_600_000,))
    migrate(conn)
    assert conn.execute("SELECT local_id, request_id FROM analytics_requests").fetchall() == [("chat", "")]
    tables, _ = sql.query(conn, sql.Query(period="24h"), NOW)
    assert [(t[1], t[2], t[4].values["requests"]) for t in tables] == [("chat", "chat", 3)]


def rows_of(conn: sqlite3.Connection, **filters: object) -> list[str]:
    q = LogQuery(since_ms=0, until_ms=NOW + 10**6, **filters)  # type: ignore[arg-type]
    return [row.request_id for _id, row, _captured in query_log(conn, q)]


def test_the_log_filters_by_request_key_model_status_and_kind_newest_first() -> None:
    conn = db()
    sql.write_batch(conn, [
        req(NOW, "twin-2", node="right", local_id="twin", request_id="a", key_name="team-a"),
        req(NOW + 1, "twin", node="right", local_id="twin", request_id="b"),  # sent to the node directly
        req(NOW + 2, "text", node="right", local_id="big", guardian=True, request_id="c", key_name="team-b"),
        req(NOW + 3, "alpha", node="right", local_id="beta", borrowed=True, lent_from="owner/alpha",
            request_id="d"),
        req(NOW + 4, "twin-2", node="right", local_id="twin", status="backend_error", request_id="e",
            reason="the backend failed"),
        req(NOW + 5, "alpha", node="right", local_id="alpha", lent=True, lent_to="helper/beta",
            request_id="f"),
    ], [])
    assert rows_of(conn) == ["e", "d", "c", "b", "a"]  # the owner's successful lent half is not listed
    assert rows_of(conn, request_id="c") == ["c"]
    assert rows_of(conn, key_name="team-a") == ["a"]
    assert rows_of(conn, model="twin-2") == ["e", "a"]
    assert rows_of(conn, model="twin-2", locals=("twin",)) == ["e", "b", "a"]
    assert rows_of(conn, model="text") == ["c"]  # not the guardian's own model
    assert rows_of(conn, status="failed") == ["e"] and rows_of(conn, status="backend_error") == ["e"]
    assert rows_of(conn, status="ok") == ["d", "c", "b", "a"]
    assert rows_of(conn, kind="lent") == ["d"] and rows_of(conn, kind="guardian") == ["c"]
    assert rows_of(conn, lane="image") == []
    # since ≤ at < until
    [(_id, row, _captured)] = query_log(conn, LogQuery(since_ms=NOW + 4, until_ms=NOW + 5))
    assert (row.request_id, row.reason, row.guardian) == ("e", "the backend failed", False)


def test_pages_follow_the_cursor_without_repeating_or_skipping_rows_of_one_millisecond() -> None:
    conn = db()
    sql.write_batch(conn, [req(NOW + (i // 3), request_id=f"r{i}") for i in range(10)], [])
    seen: list[str] = []
    before = None
    while True:
        page = query_log(conn, LogQuery(since_ms=0, until_ms=NOW + 100, limit=4, before=before))
        seen += [row.request_id for _id, row, _captured in page]
        if len(page) < 4:
            break
        before = (page[-1][1].at_ms, page[-1][0])
    assert seen == [f"r{i}" for i in reversed(range(10))]


@pytest.mark.parametrize("filters", [{"request_id": "x"}, {"key_name": "k"}, {"model": "m"},
                                     {"model": "m", "locals": ("l",)}, {"status": "failed"}, {}])
def test_every_filter_of_the_log_reads_an_index_never_the_whole_table(filters: dict[str, object]) -> None:
    conn = db()
    q = LogQuery(since_ms=0, until_ms=NOW, **filters)  # type: ignore[arg-type]
    traced: list[str] = []
    conn.set_trace_callback(traced.append)
    query_log(conn, q)
    conn.set_trace_callback(None)
    [statement] = [t for t in traced if t.startswith("SELECT")]
    plan = " ".join(str(r[-1]) for r in conn.execute("EXPLAIN QUERY PLAN " + statement))
    assert "USING INDEX" in plan and "SCAN analytics_requests" not in plan.replace("USING INDEX", "")


def test_a_site_cursor_is_read_by_each_node_in_at_node_id_order() -> None:
    assert site_cursor("17:gpu-b:42") == (17, "gpu-b", 42)
    assert before_on("gpu-b", (17, "gpu-b", 42)) == (17, 42)
    earlier_node = before_on("gpu-a", (17, "gpu-b", 42))
    assert earlier_node is not None and earlier_node[0] == 17 and earlier_node[1] > 10**12
    assert node_cursor(f"{earlier_node[0]}:{earlier_node[1]}") == earlier_node  # a node reads it back
    assert before_on("gpu-c", (17, "gpu-b", 42)) == (17, 0)
    assert before_on("gpu-c", None) is None


@pytest.mark.parametrize(("args", "named"), [
    ({"limit": "0"}, "limit"), ({"limit": "501"}, "limit"), ({"lane": "video"}, "lane"),
    ({"since_ms": "yesterday"}, "since_ms"), ({"since_ms": "10", "until_ms": "5"}, "until_ms"),
    ({"kind": "borrowed"}, "kind"), ({"status": "Not OK"}, "status"),
    ({"request_id": "x" * 65}, "request_id"),
])
def test_a_bad_filter_is_a_400_naming_it(args: dict[str, str], named: str) -> None:
    with pytest.raises(HTTPError) as raised:
        parse_log(args, NOW)
    assert raised.value.status == 400 and named in raised.value.message
    with pytest.raises(HTTPError):
        site_cursor("12-gpu-a-3")


# --- the routes of a real in-memory node ---------------------------------------------------------------


def test_the_request_log_finds_a_request_by_id_model_and_status_and_pages(tmp_path: Path) -> None:
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT, "broken": {**TEXT, "load_ms": -1}}, analytics={"enabled": True},
                      auth={"admin_keys": ["admin-key-for-analytics"]})
    world.start(node)
    ids = []
    for content in ("one", "two", "three"):
        response, _ = world.call("POST", node, "/v1/chat/completions", json={
            "model": "chat", "messages": [{"role": "user", "content": content}]})
        ids.append(response.headers.getRawHeaders(b"x-routerd-request-id")[0].decode())
    response, _ = world.call("POST", node, "/v1/chat/completions", json={"model": "broken", "messages": []})
    assert response.code == 502
    failed_id = response.headers.getRawHeaders(b"x-routerd-request-id")[0].decode()
    # no flush asked: the page writes the node's buffer first
    response, body = world.call("GET", node, f"/router/v1/site/requests?request_id={ids[1]}", headers=ADMIN)
    page = json.loads(body)
    assert response.code == 200 and [r["request_id"] for r in page["requests"]] == [ids[1]]
    assert page["requests"][0]["model"] == "chat" and page["next"] is None
    response, body = world.call("GET", node, "/router/v1/site/requests?status=failed", headers=ADMIN)
    [failed] = json.loads(body)["requests"]
    assert (failed["request_id"], failed["model"], failed["http_status"]) == (failed_id, "broken", 502)
    assert "failed to load" in failed["reason"]
    seen: list[str] = []
    path = "/router/v1/site/requests?model=chat&limit=2"
    while path:
        response, body = world.call("GET", node, path, headers=ADMIN)
        page = json.loads(body)
        seen += [r["request_id"] for r in page["requests"]]
        path = f"/router/v1/site/requests?model=chat&limit=2&before={page['next']}" if page["next"] else ""
    assert seen == list(reversed(ids))
    response, body = world.call("GET", node, "/router/v1/site/requests?limit=0", headers=ADMIN)
    error = json.loads(body)["error"]
    assert response.code == 400 and error["code"] == "invalid_parameter" and "limit" in error["message"]
    response, body = world.call("GET", node, "/router/v1/site/requests?before=junk", headers=ADMIN)
    assert response.code == 400 and "before" in json.loads(body)["error"]["message"]
    world.run(node.stop())


def test_a_node_with_analytics_off_has_an_empty_log(tmp_path: Path) -> None:
    world, node = standalone(tmp_path, enabled=False)
    world.call("POST", node, "/v1/chat/completions", json={"model": "chat", "messages": []})
    response, body = world.call("GET", node, "/router/v1/site/requests", headers=ADMIN)
    assert response.code == 200 and json.loads(body)["requests"] == []
    world.run(node.stop())


# --- request bodies: never stored unless the operator asks -------------------------------------------


def test_no_body_is_stored_by_default_and_one_named_by_key_or_model_is_cut_at_the_cap(tmp_path: Path) -> None:
    assert (AnalyticsConfig().capture_keys, AnalyticsConfig().capture_models) == ((), ())
    models = {"config_dir": str(tmp_path)}
    config = parse_config({"models": models, "analytics": {
        "enabled": True, "capture_keys": ["team-debug"], "capture_models": ["twin-2"], "capture_max_bytes": 8,
        "capture_retention": "2h"}}, str(tmp_path), {}).analytics
    assert (config.capture_keys, config.capture_models, config.capture_max_bytes,
            config.capture_retention) == (("team-debug",), ("twin-2",), 8, 7200.0)
    with pytest.raises(ConfigError):
        parse_config({"models": models, "analytics": {"capture_max_bytes": 0}}, str(tmp_path), {})
    stored: list[Any] = []

    class Store:
        def write_analytics(self, requests: Any, loads: Any, captures: Any = ()) -> Any:
            stored.extend(captures)
            return succeed(None)

    body = b'{"model": "twin", "messages": []}'
    for cfg in (AnalyticsConfig(enabled=True), config):
        recorder = AnalyticsRecorder(Clock(), cfg, "n", lambda: Store())  # type: ignore[arg-type,return-value]
        recorder.request(req(NOW, "chat", key_name="team-a", request_id="a"), body, "application/json")
        recorder.request(req(NOW, "chat", key_name="team-debug", request_id="b"), body, "application/json")
        recorder.request(req(NOW, "twin-2", local_id="twin", request_id="c"), body, "application/json")
        recorder.request(req(NOW, "twin", local_id="twin", request_id="d"), body, "application/json")
        recorder.flush()
    assert [(c.request_id, c.body, c.size) for c in stored] == [("b", body[:8], len(body)),
                                                               ("c", body[:8], len(body))]


def test_a_captured_body_is_shown_by_request_id_and_pruned_after_its_retention(tmp_path: Path) -> None:
    world = World(tmp_path)
    node = world.node("solo", {"chat": TEXT}, auth={"admin_keys": ["admin-key-for-analytics"]},
                      analytics={"enabled": True, "capture_models": ["chat"], "capture_max_bytes": 40})
    world.start(node)
    chat = {"model": "chat", "messages": [{"role": "user", "content": "a body worth keeping " * 4}]}
    response, _ = world.call("POST", node, "/v1/chat/completions", json=chat)
    request_id = response.headers.getRawHeaders(b"x-routerd-request-id")[0].decode()
    response, body = world.call("GET", node, f"/router/v1/site/requests?request_id={request_id}",
                                headers=ADMIN)
    assert [r["captured"] for r in json.loads(body)["requests"]] == [True]
    response, body = world.call("GET", node, f"/router/v1/site/requests/body?request_id={request_id}",
                                headers=ADMIN)
    [capture] = json.loads(body)["captures"]
    assert response.code == 200 and capture["truncated"] is True and capture["size"] > 40
    assert capture["body"] == json.dumps(chat, separators=(",", ":"))[:40] and capture["model"] == "chat"
    response, body = world.call("GET", node, "/router/v1/site/requests/body", headers=ADMIN)
    assert response.code == 400 and "request_id" in json.loads(body)["error"]["message"]
    store = world.stores["solo"]
    world.run(store.prune_analytics(0, {}, capture_before_ms=int(world.clock.seconds() * 1000) + 1))
    response, body = world.call("GET", node, f"/router/v1/site/requests/body?request_id={request_id}",
                                headers=ADMIN)
    assert json.loads(body)["captures"] == []
    world.run(node.stop())
