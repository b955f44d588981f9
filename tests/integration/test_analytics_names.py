"""Issue 32 item 2 "One name per model" on a real cluster (master + ``left`` + ``right`` on loopback,
simulator backends, analytics on): ``twin`` is configured on both slaves with different weights, so
the master names right's ``twin`` with a suffix; ``left`` also has a text-only ``text`` and an image
model ``paint``; ``right``'s multimodal ``big`` is the cluster's guardian.  Analytics must name
every model as the Models page does (its public ID, the local ID second), count the guardian answer
on the node that served it under the model the client asked for, and a filter by public ID (or
public image ID) must find the rows; the request log finds a request by its ID, key, model, node,
status and kind, page by page."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest_twisted
import treq

from routerd.config.schema import AnalyticsConfig
from tests.integration import nodes
from tests.integration.nodes import (
    FAST_TEXT,
    plan_cluster,
    sim_model,
    start_cluster,
    wait_until,
    write_models,
)
from tests.integration.test_guardians_flow import Cluster

ON = AnalyticsConfig(enabled=True)
KEY = "sk-team-a-0123456789"
AUTH = {"inference_keys": [{"name": "team-a", "key": KEY}]}
PAINTER = {"kind": "image", "load_ms": 30, "ms_per_step_megapixel": 2}
PNG = "data:image/png;base64,iVBORw0KGgo="


@pytest_twisted.async_yield_fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    plan = plan_cluster(tmp_path, ["left", "right"])
    (plan.root / "master" / "models").mkdir(parents=True)
    write_models(plan.root / "left", {"twin": sim_model("twin-l"), "text": sim_model("text"),
                                      "paint": {"sdmodel": "../weights/paint.sim.json"},
                                      "broken": sim_model("text", extra_args=["--sim-fail-load"])},
                 {"twin-l": FAST_TEXT, "text": FAST_TEXT, "paint": PAINTER})
    write_models(plan.root / "right", {"twin": sim_model("twin-r"),
                                       "big": sim_model("big", mmproj="../weights/proj.gguf")},
                 {"twin-r": {**FAST_TEXT, "gen_tokens_per_s": 300}, "big": FAST_TEXT})
    (plan.root / "right" / "weights" / "proj.gguf").write_bytes(b"projector")
    slaves = {name: attrs.evolve(plan.slave_config(name, sections={"auth": AUTH}), analytics=ON)
              for name in ("left", "right")}
    started = await start_cluster(
        plan, attrs.evolve(plan.master_config(sections={"auth": AUTH}), analytics=ON), slaves,
        ready=lambda r: nodes.knows(r, left="paint", right="big") and nodes.knows(r, right="twin")
        and nodes.all_healthy(r))
    running = Cluster(started.plan, started.master, started.slaves)
    yield running
    await running.stop()


async def call(method: str, url: str, body: Any = None) -> tuple[int, Any, Any]:
    response = await treq.request(method, url, json=body, headers={"Authorization": [f"Bearer {KEY}"]})
    raw = await response.content()
    return response.code, json.loads(raw) if raw else None, response


def chat(model: str, image: bool = False) -> dict[str, Any]:
    content: Any = "hello there"
    if image:
        content = [{"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": PNG}}]
    return {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": content}]}


async def traffic(cluster: Cluster) -> dict[str, Any]:
    """Requests for each name, the guardian setting, a flush; what they were and the inventory."""
    base = cluster.master.url
    code, inventory, _ = await call("GET", base + "/router/v1/site/inventory")
    assert code == 200
    records = {(m["node_id"], m["local_id"]): m for m in inventory["models"]}
    right_twin = records[("right", "twin")]["public_id"]
    assert right_twin != "twin" and records[("left", "twin")]["public_id"] == "twin"
    paint_image = records[("left", "paint")]["public_image_id"]
    assert paint_image and paint_image != records[("left", "paint")]["public_id"]
    code, body, _ = await call("POST", base + "/router/v1/site/guardians", {"guardians": [
        {"scope": "cluster", "guardian": {"node_id": "right", "model_id": "big"}}]})
    assert code == 200, body
    await wait_until(lambda: len(cluster.left.node.lending.guardians) == 1
                     and len(cluster.right.node.lending.guardians) == 1)
    ids: dict[str, str] = {}
    asked = (("twin", chat("twin")), (right_twin, chat(right_twin)), ("guardian", chat("text", True)))
    for name, body in asked:
        code, answer, response = await call("POST", base + "/v1/chat/completions", body)
        assert code == 200, answer
        ids[name] = response.headers.getRawHeaders(b"x-routerd-request-id")[0].decode()
    code, answer, response = await call("POST", base + "/v1/images/generations",
                                        {"model": paint_image, "prompt": "a lighthouse", "size": "256x256"})
    assert code == 200, answer
    ids["paint"] = response.headers.getRawHeaders(b"x-routerd-request-id")[0].decode()
    code, flushed, _ = await call("POST", base + "/router/v1/site/analytics/flush")
    assert code == 200 and flushed["node_errors"] == []
    return {"records": records, "right_twin": right_twin, "paint_image": paint_image, "ids": ids}


@pytest_twisted.ensureDeferred
async def test_analytics_names_every_model_by_the_public_id_the_models_page_shows_and_counts_the_guardian(
        cluster: Cluster) -> None:
    seen = await traffic(cluster)
    records, right_twin = seen["records"], seen["right_twin"]
    code, site, _ = await call("GET", cluster.master.url + "/router/v1/site/analytics?period=1h")
    assert code == 200 and site["node_errors"] == []
    rows = {(m["model"], m["node_id"], m["local_id"]): m for m in site["models"]}
    # right's twin (its requests and its load) is under its public ID, never its local name
    assert rows[(right_twin, "right", "twin")]["requests"] == 1
    assert rows[(right_twin, "right", "twin")]["loads"] >= 1
    assert ("twin", "right", "twin") not in rows
    assert rows[("twin", "left", "twin")]["requests"] == 1
    # the image model has one name: its public ID (the request named its public image ID)
    assert rows[(records[("left", "paint")]["public_id"], "left", "paint")]["images"] == 1
    # the guardian answer: counted by the node that served it, under the model the client asked for
    assert rows[("text", "right", "big")]["guardian"] == 1
    assert rows[("text", "right", "big")]["requests"] == 1
    assert site["totals"]["guardian"] == 1 and site["totals"]["requests"] == 4
    # every other row's name is the public ID the Models page shows for that node and local ID
    for (model, node, local), _row in rows.items():
        if local != "big":
            assert records[(node, local)]["public_id"] == model
    # a filter by public ID finds that model's rows only, one by public image ID the image model's
    code, filtered, _ = await call("GET", cluster.master.url
                                   + f"/router/v1/site/analytics?period=1h&model={right_twin}")
    assert code == 200 and {(m["model"], m["node_id"]) for m in filtered["models"]} == {(right_twin, "right")}
    assert filtered["totals"]["requests"] == 1
    code, filtered, _ = await call("GET", cluster.master.url
                                   + f"/router/v1/site/analytics?period=1h&model={seen['paint_image']}")
    assert code == 200 and [m["local_id"] for m in filtered["models"]] == ["paint"]
    # the recent list names them the same way, the guardian answer with its flag and the key's name
    code, recent, _ = await call("GET", cluster.master.url + "/router/v1/site/analytics/recent")
    assert code == 200
    by_id = {r["request_id"]: r for r in recent["requests"]}
    twin = by_id[seen["ids"][right_twin]]
    assert (twin["model"], twin["local_id"]) == (right_twin, "twin")
    guardian = by_id[seen["ids"]["guardian"]]
    assert (guardian["model"], guardian["node_id"], guardian["local_id"], guardian["guardian"]) == (
        "text", "right", "big", True)
    assert guardian["key_name"] == "team-a"
    # load errors and benchmarks are named the same way
    code, result, _ = await call("POST", cluster.master.url + "/router/v1/benchmarks/run",
                                 {"model": right_twin})
    assert code == 200, result
    code, history, _ = await call("GET", cluster.master.url + "/router/v1/benchmarks")
    assert code == 200
    assert [(b["public_id"], b["model"]) for b in history["benchmarks"]] == [(right_twin, "twin")]


@pytest_twisted.ensureDeferred
async def test_the_request_log_finds_a_request_by_its_id_key_model_node_status_and_kind(
        cluster: Cluster) -> None:
    seen = await traffic(cluster)
    ids = seen["ids"]
    base = cluster.master.url
    code, answer, response = await call("POST", base + "/v1/chat/completions", chat("broken"))
    assert code == 502, answer
    failed_id = response.headers.getRawHeaders(b"x-routerd-request-id")[0].decode()

    async def log(query: str) -> list[dict[str, Any]]:
        code, page, _ = await call("GET", base + "/router/v1/site/requests?" + query)
        assert code == 200 and page["node_errors"] == [], page
        rows: list[dict[str, Any]] = page["requests"]
        return rows

    [row] = await log(f"request_id={ids['guardian']}")
    assert (row["model"], row["node_id"], row["local_id"], row["guardian"], row["key_name"]) == (
        "text", "right", "big", True, "team-a")
    assert {r["request_id"] for r in await log("key_name=team-a")} == {*ids.values(), failed_id}
    assert [r["request_id"] for r in await log(f"model={seen['right_twin']}")] == [ids[seen["right_twin"]]]
    assert [r["request_id"] for r in await log(f"model={seen['paint_image']}")] == [ids["paint"]]
    assert {r["request_id"] for r in await log("node_id=right")} == {ids[seen["right_twin"]], ids["guardian"]}
    [failed] = await log("status=failed")
    assert (failed["request_id"], failed["node_id"], failed["http_status"]) == (failed_id, "left", 502)
    assert "failed to load" in failed["reason"]
    assert [r["request_id"] for r in await log("kind=guardian")] == [ids["guardian"]]
    # page by page (two rows a page) the whole log, newest first, each request once
    pages: list[str] = []
    query = "limit=2"
    while query:
        code, page, _ = await call("GET", base + "/router/v1/site/requests?" + query)
        assert code == 200 and page["node_errors"] == [], page
        pages += [r["request_id"] for r in page["requests"]]
        query = f"limit=2&before={page['next']}" if page["next"] else ""
    assert sorted(pages) == sorted({*ids.values(), failed_id}) and len(pages) == 5
    code, error, _ = await call("GET", base + "/router/v1/site/requests?kind=borrowed")
    assert code == 400 and error["error"]["code"] == "invalid_parameter"
