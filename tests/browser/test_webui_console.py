"""The console pages of issue 22 in a real headless Chromium against a real master and slave
(simulator backends, analytics on): Overview (KPIs, the "Requests by lane" chart drawn by the
vendored uPlot, a failed load under "Needs attention", node cards), Analytics (filters, per-model and
per-node tables, charts), Errors (the failed load, Clear), Cook (preview, apply, the model in the
inventory, delete) and Bench.  The pages also work without the chart library (tables)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq
from selenium.webdriver.support.ui import Select
from twisted.internet import defer

from tests.browser.webui import Browser, Site, running_site
from tests.integration.nodes import FAST_TEXT, plan_cluster, sim_model, wait_until, write_models

pytestmark = pytest.mark.slow

ANALYTICS = {"enabled": True, "flush_interval": "1h"}  # the test flushes when it wants rows written


@pytest_twisted.async_yield_fixture
async def site(tmp_path: Path) -> AsyncIterator[Site]:
    plan = plan_cluster(tmp_path, ["slave-a"])
    write_models(plan.root / "master", {"alpha": sim_model("alpha")},
                 {"alpha": FAST_TEXT})
    write_models(plan.root / "slave-a", {
        "beta": sim_model("beta"),
        "broken": {"model": "../weights/broken.sim.json"},
    }, {"beta": FAST_TEXT, "brew": FAST_TEXT})
    (plan.root / "slave-a" / "weights" / "broken.sim.json").write_text("this is not a weights file")
    slave_models = {"file_roots": [str(plan.root / "slave-a" / "weights")]}
    async with running_site(plan, "beta", sections={"analytics": ANALYTICS},
                            slave_sections={"analytics": ANALYTICS, "models": slave_models}) as running:
        yield running


async def _post(url: str, body: Any = None, method: str = "POST") -> int:
    response = await treq.request(method, url, json=body if body is not None else {})
    await response.content()
    return int(response.code)


async def _traffic(site: Site) -> None:
    """Chats on both nodes, one load that fails, then every node's analytics written."""
    chat = {"messages": [{"role": "user", "content": "tell me a short story"}], "max_tokens": 8}
    codes = await defer.gatherResults([defer.Deferred.fromCoroutine(
        _post(site.master.url + "/v1/chat/completions", {**chat, "model": model}))
        for model in ("alpha", "alpha", "alpha", "beta", "beta")])
    assert all(code == 200 for code in codes)
    assert await _post(site.master.url + "/v1/chat/completions", {**chat, "model": "broken"}) >= 400
    assert await _post(site.master.url + "/router/v1/site/analytics/flush") == 200


# -- the steps (blocking; each runs in a thread) ---------------------------------------------------


def overview(b: Browser) -> None:
    b.open("")  # the first page is the Overview
    b.one("#page-overview")
    b.wait_text('.kpi[data-kpi="requests"] .kpi-value', "6")
    b.wait(lambda d: b.one("#chart-lanes").get_attribute("data-drawn") == "uplot", what="uPlot drew it")
    assert b.css("#chart-lanes canvas"), "a canvas from uPlot"
    assert int(b.one("#chart-lanes").get_attribute("data-points")) >= 24
    b.wait_text("#attention-list", "broken")
    assert "failed load" in b.text("#attention-list")
    b.wait_text('.overview-node[data-node-id="slave-a"]', "healthy")
    b.wait(lambda d: len(b.css("tr.recent-request")) >= 5, what="the newest requests of both nodes")
    assert "beta" in b.text("#recent-finished") and "alpha" in b.text("#recent-finished")
    b.screenshot("overview")
    b.click('.periods button[data-period="7d"]')
    b.wait(lambda d: int(b.one("#chart-lanes").get_attribute("data-points")) >= 7 * 24,
           what="hourly points over 7 days")


def analytics(b: Browser) -> None:
    b.tab("analytics")
    b.wait_text("table.figures.models", "alpha")
    assert "beta" in b.text("table.figures.models")
    assert "slave-a" in b.text("table.figures.nodes")
    b.wait(lambda d: b.one("#chart-requests").get_attribute("data-drawn") == "uplot", what="requests chart")
    b.screenshot("analytics")
    b.wait(lambda d: len(Select(b.one('select[name="node_id"]')).options) >= 3, what="the node choices")
    b.select('select[name="node_id"]', "slave-a")
    b.wait(lambda d: "alpha" not in b.text("table.figures.models")
           and "beta" in b.text("table.figures.models"), what="only slave-a's models")


def errors(b: Browser) -> None:
    b.tab("errors")
    row = b.wait_text("tr.load-error", "broken")
    assert "slave-a" in row
    b.screenshot("errors")
    b.click("button.clear-errors")
    b.confirm("Clear the failed loads?")
    b.wait_text("#load-errors", "No failed loads.")


def cook(b: Browser) -> None:
    b.tab("cook")
    b.wait(lambda d: any(o.get_attribute("value") == "slave-a" for o in Select(b.one("#cook-node")).options),
           what="slave-a offered")
    b.select("#cook-node", "slave-a")
    b.wait(lambda d: any(o.get_attribute("value") == "brew.sim.json"
                         for o in Select(b.one("#cook-model")).options), what="the slave's files offered")
    b.one("#cook-id").send_keys("brew")
    b.select("#cook-model", "brew.sim.json")
    b.one("#cook-contextsize").send_keys("2048")
    b.one("#cook-parallel").send_keys("2")
    b.click("button.preview")
    result = b.wait_text("#cook-result", "routerd check: ok")
    assert "preview" in result and '"contextsize": 2048' in b.text("pre.kcpps")
    b.screenshot("cook")
    b.click("button.apply")
    b.wait_text("#cook-result", "applied")
    b.wait_text("#cooked-list", "brew")


def cook_refusal_and_delete(b: Browser) -> None:
    b.click("button.apply")  # the same again: it exists
    b.wait_text(".cook-error", "exists")
    b.click('#cooked-list tr[data-id="brew"] button.delete')
    b.confirm("Delete the config brew on slave-a?")
    b.wait_text("#cooked-list", "none")


def bench(b: Browser) -> None:
    b.tab("bench")
    b.wait(lambda d: len(Select(b.one('select[name="model"]')).options) >= 2, what="models offered")
    for _ in range(2):  # two runs: a history and a line in the model's chart
        b.select('select[name="model"]', "alpha")
        b.click("button.run-bench")
        b.wait(lambda d: "running" not in b.text(".bench-message") and b.text(".bench-message"),
               timeout=60, what="the run finishes")
        assert "tok/s generation" in b.text(".bench-message"), b.text(".bench-message")
    b.wait(lambda d: len(b.css("tr.bench-result")) >= 2, what="both runs in the history")
    assert "text-v1" in b.text("#bench-history")
    b.wait(lambda d: b.one("#chart-bench-master_alpha").get_attribute("data-drawn") == "uplot",
           what="the model's chart")
    assert b.one("#chart-bench-master_alpha").get_attribute("data-points") == "2"
    b.screenshot("bench")


def without_the_chart_library(b: Browser) -> None:
    """The library cannot load (blocked): the chart's table is shown open instead, the page works."""
    b.driver.execute_cdp_cmd("Network.enable", {})
    b.driver.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["*uPlot.esm.js*"]})
    b.driver.get("about:blank")
    b.open("analytics")
    b.wait(lambda d: b.one("#chart-requests").get_attribute("data-drawn") == "table", what="the table")
    assert b.one("#chart-requests details").get_attribute("open") is not None
    assert not b.css("#chart-requests canvas")
    b.wait_text("table.figures.models", "alpha")
    b.driver.execute_cdp_cmd("Network.setBlockedURLs", {"urls": []})


@pytest_twisted.ensureDeferred
async def test_an_operator_reads_the_overview_analytics_and_errors_then_cooks_a_model_and_opens_bench(
        site: Site) -> None:
    b = site.browser
    await _traffic(site)
    await b.do(overview, b)
    await b.do(analytics, b)
    await b.do(errors, b)
    await b.do(cook, b)
    registry = site.master.node.master.registry  # type: ignore[union-attr]
    await wait_until(lambda: registry.find("slave-a", local_id="brew") is not None)
    await b.do(cook_refusal_and_delete, b)
    assert not (site.plan.root / "slave-a" / "models" / "brew.kcpps").exists()
    await b.do(bench, b)
    await b.do(without_the_chart_library, b)
