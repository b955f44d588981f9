// Requests: the request log (GET /router/v1/site/requests) — every node's recorded requests,
// newest first, filtered by time, node, model (public ID), key name, request ID, status and
// lent/guardian, a page at a time ("Older" follows the page's cursor, "Newer" goes back). Each row
// names the model by its public ID (local ID and node second), a lent request once with its owner
// and helper, and a failure with the backend's reason. The list is asked again when a filter or the
// page changes, and every FETCH_EVERY_MS on the newest page; it is redrawn only when it changed, so
// a selected request ID stays selected. A row whose body was captured (analytics.capture_*) has a
// "body" disclosure that shows it.

import { get, query } from "./api.js";
import { badge, clock, errorBox, h, replace, table } from "./dom.js";
import { count, fillSiteChoices, millis, modelCell, optional } from "./figures.js";
import { refreshNow } from "./shell.js";

const FETCH_EVERY_MS = 10000;
const SINCE = [["1h", 3600e3], ["24h", 86400e3], ["7d", 7 * 86400e3], ["30d", 30 * 86400e3], ["all", 0]];
const PAGE = 50;

function flags(r) {
  return [r.lent ? badge(r.owner && r.helper ? `lent ${r.owner} → ${r.helper}` : "lent", "lent") : null,
    r.guardian ? badge("guardian", "warn") : null, r.captured ? body(r) : null];
}

// A captured request body (analytics.capture_keys / capture_models), asked for when it is opened.
function body(r) {
  const out = h("pre", { className: "log captured-body" }, "…");
  const shown = h("details", { className: "captured", ontoggle: async (e) => {
    if (!e.currentTarget.open || shown.dataset.loaded) return;
    shown.dataset.loaded = "1";
    const doc = await optional("/router/v1/site/requests/body" + query({ request_id: r.request_id, node_id: r.node_id }));
    const found = (doc.captures || [])[0];
    out.textContent = doc.__error || (found
      ? found.body + (found.truncated ? `\n… (${found.size} bytes, cut at analytics.capture_max_bytes)` : "")
      : "no body stored (pruned after analytics.capture_retention)");
  } }, h("summary", {}, "body"), out);
  return shown;
}

/** Request-log rows as a table (the Requests page and the Errors page's failed requests). */
export function requestTable(rows, className) {
  return table(["time", "request ID", "model", "lane", "route", "status", "took", "TTFT",
    "tokens in / out", "cached", "key", ""], rows.map((r) => h("tr", {
    className: "logged-request", dataset: { requestId: r.request_id || "", status: r.status } },
  h("td", {}, new Date(r.at_ms).toLocaleDateString() + " " + clock(r.at_ms)),
  h("td", { className: "rid" }, r.request_id || ""),
  modelCell(r.model, r.local_id, r.node_id), h("td", {}, r.lane), h("td", {}, r.route),
  h("td", { className: "status-cell" },
    badge(r.status === "ok" ? String(r.http_status || "ok") : `${r.status} ${r.http_status || ""}`,
      r.status === "ok" ? "ok" : "bad"),
    r.reason ? h("div", { className: "error reason" }, r.reason) : null),
  h("td", { className: "num" }, millis(r.duration_ms)), h("td", { className: "num" }, millis(r.ttft_ms)),
  h("td", { className: "num" }, `${count(r.prompt_tokens)} / ${count(r.completion_tokens)}`),
  h("td", { className: "num" }, r.cached_tokens ? count(r.cached_tokens) : ""),
  h("td", {}, r.key_name || ""), h("td", {}, flags(r)))), { className: className || "request-log" });
}

function select(name, label, options, value) {
  const el = h("select", { name }, options.map(([v, text]) => h("option", { value: v }, text)));
  el.value = value;
  return [h("label", {}, label + " ", el), el];
}

export function mount(container) {
  const ctx = { container, cursors: [null], fetchedAt: 0, shown: "", known: "" };
  const [sinceLabel, since] = select("since", "since", SINCE.map(([name]) => [name, name]), "24h");
  const [nodeLabel, node] = select("node_id", "node", [["", "all nodes"]], "");
  const [modelLabel, model] = select("model", "model", [["", "all models"]], "");
  const [statusLabel, status] = select("status", "status", [["", "any"], ["failed", "failed"], ["ok", "ok"]], "");
  const [kindLabel, kind] = select("kind", "kind", [["", "any"], ["lent", "lent"], ["guardian", "guardian"]], "");
  const key = h("input", { type: "text", name: "key_name", placeholder: "key name" });
  const rid = h("input", { type: "text", name: "request_id", placeholder: "request ID" });
  Object.assign(ctx, { since, node, model, status, kind, key, rid });
  const search = () => { ctx.cursors = [null]; ctx.fetchedAt = 0; refreshNow(); };
  for (const el of [since, node, model, status, kind]) el.addEventListener("change", search);
  ctx.form = h("form", { className: "filters", onsubmit: (e) => { e.preventDefault(); search(); } },
    sinceLabel, nodeLabel, modelLabel, statusLabel, kindLabel, key, rid,
    h("button", { type: "submit", className: "search" }, "Search"));
  ctx.newer = h("button", { type: "button", className: "newer", disabled: true, onclick: () => {
    ctx.cursors.pop(); ctx.fetchedAt = 0; refreshNow(); } }, "Newer");
  ctx.older = h("button", { type: "button", className: "older", disabled: true, onclick: () => {
    ctx.cursors.push(ctx.next); ctx.fetchedAt = 0; refreshNow(); } }, "Older");
  ctx.where = h("span", {});
  ctx.note = h("div", {});
  ctx.body = h("div", { className: "wide" });
  replace(container, h("h1", {}, "Requests"),
    h("section", { id: "request-filters" }, ctx.form, ctx.note),
    h("section", { id: "request-log" }, h("div", { className: "pager" }, ctx.newer, ctx.older, ctx.where), ctx.body));
  return ctx;
}

function filters(ctx) {
  const span = SINCE.find(([name]) => name === ctx.since.value)[1];
  return {
    since_ms: span ? Math.max(0, Date.now() - span) : "", node_id: ctx.node.value, model: ctx.model.value,
    status: ctx.status.value, kind: ctx.kind.value, key_name: ctx.key.value.trim(),
    request_id: ctx.rid.value.trim(), limit: PAGE, before: ctx.cursors[ctx.cursors.length - 1] || "",
  };
}

export async function refresh(ctx) {
  fillSiteChoices(ctx, await get("/router/v1/site/inventory"), ctx.node, ctx.model);
  const newest = ctx.cursors.length === 1;
  if (ctx.fetchedAt && (!newest || Date.now() - ctx.fetchedAt < FETCH_EVERY_MS)) return;
  const doc = await optional("/router/v1/site/requests" + query(filters(ctx)));
  ctx.fetchedAt = Date.now();
  if (doc.__error) {
    replace(ctx.note, h("p", { className: "error" }, doc.__error));
    return;
  }
  const rows = doc.requests || [];
  ctx.next = doc.next;
  ctx.older.disabled = !doc.next;
  ctx.newer.disabled = newest;
  ctx.where.textContent = `page ${ctx.cursors.length}, ${rows.length} requests`;
  const shown = JSON.stringify([rows, doc.node_errors]);
  if (shown === ctx.shown) return; // unchanged: keep the table (and any selection in it)
  ctx.shown = shown;
  replace(ctx.note, errorBox(doc.node_errors));
  replace(ctx.body, rows.length ? requestTable(rows)
    : h("p", { className: "empty" }, "No request matches (rows are kept for analytics.raw_retention; analytics must be on)."));
}
