"""Issue 32 item 5 in a real headless Chromium against a real master and slave (simulator backends,
analytics on): the Requests page lists every node's requests by public ID, filters them (status,
request ID), keeps a selected request ID selected across refreshes, and the Errors page lists the
failed request with the backend's reason above the failed loads."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_twisted
import treq
from twisted.internet import defer

from tests.browser.webui import Browser, Site, running_site
from tests.integration.nodes import FAST_TEXT, plan_cluster, sim_model, write_models

pytestmark = pytest.mark.slow

ANALYTICS = {"enabled": True, "flush_interval": "1h"}  # rows reach the log through its page's flush


@pytest_twisted.async_yield_fixture
async def site(tmp_path: Path) -> AsyncIterator[Site]:
    plan = plan_cluster(tmp_path, ["slave-a"])
    write_models(plan.root / "master", {"alpha": sim_model("alpha")}, {"alpha": FAST_TEXT})
    write_models(plan.root / "slave-a", {
        "beta": sim_model("beta"), "broken": sim_model("beta", extra_args=["--sim-fail-load"])},
        {"beta": FAST_TEXT})
    async with running_site(plan, "broken", sections={"analytics": ANALYTICS}) as running:
        yield running


async def _chat(url: str, model: str) -> tuple[int, str]:
    response = await treq.post(url + "/v1/chat/completions", json={
        "model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "tell me a story"}]})
    await response.content()
    return int(response.code), response.headers.getRawHeaders(b"x-routerd-request-id")[0].decode()


def requests_page(b: Browser, ids: dict[str, str]) -> None:
    b.open("requests")
    b.one("#page-requests")
    b.wait(lambda d: len(b.css("tr.logged-request")) == 5, what="the five requests of both nodes")
    text = b.text("table.request-log")
    assert "alpha" in text and "beta" in text and "slave-a" in text
    failed = b.wait_text('tr.logged-request[data-status="model_load_failed"], tr.logged-request', "broken")
    assert "failed to load" in failed
    b.screenshot("requests")
    # a selected request ID stays selected while the page refreshes
    cell = f'tr[data-request-id="{ids["beta"]}"] td.rid'
    b.js("const r = document.createRange(); r.selectNodeContents(arguments[0]);"
         "getSelection().removeAllRanges(); getSelection().addRange(r);", b.one(cell))
    for _ in range(2):  # the second refresh began after the selection was made (app.js: every 1.5 s)
        before = b.text("#status")
        b.wait(lambda d, before=before: b.text("#status") not in (before, ""), 5, "the page refreshed")
    assert b.js("return getSelection().toString()") == ids["beta"]
    # filters: the failed ones, then one request by its ID
    b.select('select[name="status"]', "failed")
    b.wait(lambda d: len(b.css("tr.logged-request")) == 1 and "broken" in b.text("tr.logged-request"),
           what="only the failed request")
    b.select('select[name="status"]', "")
    b.one('input[name="request_id"]').send_keys(ids["alpha"])
    b.click("button.search")
    b.wait(lambda d: [e.get_attribute("data-request-id") for e in b.css("tr.logged-request")]
           == [ids["alpha"]], what="the request by its ID")


def errors_page(b: Browser, failed_id: str) -> None:
    b.tab("errors")
    row = b.wait_text("table.failed-requests tr.logged-request", "broken")
    assert failed_id in row and "slave-a" in row and "failed to load" in row
    b.wait_text("tr.load-error", "broken")  # the failed load is listed too
    b.screenshot("errors")  # the README's Errors picture (the console test takes one too)


@pytest_twisted.ensureDeferred
async def test_the_requests_page_filters_the_log_and_the_errors_page_lists_failed_requests(
        site: Site) -> None:
    url = site.master.url
    answers = await defer.gatherResults([defer.Deferred.fromCoroutine(_chat(url, model))
                                         for model in ("alpha", "alpha", "beta", "beta")])
    assert all(code == 200 for code, _ in answers)
    code, failed_id = await _chat(url, "broken")
    assert code == 502
    ids = {"alpha": answers[0][1], "beta": answers[2][1]}
    b = site.browser
    await b.do(requests_page, b, ids)
    await b.do(errors_page, b, failed_id)
