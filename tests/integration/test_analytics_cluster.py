"""Issue 22 on a real cluster (master + slave on loopback, simulator processes): requests on both
nodes reach the site analytics after a flush, each counted once and on the node that served it; a
load that fails on the slave is in the site's load errors; a benchmark of the slave's model asked of
the master runs on the slave and shows on its record."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest_twisted
import treq

from routerd.config.schema import AnalyticsConfig
from tests.integration.nodes import (
    FAST_TEXT,
    Pair,
    all_healthy,
    knows,
    plan_cluster,
    sim_model,
    start_cluster,
    write_models,
)

ON = AnalyticsConfig(enabled=True)


@pytest_twisted.async_yield_fixture
async def pair(tmp_path: Path) -> AsyncIterator[Pair]:
    plan = plan_cluster(tmp_path, ["slave-a"])
    write_models(plan.root / "master", {"chat": sim_model("chat")},
                 {"chat": FAST_TEXT})
    write_models(plan.root / "slave-a", {
        "chat": sim_model("chat"),
        "solo": sim_model("solo"),
        "broken": {"model": "../weights/solo.sim.json", "extra_args": ["--sim-fail-load"]},
    }, {"chat": FAST_TEXT, "solo": {**FAST_TEXT, "gen_tokens_per_s": 400}})
    cluster = await start_cluster(
        plan, attrs.evolve(plan.master_config(), analytics=ON),
        {"slave-a": attrs.evolve(plan.slave_config("slave-a"), analytics=ON)},
        ready=lambda r: knows(r, **{"slave-a": "solo"}) and all_healthy(r))
    running = Pair(plan, cluster.master, cluster.slaves["slave-a"])
    yield running
    await running.stop()


async def call(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    response = await treq.request(method, url, json=body)
    content = await response.content()
    if not content or response.headers.getRawHeaders(b"content-type", [b""])[0].startswith(b"text/event"):
        return response.code, content
    return response.code, json.loads(content)


@pytest_twisted.ensureDeferred
async def test_requests_on_both_nodes_show_in_site_analytics_once_each_and_a_failed_load_in_load_errors(
        pair: Pair) -> None:
    base = pair.master.url
    chat = {"model": "chat", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8}
    for _ in range(3):
        code, _ = await call("POST", base + "/v1/chat/completions", chat)
        assert code == 200
    for stream in (False, True):
        solo = {**chat, "model": "solo", "stream": stream}
        code, _ = await call("POST", base + "/v1/chat/completions", solo)
        assert code == 200
    code, body = await call("POST", base + "/v1/chat/completions", {**chat, "model": "broken"})
    assert code == 502

    code, flushed = await call("POST", base + "/router/v1/site/analytics/flush")
    assert code == 200 and flushed["node_errors"] == []
    assert {n["node_id"] for n in flushed["nodes"]} == {"master", "slave-a"}

    code, site = await call("GET", base + "/router/v1/site/analytics?period=1h")
    assert code == 200 and site["node_errors"] == []
    nodes = {n["node_id"]: n for n in site["nodes"]}
    models = {(m["model"], m["node_id"]): m for m in site["models"]}
    # the forwarded ones are the slave's rows only (the master leaves them to it): 6 requests in all
    assert site["totals"]["requests"] == 6
    assert models[("solo", "slave-a")]["requests"] == 2
    assert models[("solo", "slave-a")]["completion_tokens"] > 0
    assert models[("solo", "slave-a")]["ttft_p50_ms"] is not None  # the streamed one
    broken = models[("broken", "slave-a")]
    assert broken["errors"] == 1 and broken["load_failures"] == 1
    assert nodes["master"]["requests"] + nodes["slave-a"]["requests"] == 6
    assert sum(m["requests"] for m in site["models"] if m["model"] == "chat") == 3
    assert sum(p["by_lane"]["text"] for p in site["series"]) == 6

    query = "?period=24h&node_id=slave-a&model=solo"
    code, filtered = await call("GET", base + "/router/v1/site/analytics" + query)
    assert code == 200 and [(m["model"], m["node_id"]) for m in filtered["models"]] == [("solo", "slave-a")]

    code, errors = await call("GET", base + "/router/v1/site/load-errors")
    assert code == 200 and errors["node_errors"] == []
    failed = [(e["node_id"], e["model"]) for e in errors["errors"]]
    assert failed == [("slave-a", "broken")]
    first = errors["errors"][0]
    assert "simulated load failure" in "\n".join(first["log_tail"]) + first["reason"]
    code, cleared = await call("DELETE", base + "/router/v1/site/load-errors")
    assert code == 200 and cleared["removed"] == 1
    code, errors = await call("GET", base + "/router/v1/site/load-errors")
    assert errors["errors"] == []


@pytest_twisted.ensureDeferred
async def test_a_benchmark_of_the_slaves_model_asked_of_the_master_runs_on_the_slave(pair: Pair) -> None:
    base = pair.master.url
    code, result = await call("POST", base + "/router/v1/benchmarks/run", {"model": "solo"})
    assert code == 200, result
    assert (result["node_id"], result["model"], result["lane"]) == ("slave-a", "solo", "text")
    assert result["ok"] is True
    figures = result["figures"]
    assert figures["completion_tokens"] == 64 and figures["gen_tokens_per_s"] > 0 and figures["ttft_ms"] > 0
    assert figures["load_ms"] > 0  # solo was not loaded: the run timed its load
    code, history = await call("GET", base + "/router/v1/benchmarks?model=solo")
    assert code == 200
    assert [(r["node_id"], r["id"]) for r in history["benchmarks"]] == [("slave-a", result["id"])]
    code, models = await call("GET", base + "/router/v1/models")
    record = next(m for m in models["models"] if m["node_id"] == "slave-a" and m["local_id"] == "solo")
    assert record["benchmark"]["id"] == result["id"]
    assert (pair.plan.root / "slave-a" / "store" / "benchmarks.json").exists()
