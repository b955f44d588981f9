// Lending tab, the decision log: every node's rows folded into one line per repeated decision
// (site offload/decisions/folded), one line per table row that fits a 1280 px screen (long names
// are clipped, their full text is the tooltip), the outcome, reason, trigger and kind in words
// with the code as the tooltip, the counts labelled with the window of rows they cover, and a
// collapsible pane under a line with every variable of its newest row.

import { get, query } from "./api.js";
import { badge, clock, duration, errorBox, h, replace, table } from "./dom.js";
import { refreshNow } from "./shell.js";
import { said, values, words } from "./words.js";

const WINDOWS = [500, 2000, 10000, 50000];
const PAGE_SIZE = 50;
const FOLDED = "/router/v1/site/offload/decisions/folded";
/** Row fields whose values are enumeration codes: the words table's section of each. */
const ENUMERATED = { kind: "kinds", outcome: "outcomes", reason: "reasons", trigger: "triggers",
  service_source: "service_sources" };
/** Row fields that are times (ms since the epoch): shown as a clock too. */
const TIMES = new Set(["recorded_at"]);

export const count = (n) => Number(n).toLocaleString("en-US");

export function pair(node, model) {
  return node || model ? `${node || "?"}/${model || "?"}` : "";
}

/** A cell whose text never wraps: cut with an ellipsis past its width, the whole text as tooltip. */
export function clipped(text, className) {
  return h("td", { className: "clip " + (className || "") },
    text ? h("span", { title: text }, text) : "");
}

/** Every variable of one decision row, enumeration codes with their words. */
export function variables(row) {
  const fields = Object.keys(row).sort();
  return table(["variable", "value"], fields.map((name) => {
    const value = row[name];
    let shown = value === null || value === undefined ? "–" : String(value);
    if (ENUMERATED[name] && value) shown = `${words(ENUMERATED[name], value)} (${value})`;
    if (TIMES.has(name) && value) shown = `${value} (${clock(value)})`;
    return h("tr", { dataset: { field: name } }, h("th", {}, name), h("td", {}, shown));
  }), { className: "variables" });
}

/** The outcome as a badge in words, the code as its tooltip. */
function outcomeBadge(outcome) {
  const el = badge(words("outcomes", outcome), "outcome " + outcome);
  el.title = outcome;
  el.dataset.code = outcome;
  return el;
}

/** The cells a folded line and a tail row share: node, lane, kind, trigger, outcome, reason,
 * owner and helper (the key fields of a fold). */
export function decisionCells(row) {
  return [
    clipped(row.node_id, "node"),
    h("td", {}, row.lane || ""),
    h("td", {}, said("kinds", row.kind)),
    h("td", {}, said("triggers", row.trigger)),
    h("td", { className: "outcome" }, outcomeBadge(row.outcome)),
    h("td", { className: "why" }, said("reasons", row.reason)),
    clipped(pair(row.owner_node_id, row.owner_model_id), "owner"),
    clipped(pair(row.helper_node_id, row.helper_model_id), "helper"),
  ];
}

function select(name, label, options, ctx, current) {
  return h("label", {}, label + " ",
    h("select", { name, onchange: (e) => {
      ctx.filters[name] = e.currentTarget.value;
      ctx.filters.page = 0;
      refreshNow();
    } }, options.map(([value, text]) => h("option", { value, selected: value === String(current) }, text))));
}

/** The decision log section; the filters live in ctx.filters, the open line in ctx.selected. */
export function mountDecisions(ctx) {
  ctx.filters = { lane: "", kind: "", outcome: "", node_id: "", limit: "2000", page: 0 };
  ctx.selected = null; // the key of the line whose variables are open
  ctx.nodeSelect = h("select", { name: "node_id", onchange: (e) => {
    ctx.filters.node_id = e.currentTarget.value;
    ctx.filters.page = 0;
    refreshNow();
  } }, h("option", { value: "" }, "all nodes"));
  const filterBar = h("div", { className: "filters" },
    select("lane", "lane", [["", "all lanes"], ["text", "text"], ["image", "image"]], ctx, ""),
    select("kind", "kind", [["", "all kinds"], ...values("kinds").map((k) => [k, words("kinds", k)])], ctx, ""),
    select("outcome", "outcome", [["", "all outcomes"],
      ...values("outcomes").map((k) => [k, words("outcomes", k)])], ctx, ""),
    h("label", {}, "node ", ctx.nodeSelect),
    select("limit", "rows", WINDOWS.map((n) => [String(n), `newest ${count(n)}`]), ctx, ctx.filters.limit));
  ctx.window = h("p", { className: "window" });
  ctx.pager = h("div", { className: "pager" });
  ctx.decisions = h("div", { className: "decisions" });
  ctx.decisionErrors = h("div", {});
  return h("section", { id: "decision-log" }, h("h2", {}, "Decision log"), filterBar, ctx.decisionErrors,
    ctx.window, ctx.pager, ctx.decisions);
}

const lineKey = (line) => JSON.stringify([line.node_id, line.kind, line.lane, line.trigger, line.outcome,
  line.reason, line.owner_node_id, line.owner_model_id, line.helper_node_id, line.helper_model_id]);

const COLUMNS = ["last", "count", "span", "node", "lane", "kind", "trigger", "outcome", "reason", "owner",
  "helper"];

function detailRow(ctx, line) {
  const close = h("button", { type: "button", className: "close", title: "close", onclick: (e) => {
    e.stopPropagation();
    ctx.selected = null;
    for (const open of ctx.decisions.querySelectorAll("tr.detail-row")) open.remove();
    for (const other of ctx.decisions.querySelectorAll("tr.selected")) other.classList.remove("selected");
  } }, "×");
  return h("tr", { className: "detail-row" }, h("td", { colSpan: COLUMNS.length },
    h("div", { className: "detail" },
      h("h3", {}, `${words("kinds", line.kind)} · ${words("outcomes", line.outcome)}` +
        (line.reason ? ` · ${words("reasons", line.reason)}` : ""), close),
      h("p", {}, `${count(line.count)} row${line.count === 1 ? "" : "s"} from ${clock(line.first_ms)} to ` +
        `${clock(line.last_ms)} (${duration(line.span_ms)}); the newest:`),
      variables(line.latest || {}))));
}

function lineRow(ctx, line) {
  const key = lineKey(line);
  const tr = h("tr", { className: "line" + (key === ctx.selected ? " selected" : ""),
    dataset: { key, outcome: line.outcome, kind: line.kind, count: String(line.count) },
    onclick: (e) => {
      const live = e.currentTarget; // the row on the page (tr is the template a refresh patched in)
      const open = ctx.selected === key;
      for (const row of ctx.decisions.querySelectorAll("tr.detail-row")) row.remove();
      for (const other of ctx.decisions.querySelectorAll("tr.selected")) other.classList.remove("selected");
      ctx.selected = open ? null : key;
      if (open) return;
      live.classList.add("selected");
      live.after(detailRow(ctx, line));
    } },
  h("td", { className: "at" }, clock(line.last_ms)),
  h("td", { className: "count" }, line.count > 1 ? `×${count(line.count)}` : "1"),
  h("td", { className: "at" }, line.count > 1 ? duration(line.span_ms) : ""),
  decisionCells(line));
  return key === ctx.selected ? [tr, detailRow(ctx, line)] : [tr];
}

/** What the counts cover: the newest `limit` decisions when the log had more, else every decision
 * kept; with the time window of those rows. */
function windowText(ctx, doc) {
  if (!doc.total_rows) return "";
  const limit = Number(ctx.filters.limit);
  const filtered = ["lane", "kind", "outcome", "node_id"].some((name) => ctx.filters[name]);
  const which = doc.total_rows >= limit ? `the newest ${count(limit)} decisions`
    : `all ${count(doc.total_rows)} decisions in the log`;
  return `Counts cover ${which}${filtered ? " that match the filters" : ""}, recorded ` +
    `${clock(doc.oldest_ms)} – ${clock(doc.newest_ms)} (${duration(doc.newest_ms - doc.oldest_ms)}).`;
}

function renderDecisions(ctx, doc) {
  // an unchanged answer leaves the table as it is: an open pane, a selection or a hover survive
  const seen = JSON.stringify([doc, ctx.filters.limit]);
  if (seen === ctx.shown) return;
  ctx.shown = seen;
  const head = COLUMNS.map((name) => name === "count"
    ? h("span", { title: "rows folded into the line, within the window above" }, name) : name);
  replace(ctx.decisions, doc.lines.length
    ? table(head, doc.lines.map((line) => lineRow(ctx, line)), { className: "folded" })
    : h("p", { className: "empty" }, "no decisions match"));
  ctx.window.textContent = windowText(ctx, doc);
  ctx.window.dataset.limit = ctx.filters.limit;
  const page = doc.page;
  replace(ctx.pager,
    h("button", { type: "button", className: "prev", disabled: page <= 0,
      onclick: () => { ctx.filters.page = page - 1; refreshNow(); } }, "‹ newer"),
    h("span", { className: "pages" }, ` page ${page + 1} of ${doc.pages} · ${count(doc.total_rows)} rows in ` +
      `${count(doc.total_lines)} lines `),
    h("button", { type: "button", className: "next", disabled: page + 1 >= doc.pages,
      onclick: () => { ctx.filters.page = page + 1; refreshNow(); } }, "older ›"));
  replace(ctx.decisionErrors, errorBox(doc.node_errors));
  ctx.decisions.dataset.totalRows = String(doc.total_rows);
}

/** Fetch and render one page of folded lines; the timings the 10,000-row test reads. */
export async function refreshDecisions(ctx) {
  const f = ctx.filters;
  const started = performance.now();
  const folded = await get(FOLDED + query({ lane: f.lane, kind: f.kind, outcome: f.outcome,
    node_id: f.node_id, limit: f.limit, page: f.page, page_size: PAGE_SIZE }));
  const fetched = performance.now();
  renderDecisions(ctx, folded);
  const rendered = performance.now();
  return { lending_fetch_ms: fetched - started, lending_render_ms: rendered - fetched,
    lending_total_ms: rendered - started, rows: folded.total_rows, lines: folded.total_lines };
}
