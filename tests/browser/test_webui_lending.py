"""The Lending tab read on a laptop (issue 32 item 6), in a real headless Chromium at 1280 x 800
against a real master and slave (simulator backends) whose decision logs hold 2,500 rows with the
long names and long enumeration values a real site writes: the folded table shows every column, the
helper's included, one text line per row; outcomes, reasons and triggers are shown in words with the
code as the tooltip; the counts say which window of rows they cover; and the live tail shows a
decision the slave records a moment later, without a reload."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from tests.browser.webui import WIDTH, Browser, Site, running_site
from tests.integration.nodes import FAST_TEXT, RunningNode, plan_cluster, sim_model, write_models

pytestmark = pytest.mark.slow

WORDS: dict[str, dict[str, str]] = json.loads(
    (Path(__file__).resolve().parents[2] / "webui" / "js" / "lending-words.json").read_text(encoding="utf-8"))
#: Names as long as a real site's (the demo's were of this size).
OWNER = ("master", "llama-3.1-8b-instruct-q4")
HELPER = ("slave-a", "qwen2.5-14b-instruct-q4")
#: (kind, trigger, outcome, reason) of the seeded lines: the longest words each column can get.
SEEDED: list[tuple[str, str, str, str]] = [
    ("plan", "borrowed_completed", "skipped", "helper_claimed"),
    ("plan", "enqueued", "granted", ""),
    ("plan", "probe_due", "probe", "cost_rejected"),
    ("dispatch", "borrowed_completed", "held_for_helper", "helper_finishes_sooner"),
    ("dispatch", "", "relay_refused", "helper_unreachable"),
    ("dispatch", "grant", "lease_updated", ""),
    ("helper", "", "native_waited_behind_borrowed", ""),
    ("helper", "", "borrowed_returned", "helper_busy_on_arrival"),
]
ROWS_PER_NODE = 1250


@pytest_twisted.async_yield_fixture
async def site(tmp_path: Path) -> AsyncIterator[Site]:
    plan = plan_cluster(tmp_path, ["slave-a"])
    write_models(plan.root / "master", {"alpha": sim_model("alpha")}, {"alpha": FAST_TEXT})
    write_models(plan.root / "slave-a", {"beta": sim_model("beta")}, {"beta": FAST_TEXT})
    async with running_site(plan, "beta", sections={}) as running:
        await _seed(running.master, "master")
        await _seed(running.slave, "slave-a")
        yield running


async def _seed(node: RunningNode, node_id: str) -> None:
    """``ROWS_PER_NODE`` rows of the ``SEEDED`` kinds straight into ``node``'s log, the newest a
    minute old."""
    now = int(time.time() * 1000)
    rows = []
    for i in range(ROWS_PER_NODE):
        kind, trigger, outcome, reason = SEEDED[i % len(SEEDED)]
        rows.append({"recorded_at": now - 60_000 - 10 * i, "node_id": node_id, "kind": kind,
                     "trigger": trigger, "lane": "text", "owner_node_id": OWNER[0],
                     "owner_model_id": OWNER[1], "helper_node_id": HELPER[0],
                     "helper_model_id": HELPER[1], "outcome": outcome,
                     "reason": reason, "request_id": f"chatcmpl-{node_id}-{i:06d}-0123456789abcdef",
                     "pending_count": i % 7, "keep_ms": 1234.5, "router_version": "seed"})
    store = node.node.store
    assert store is not None
    await store.insert_decisions(rows)


#: The table's geometry: the helper header against the scroll box, and each line's height against
#: one text line of its first cell (line height, padding and border).
GEOMETRY = """
const box = document.querySelector('.decisions');
const tail = document.querySelector('.tail');
const heads = [...box.querySelectorAll('table.folded thead th')];
const helper = heads.find((th) => th.textContent.trim() === 'helper');
const line = (td) => {
  const s = getComputedStyle(td);
  return parseFloat(s.lineHeight) + parseFloat(s.paddingTop) + parseFloat(s.paddingBottom)
    + parseFloat(s.borderBottomWidth);
};
return {
  inner: window.innerWidth,
  boxRight: box.getBoundingClientRect().right,
  scrollWidth: box.scrollWidth, clientWidth: box.clientWidth,
  helperRight: helper ? helper.getBoundingClientRect().right : null,
  rows: [...box.querySelectorAll('table.folded tr.line')].map((tr) => [tr.getBoundingClientRect().height,
    line(tr.cells[0])]),
  tail: [...document.querySelectorAll('#decision-tail tr.tail-row')].map((tr) => [
    tr.getBoundingClientRect().height, line(tr.cells[0])]),
  tailFits: tail !== null && tail.scrollWidth <= tail.clientWidth + 1,
  natural: ['table.folded', 'table.tail-rows'].map((selector) => {
    const table = document.querySelector(selector);
    if (!table) return null;
    table.style.width = 'max-content';
    const width = table.getBoundingClientRect().width;
    table.style.width = '';
    return Math.round(width);
  }),
};
"""


def open_lending(b: Browser) -> None:
    b.open("lending")
    b.wait(lambda d: len(b.css("table.folded tr.line")) == len(SEEDED) * 2, what="every seeded line")


def table_fits_1280_px_on_one_line_per_row(b: Browser) -> dict[str, Any]:
    geometry: dict[str, Any] = b.js(GEOMETRY)
    assert geometry["inner"] <= WIDTH
    assert geometry["helperRight"] is not None, "no helper column"
    assert geometry["helperRight"] <= geometry["boxRight"] + 0.5, geometry  # shown, not scrolled away
    assert geometry["scrollWidth"] <= geometry["clientWidth"] + 1, geometry  # nothing to scroll to
    assert len(geometry["rows"]) == len(SEEDED) * 2
    for height, one_line in geometry["rows"]:
        assert height <= one_line + 1, geometry["rows"]  # no cell wraps
    # the live tail's rows too (its request column is clipped like the names)
    b.wait(lambda d: len(b.css("#decision-tail tr.tail-row")) == 50, what="the tail's rows")
    geometry = b.js(GEOMETRY)
    assert geometry["tailFits"] and len(geometry["tail"]) == 50, geometry
    for height, one_line in geometry["tail"]:
        assert height <= one_line + 1, geometry["tail"]
    return geometry


#: Every line's outcome badge and reason: (code, text, tooltip), read in one step (the page
#: re-renders the table on every refresh).
SHOWN = """
return [...document.querySelectorAll('table.folded tr.line')].map((tr) => {
  const badge = tr.querySelector('td.outcome .badge');
  const reason = tr.querySelector('td.why span[title]');
  return [tr.dataset.outcome, badge.textContent, badge.title,
    reason ? [reason.title, reason.textContent] : null];
});
"""


def outcomes_and_reasons_read_in_words(b: Browser) -> None:
    shown = b.js(SHOWN)
    assert len(shown) == len(SEEDED) * 2
    for code, text, title, reason in shown:
        assert text == WORDS["outcomes"][code] != code
        assert title == code
        if reason is not None:
            assert reason[1] == WORDS["reasons"][reason[0]] != reason[0]
    assert sum(1 for *_, reason in shown if reason) == 10  # five seeded reasons on each node
    # the detail pane under a line: every variable, the codes with their words
    b.click('table.folded tr.line[data-outcome="native_waited_behind_borrowed"]')
    detail = b.wait_text("tr.detail-row .detail", "rows from")
    assert "own request waited (native_waited_behind_borrowed)" in detail
    for variable in ("request_id", "pending_count", "keep_ms", "router_version", "helper_model_id"):
        assert b.css(f'tr.detail-row tr[data-field="{variable}"]'), variable
    b.click("tr.detail-row button.close")
    b.wait(lambda d: not b.css("tr.detail-row"), what="the pane closes")


def counts_name_their_window(b: Browser) -> None:
    label = b.wait_text("p.window", "newest 2,000 decisions")
    assert label.startswith("Counts cover the newest 2,000 decisions, recorded ")
    b.select('select[name="limit"]', "10000")
    label = b.wait_text("p.window", "all 2,500 decisions in the log")
    assert "2,500 rows in" in b.text(".pager")
    b.select('select[name="outcome"]', "skipped")
    b.wait_text("p.window", "all 314 decisions in the log that match the filters")


def tail_follows(b: Browser) -> list[str]:
    """The tail's rows, oldest first, once it shows its first poll; a marker proves no reload."""
    b.js("window.lendingTailMarker = 'before';")
    b.wait(lambda d: len(b.css("#decision-tail tr.tail-row")) == 50, what="the newest 50 rows")
    return [str(tr.get_attribute("data-key")) for tr in b.css("#decision-tail tr.tail-row")]


def tail_shows_the_new_decision(b: Browser) -> float:
    started = time.monotonic()
    row = b.wait_text("#decision-tail tr.tail-row", "own work arrived", timeout=5)
    waited = time.monotonic() - started
    rows = b.css("#decision-tail tr.tail-row")
    last = rows[-1]
    assert last.text == row and "tail-probe-1" in row  # at the bottom: the newest
    outcome = last.find_element("css selector", "td.outcome .badge")
    assert outcome.text == "returned to the owner" and outcome.get_attribute("title") == "borrowed_returned"
    assert len(rows) >= 51
    assert b.js("return window.lendingTailMarker") == "before"  # the same page: no reload
    return waited


@pytest_twisted.ensureDeferred
async def test_at_1280_px_the_decision_table_shows_its_helper_column_and_no_cell_wraps(site: Site) -> None:
    b = site.browser
    await b.do(open_lending, b)
    print("\nLending table at 1280 px: " + json.dumps(await b.do(table_fits_1280_px_on_one_line_per_row, b)))


@pytest_twisted.ensureDeferred
async def test_outcomes_and_reasons_show_words_with_the_code_as_tooltip(site: Site) -> None:
    b = site.browser
    await b.do(open_lending, b)
    await b.do(outcomes_and_reasons_read_in_words, b)


@pytest_twisted.ensureDeferred
async def test_the_counts_label_names_the_window_of_rows_it_covers(site: Site) -> None:
    b = site.browser
    await b.do(open_lending, b)
    await b.do(counts_name_their_window, b)


@pytest_twisted.ensureDeferred
async def test_the_live_tail_shows_a_new_decision_within_seconds_without_a_reload(site: Site) -> None:
    b = site.browser
    await b.do(open_lending, b)
    first = await b.do(tail_follows, b)
    times = [json.loads(key)[2] for key in first]
    assert times == sorted(times)  # chronological, oldest first
    decisions = site.slave.node.lending.decisions
    assert decisions is not None
    decisions.record("helper", "borrowed_returned", lane="text", reason="own_work_arrived",
                     owner_node_id="master", owner_model_id="alpha", helper_node_id="slave-a",
                     helper_model_id="beta", request_id="tail-probe-1")
    waited = await b.do(tail_shows_the_new_decision, b)
    print(f"\nthe tail showed the slave's new decision after {waited:.1f} s")
