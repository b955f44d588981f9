// Lending tab, the live tail: every node's decisions in the order they were recorded, oldest at the
// top, new ones added at the bottom as they come: what `routerd decisions --follow` prints, read
// the way it reads them: the site decisions route, first the newest FIRST rows, then on every poll
// the rows since the answer's `cursor` (`after`; routerd.lending.follow answers each row once).
// Rows are only added, never rebuilt; a click opens a row's variables under it. The tail polls on
// its own every TAIL_MS while the tab is visible, not with the page's slower refresh of the folded
// table, and shows its own errors.

import { get, query } from "./api.js";
import { clock, errorBox, h, replace, table } from "./dom.js";
import { clipped, decisionCells, variables } from "./lending-decisions.js";

const DECISIONS = "/router/v1/site/offload/decisions";
/** Rows the first poll shows (the CLI's default --limit). */
const FIRST = 50;
/** Rows one later poll may bring (a node answers at most 5000). */
const CATCH_UP = 5000;
/** Milliseconds between two polls. */
const TAIL_MS = 1000;
/** Rows kept on the page; older ones leave at the top. */
const KEEP = 300;
const COLUMNS = ["time", "node", "lane", "kind", "trigger", "outcome", "reason", "owner", "helper", "request"];

const rowKey = (row) => JSON.stringify([row.node_id, row.id, row.recorded_at]);

export function mountTail(ctx) {
  const tail = { cursor: null, paused: false, rows: 0, timer: null, stopped: false };
  tail.status = h("span", { className: "tail-status" });
  tail.pause = h("button", { type: "button", className: "pause", onclick: () => {
    tail.paused = !tail.paused;
    tail.pause.textContent = tail.paused ? "Resume" : "Pause";
    showStatus(tail);
  } }, "Pause");
  tail.body = h("tbody", {});
  tail.errors = h("div", {});
  tail.box = h("div", { className: "tail" }, (() => {
    const t = table(COLUMNS, [], { className: "tail-rows" });
    t.replaceChild(tail.body, t.tBodies[0]);
    return t;
  })());
  ctx.tail = tail;
  return h("section", { id: "decision-tail" },
    h("h2", {}, "Live tail"),
    h("div", { className: "pager" }, tail.pause, tail.status),
    tail.errors, tail.box);
}

function showStatus(tail) {
  const state = tail.paused ? "paused" : "following every node";
  tail.status.textContent = ` ${state} · ${tail.rows} decision${tail.rows === 1 ? "" : "s"} shown` +
    (tail.polled ? ` · checked ${clock(tail.polled)}` : "");
}

function tailRow(row) {
  const tr = h("tr", { className: "tail-row", dataset: { key: rowKey(row), outcome: row.outcome || "" },
    onclick: () => {
      const open = tr.nextElementSibling && tr.nextElementSibling.classList.contains("detail-row");
      if (open) {
        tr.nextElementSibling.remove();
        tr.classList.remove("selected");
        return;
      }
      tr.classList.add("selected");
      tr.after(h("tr", { className: "detail-row" }, h("td", { colSpan: COLUMNS.length },
        h("div", { className: "detail" }, variables(row)))));
    } },
  h("td", { className: "at" }, clock(row.recorded_at)),
  decisionCells(row),
  clipped(row.request_id, "request"));
  return tr;
}

/** Drop the oldest rows (and a detail pane left at the top) past KEEP. */
function trim(tail) {
  const isRow = (tr) => tr && tr.classList.contains("tail-row");
  while (tail.rows > KEEP) {
    if (isRow(tail.body.firstElementChild)) tail.rows -= 1;
    tail.body.firstElementChild.remove();
  }
  while (tail.body.firstElementChild && !isRow(tail.body.firstElementChild)) tail.body.firstElementChild.remove();
}

/** Poll now and then every TAIL_MS until stopTail (a poll is skipped while paused or hidden). */
export function startTail(ctx) {
  const tail = ctx.tail;
  const next = async () => {
    if (tail.stopped) return;
    if (!tail.paused && !document.hidden) {
      try {
        await poll(tail);
      } catch (err) {
        replace(tail.errors, h("div", { className: "error" }, `tail not updated: ${err.message}`));
      }
    }
    if (!tail.stopped) tail.timer = setTimeout(next, TAIL_MS);
  };
  next();
}

export function stopTail(ctx) {
  ctx.tail.stopped = true;
  clearTimeout(ctx.tail.timer);
}

async function poll(tail) {
  const params = tail.cursor === null ? { limit: FIRST } : { after: tail.cursor, limit: CATCH_UP };
  const doc = await get(DECISIONS + query(params));
  const atBottom = tail.box.scrollTop + tail.box.clientHeight >= tail.box.scrollHeight - 4;
  const rows = [...(doc.records || [])].reverse(); // the route answers newest first
  for (const row of rows) tail.body.appendChild(tailRow(row));
  tail.rows += rows.length;
  tail.cursor = doc.cursor;
  trim(tail);
  if (atBottom) tail.box.scrollTop = tail.box.scrollHeight;
  replace(tail.errors, errorBox(doc.node_errors));
  tail.polled = Date.now();
  showStatus(tail);
}
