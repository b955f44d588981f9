"""The console updates in place (issue 32, item 1), in a real headless Chromium against a real master
and slave (simulator backends): a refresh patches the page instead of rebuilding it, so a text
selection on the Nodes page and an open "last log lines" disclosure on the Errors page survive
seconds of refreshes; the result of a failed Load stays on screen until the operator dismisses it;
a destructive action asks first and does nothing when the operator cancels."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq
from selenium.webdriver.common.keys import Keys
from twisted.internet import defer

from tests.browser.webui import Browser, Site, browsing, running_site
from tests.integration.nodes import (
    FAST_TEXT,
    free_port,
    node_config,
    plan_cluster,
    sim_model,
    start_node,
    write_models,
)

pytestmark = pytest.mark.slow

ANALYTICS = {"enabled": True, "flush_interval": "1h"}  # the failed loads are kept by analytics
#: How long the operator's state must last: more than three refreshes (app.js POLL_MS is 1.5 s).
WATCH_S = 5.0
SETTINGS = "/router/v1/site/offload/settings"
SLOW_LOAD_MS = 8000  # a load the browser sees under way
CHATTY_TOKENS, CHATTY_S = 24, 12.0  # a request in flight through more than three refreshes


@pytest_twisted.async_yield_fixture
async def site(tmp_path: Path) -> AsyncIterator[Site]:
    plan = plan_cluster(tmp_path, ["slave-a"])
    write_models(plan.root / "master",
                 {"alpha": sim_model("alpha"), "slow": sim_model("slow"), "chatty": sim_model("chatty")},
                 {"alpha": FAST_TEXT, "slow": {**FAST_TEXT, "load_ms": SLOW_LOAD_MS},
                  "chatty": {**FAST_TEXT, "gen_tokens_per_s": CHATTY_TOKENS / CHATTY_S}})
    write_models(plan.root / "slave-a",
                 {"beta": sim_model("beta"), "broken": {"model": "../weights/broken.sim.json"}},
                 {"beta": FAST_TEXT})
    (plan.root / "slave-a" / "weights" / "broken.sim.json").write_text("this is not a weights file")
    async with running_site(plan, "beta", sections={"analytics": ANALYTICS}) as running:
        yield running


async def _call(site: Site, method: str, path: str, body: Any = None) -> Any:
    response = await treq.request(method, site.master.url + path, json=body)
    return response.code, await response.json()


async def _failed_load(site: Site) -> None:
    chat = {"model": "broken", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    code, _ = await _call(site, "POST", "/v1/chat/completions", chat)
    assert code >= 500


# -- the steps (blocking; each runs in a thread) ---------------------------------------------------


def start(b: Browser) -> None:
    b.open("")
    b.wait_text("#status", "updated")


def refreshes_go_by(b: Browser) -> None:
    """Let WATCH_S of refreshes go by, and check that the page did refresh meanwhile."""
    before = b.text("#status")
    time.sleep(WATCH_S)
    b.wait(lambda d: b.text("#status") != before and b.text("#status").startswith("updated"), 5,
           "the page refreshed meanwhile")


def selected(b: Browser) -> str:
    return str(b.js("return window.getSelection().toString();"))


def select_text(b: Browser, selector: str) -> str:
    b.js("""const range = document.createRange();
            range.selectNodeContents(document.querySelector(arguments[0]));
            window.getSelection().removeAllRanges();
            window.getSelection().addRange(range);""", selector)
    return selected(b)


def a_selection_on_the_nodes_page_survives_refreshes(b: Browser) -> None:
    """The operator selects the ID of a request in flight (to copy it) and the node's URL."""
    b.tab("nodes")
    rid = '.node-card[data-node-id="master"] table.active td.rid'
    request_id = b.wait(lambda d: b.text(rid), 10, "a request in flight")
    assert select_text(b, rid) == request_id
    refreshes_go_by(b)
    assert b.text(rid) == request_id, "the request ended before the refreshes went by"
    assert selected(b) == request_id, "a refresh lost the selected request ID"
    url = b.text('.node-card[data-node-id="slave-a"] .url')
    assert select_text(b, '.node-card[data-node-id="slave-a"] .url') == url
    refreshes_go_by(b)
    assert selected(b) == url, "a refresh lost the selected URL"
    b.js("window.getSelection().removeAllRanges();")


def an_open_disclosure_stays_open(b: Browser) -> None:
    b.tab("errors")
    b.wait_text("tr.load-error", "broken")
    b.click("tr.load-error details summary")
    b.wait(lambda d: b.css("tr.load-error details[open] pre.log"), 5, "the log lines open")
    refreshes_go_by(b)
    assert b.css("tr.load-error details[open]"), "a refresh closed the last log lines"
    assert b.one("tr.load-error details pre.log").is_displayed()


def a_failed_load_stays_until_dismissed(b: Browser) -> None:
    b.tab("models")
    b.click('tr[data-node-id="slave-a"][data-local-id="broken"] button.load')
    shown = "#banner:not([hidden]), #notices .notice.error"
    message = b.wait_text(shown, "broken", timeout=30)
    assert "502" in message, message
    refreshes_go_by(b)
    notice = b.wait_text(shown, "broken", timeout=0.5)  # still there, not shown again
    assert notice == message
    assert b.one("#notices .notice.error").is_displayed()
    b.screenshot("models-failed-load")
    b.click("#notices .notice.error button.dismiss")
    b.wait(lambda d: not b.css("#notices .notice"), 5, "the notice goes when dismissed")


def loading_is_the_runtimes_state(b: Browser) -> None:
    """A load nobody started from this page shows as under way: the row reads the node's runtime."""
    b.tab("models")
    row = 'tr[data-node-id="master"][data-local-id="slow"]'
    b.wait_text(row, "loading…", timeout=SLOW_LOAD_MS / 1000)
    assert not b.one(f"{row} button.load").is_enabled()
    assert b.one(f"{row} button.load").text == "Loading…"
    b.wait_text(row, "Unload", timeout=SLOW_LOAD_MS / 1000 + 10)
    assert "loading…" not in b.text(row)


@pytest_twisted.ensureDeferred
async def test_refreshes_keep_a_text_selection_and_an_open_disclosure(site: Site) -> None:
    """Every page refreshes every 1.5 s: what the operator selected or opened stays so."""
    b = site.browser
    await _failed_load(site)
    await b.do(start, b)
    chat = {"model": "chatty", "messages": [{"role": "user", "content": "hi"}], "max_tokens": CHATTY_TOKENS}
    answer = defer.Deferred.fromCoroutine(_call(site, "POST", "/v1/chat/completions", chat))
    await b.do(a_selection_on_the_nodes_page_survives_refreshes, b)
    code, _ = await answer
    assert code == 200
    await b.do(an_open_disclosure_stays_open, b)


@pytest_twisted.ensureDeferred
async def test_loading_shows_the_runtimes_state_and_a_failed_loads_result_stays_until_dismissed(
        site: Site) -> None:
    b = site.browser
    await b.do(start, b)
    load = defer.Deferred.fromCoroutine(_call(site, "POST", "/router/v1/site/nodes/load",
                                              {"node_id": "master", "model": "slow"}))
    await b.do(loading_is_the_runtimes_state, b)
    code, _ = await load
    assert code == 200
    await b.do(a_failed_load_stays_until_dismissed, b)


def cancel_then_confirm_clear_the_failed_loads(b: Browser) -> None:
    b.tab("errors")
    b.wait_text("tr.load-error", "broken")
    b.click("button.clear-errors")
    b.confirm("Clear the failed loads?", ok=False)
    refreshes_go_by(b)
    assert "broken" in b.text("tr.load-error"), "cancelled, yet cleared"
    b.click("button.clear-errors")
    b.one("dialog#confirm[open]")
    b.screenshot("confirm")
    b.confirm("Every node forgets its recent failed loads")
    b.wait_text("#load-errors", "No failed loads.")
    b.wait_text("#notices .notice.ok", "Clear the failed loads")


def escape_keeps_every_override(b: Browser) -> None:
    b.tab("lending")
    b.wait_text('#settings tr[data-key="offload_probe_idle"][data-source="db"]', "db")
    b.click("#settings button.clear-all")
    assert "Clear every override?" in b.one("dialog#confirm[open]").text
    b.one("#confirm-cancel").send_keys(Keys.ESCAPE)
    b.wait(lambda d: not b.css("dialog#confirm[open]"), 5, "Escape closes the dialog")


def confirm_clear_every_override(b: Browser) -> None:
    b.click("#settings button.clear-all")
    b.confirm("Clear every override?")
    b.wait_text(".settings-message", "cleared every override")


@pytest_twisted.ensureDeferred
async def test_a_destructive_action_asks_first_and_does_nothing_when_the_operator_cancels(site: Site) -> None:
    b = site.browser
    await _failed_load(site)
    code, _ = await _call(site, "POST", SETTINGS, {"values": {"offload_probe_idle": "250ms"}})
    assert code == 200
    await b.do(start, b)
    await b.do(cancel_then_confirm_clear_the_failed_loads, b)
    code, errors = await _call(site, "GET", "/router/v1/site/load-errors")
    assert code == 200 and errors["errors"] == []

    await b.do(escape_keeps_every_override, b)
    _, settings = await _call(site, "GET", SETTINGS)
    overrides = {e["key"]: e["override"] for e in settings["entries"] if e.get("override") is not None}
    assert overrides == {"offload_probe_idle": "250ms"}, overrides
    await b.do(confirm_clear_every_override, b)
    _, settings = await _call(site, "GET", SETTINGS)
    assert [e["key"] for e in settings["entries"] if e.get("override") is not None] == []


# -- the patch itself (webui/js/dom.js replace), on a standalone node's page ----------------------------

PATCH_SCRIPT = """
const done = arguments[arguments.length - 1];
import("/ui/js/dom.js").then(({ h, replace }) => {
  const box = document.createElement("div");
  document.body.appendChild(box);
  const clicks = [];
  const draw = (version, keys) => replace(box,
    h("details", {}, h("summary", {}, "more"), h("pre", {}, "log lines")),
    h("input", { type: "text", name: "typed", value: "from the page " + version }),
    h("select", { name: "pick" }, ["a", "b", "c"].map((v) => h("option", { value: v }, v))),
    h("button", { type: "button", className: "go", onclick: () => clicks.push(version) }, "Go " + version),
    h("table", {}, h("tbody", {},
      keys.map((k) => h("tr", { dataset: { key: k } }, h("td", {}, "request " + k))))));
  draw(1, ["r1", "r2"]);
  const q = (selector) => box.querySelector(selector);
  const before = { details: q("details"), input: q("input"), row: q('tr[data-key="r2"]'),
    button: q("button") };
  before.details.open = true;
  q("select").value = "c";
  before.input.focus();
  before.input.value = "typed by the operator";
  draw(2, ["r0", "r1", "r2"]);  // a row comes first: r2 moves down
  q("button").click();
  const seen = {
    same_details: q("details") === before.details, open: q("details").open,
    same_row: q('tr[data-key="r2"]') === before.row, rows: box.querySelectorAll("tr").length,
    typed: q("input").value,
    focused: document.activeElement === before.input, pick: q("select").value,
    same_button: q("button") === before.button, label: q("button").textContent, clicks: clicks.slice(),
  };
  before.input.blur();  // a focused field holds the selection: select a request ID instead
  const range = document.createRange();
  range.selectNodeContents(q('tr[data-key="r2"] td'));
  getSelection().removeAllRanges();
  getSelection().addRange(range);
  draw(3, ["r00", "r0", "r1", "r2"]);
  seen.selection = getSelection().toString();
  q("button").setAttribute("aria-busy", "true");
  draw(4, ["r2"]);
  seen.busy_label = q("button").textContent;
  seen.rows_after = box.querySelectorAll("tr").length;
  box.remove();
  done(seen);
}, (err) => done({ error: String(err) }));
"""


@pytest_twisted.ensureDeferred
async def test_a_patch_keeps_the_elements_and_the_operators_state_and_runs_the_new_handlers(
        tmp_path: Path) -> None:
    """dom.js replace() on its own: the same elements stay (a keyed row even when one comes before
    it), with the open disclosure, the selection, the field being typed in and the choice; a
    button's handler is the newest drawing's; a busy button is left as it is."""
    (tmp_path / "models").mkdir()
    node = await start_node(node_config(tmp_path, {"server": {"bind": f"127.0.0.1:{free_port()}"},
                                                   "cluster": {"node_id": "solo"}}))
    async with browsing(node) as b:
        def patch() -> dict[str, Any]:
            b.open("")
            b.wait_text("#status", "updated")
            return dict(b.driver.execute_async_script(PATCH_SCRIPT))
        seen = await b.do(patch)
    assert seen == {
        "same_details": True, "open": True, "same_row": True, "rows": 3, "selection": "request r2",
        "typed": "typed by the operator", "focused": True, "pick": "c",
        "same_button": True, "label": "Go 2", "clicks": [2],
        "busy_label": "Go 3", "rows_after": 1,
    }, seen
