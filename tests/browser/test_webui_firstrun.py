"""Issue 32's first run and smaller console rows in a real headless Chromium.

* A fresh node from the embedded default (``routerd/defaults``, only its port changed), started with
  ``routerd run`` as an operator starts it: it prints the WebUI's address, and after five chats the
  Overview at that address shows the five requests, over 1h (the data spans less than an hour).
* A master with analytics off and its slave: the Overview says analytics is off on the master, with its
  ``/metrics`` counters; Bench runs a model on the node chosen (slave-a) and its one-point chart spans
  two hours, not years; a realtime factor shows two decimals; the slave's ``/ui/`` links to its master.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_twisted
import treq
import yaml
from selenium.webdriver.support.ui import Select

from tests.browser.webui import Browser, Site, browser_missing, running_site, start_chromium
from tests.integration.nodes import FAST_TEXT, free_port, plan_cluster, sim_model, write_models
from tests.integration.processes import stop

pytestmark = pytest.mark.slow

ROUTERD = str(Path(sys.executable).parent / "routerd")
DEFAULTS = Path(__file__).resolve().parents[2] / "routerd" / "defaults"


def embedded_default(folder: Path, port: int) -> Path:
    """The embedded default config and its models in ``folder``, listening on ``port`` instead of 8080."""
    config = yaml.safe_load((DEFAULTS / "default.yaml").read_text())
    config["server"]["bind"] = f"127.0.0.1:{port}"
    assert "analytics" not in config  # the default's own analytics setting is the one under test
    shutil.copytree(DEFAULTS / "models", folder / "models")
    shutil.copytree(DEFAULTS / "weights", folder / "weights")
    path = folder / "default.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def printed_webui(proc: subprocess.Popen[bytes], timeout: float = 60.0) -> tuple[str, str]:
    """The WebUI address ``routerd run`` prints once the node is ready, and what it printed until then."""
    assert proc.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    seen = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if selector.select(timeout=0.5):
            line = proc.stdout.readline()
            seen += line
            found = re.search(rb"WebUI: (http://\S+/ui/)", line)
            if found:
                return found.group(1).decode(), seen.decode()
    raise AssertionError(f"routerd run printed no WebUI address:\n{seen.decode()}")


def chat(base: str, model: str) -> int:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4})
    request = urllib.request.Request(base + "/v1/chat/completions", data=body.encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        answer.read()
        return int(answer.status)


def overview_shows_five_requests_over_one_hour(b: Browser) -> None:
    b.driver.get(b.base)  # the printed address itself
    b.one("#page-overview")
    b.wait(lambda d: b.text('.kpi[data-kpi="requests"] .kpi-value') == "5", timeout=20,
           what="5 requests on the Overview")
    assert b.one(".periods button.active").get_attribute("data-period") == "1h"
    b.wait(lambda d: len(b.css("tr.recent-request")) == 5, what="the five requests listed")
    assert "chat-small" in b.text("#recent-finished")
    assert not b.css(".analytics-off")


def test_a_first_run_prints_the_webui_and_its_overview_shows_five_chats(tmp_path: Path) -> None:
    """``routerd run`` on the embedded default printed no address and recorded no analytics: its
    Overview read 0 requests after real traffic."""
    missing = browser_missing()
    if missing:
        pytest.fail(missing)
    port = free_port()
    config = embedded_default(tmp_path, port)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.Popen([ROUTERD, "run", "--config", str(config)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        webui, _ = printed_webui(proc)
        assert webui == f"http://127.0.0.1:{port}/ui/"
        base = webui.removesuffix("/ui/")
        assert [chat(base, "chat-small") for _ in range(5)] == [200] * 5
        driver = start_chromium()
        try:
            overview_shows_five_requests_over_one_hour(Browser(driver, webui))
        finally:
            driver.quit()
    finally:
        stop(proc, timeout=15)


# -- a master with analytics off and its slave --------------------------------------------------------

OFF = {"analytics": {"enabled": False}}
WHISPER = {"kind": "stt", "load_ms": 20, "realtime_factor": 0.03}


@pytest_twisted.async_yield_fixture
async def site(tmp_path: Path) -> AsyncIterator[Site]:
    plan = plan_cluster(tmp_path, ["slave-a"])
    write_models(plan.root / "master", {"alpha": sim_model("alpha"),
                                        "ear": {"whispermodel": "../weights/ear.sim.json"}},
                 {"alpha": FAST_TEXT, "ear": WHISPER})
    write_models(plan.root / "slave-a", {"alpha": sim_model("alpha")}, {"alpha": FAST_TEXT})
    async with running_site(plan, "alpha", sections=OFF, slave_sections={}) as running:
        yield running


def metrics_requests(url: str) -> int:
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("routerd_requests_total")))


def overview_says_analytics_is_off(b: Browser, answered: int) -> None:
    b.open("")
    note = b.wait_text("#analytics-off .analytics-off", "Analytics is off on master")
    assert "analytics.enabled: false" in note
    link = b.one('#analytics-off li[data-node-id="master"] a')
    assert link.get_attribute("href") == b.base + "/metrics"
    b.wait_text("#analytics-off .metrics-requests", f"{answered} requests answered since it started")


def bench_on_the_chosen_node(b: Browser) -> None:
    b.tab("bench")
    b.select('select[name="model"]', "alpha")
    b.wait(lambda d: {o.get_attribute("value") for o in Select(b.one('select[name="node_id"]')).options}
           == {"", "master", "slave-a"}, what="any node, master and slave-a offered for alpha")
    b.select('select[name="node_id"]', "slave-a")
    b.click("button.run-bench")
    message = b.wait_text(".bench-message .ok", "alpha on slave-a", timeout=60)
    assert "tok/s generation" in message
    b.wait(lambda d: b.css("tr.bench-result td.model-cell small.model-where")
           and b.text("tr.bench-result td.model-cell small.model-where").endswith("slave-a"),
           what="the run in the history, on slave-a")
    chart = "#chart-bench-slave-a_alpha"
    b.wait(lambda d: b.css(chart) and b.one(chart).get_attribute("data-drawn") == "uplot", what="its chart")
    assert b.one(chart).get_attribute("data-points") == "1"
    low, high = (int(b.one(chart).get_attribute(f"data-x-{end}")) for end in ("min", "max"))
    now_ms = int(b.js("return Date.now()"))
    assert high - low == 2 * 3600 * 1000, (low, high)  # the one point ± an hour, not 2027 to 2029
    assert low < now_ms < high


def realtime_factor_has_two_decimals(b: Browser) -> None:
    b.select('select[name="model"]', "ear")
    b.select('select[name="node_id"]', "")
    b.click("button.run-bench")
    message = b.wait_text(".bench-message .ok", "realtime factor", timeout=60)
    assert re.search(r"realtime factor 0\.\d\d,", message), message  # 0.0x, not rate()'s 0.0 or 0.1


def slave_page_links_to_its_master(b: Browser, slave_url: str) -> None:
    b.driver.get(slave_url + "/ui/")
    link = b.one("#banner a.master-link", timeout=20)
    assert link.get_attribute("href") == b.base + "/ui/"
    assert "This node is a slave" in b.text("#banner")


@pytest_twisted.ensureDeferred
async def test_a_master_with_analytics_off_says_so_on_the_overview_with_its_metrics_counters(
        site: Site) -> None:
    """The Overview read 0 requests with a one-line note; now it names the node, the setting and the
    ``/metrics`` counters that count meanwhile."""
    b = site.browser
    for _ in range(3):
        response = await treq.post(site.master.url + "/v1/chat/completions", json={
            "model": "alpha", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert response.code == 200
        await response.content()
    answered = await b.do(metrics_requests, site.master.url)
    assert answered >= 3
    await b.do(overview_says_analytics_is_off, b, answered)


@pytest_twisted.ensureDeferred
async def test_bench_runs_on_the_chosen_node_and_its_one_point_chart_spans_two_hours(site: Site) -> None:
    """The node that runs a bench could not be chosen; a chart of one point ran from 2027 to 2029; a
    realtime factor of 0.0677 read 0.1."""
    b = site.browser
    await b.do(b.open, "bench")
    await b.do(bench_on_the_chosen_node, b)
    await b.do(realtime_factor_has_two_decimals, b)


@pytest_twisted.ensureDeferred
async def test_the_slaves_page_links_to_its_master(site: Site) -> None:
    """The slave's ``/ui/`` said "open the master" without a link (the node knows ``master_url``)."""
    await site.browser.do(slave_page_links_to_its_master, site.browser, site.slave.url)
