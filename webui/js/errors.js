// Errors: the failed requests of the last 24 hours (the request log's status=failed, each with the
// backend's reason; asked every FAILED_EVERY_MS and redrawn only when they changed), then the recent
// failed model loads of every node (site load-errors), newest first, with the reason and the
// backend's last log lines; "Clear" forgets the failed loads on every node.

import { del, query } from "./api.js";
import { clock, duration, errorBox, h, replace, table } from "./dom.js";
import { modelCell, optional } from "./figures.js";
import { act, refreshNow, showError } from "./shell.js";
import { requestTable } from "./requests.js";

const FAILED_EVERY_MS = 10000;

export function mount(container) {
  const ctx = { container };
  ctx.body = h("div", {});
  ctx.clear = h("button", { type: "button", className: "clear-errors", onclick: (e) => act({
    label: "Clear the failed loads", button: e.currentTarget, run: () => del("/router/v1/site/load-errors"),
    ask: { title: "Clear the failed loads?", ok: "Clear",
      body: "Every node forgets its recent failed loads and their log lines." } }) }, "Clear");
  ctx.failed = h("div", {});
  ctx.failedAt = 0;
  replace(container, h("h1", {}, "Errors"),
    h("section", { id: "failed-requests" }, h("h2", {}, "Failed requests (24 h)"), ctx.failed),
    h("section", { id: "load-errors" }, h("div", { className: "pager" }, h("h2", {}, "Failed loads"), ctx.clear), ctx.body));
  return ctx;
}

async function refreshFailed(ctx) {
  if (Date.now() - ctx.failedAt < FAILED_EVERY_MS) return;
  ctx.failedAt = Date.now();
  const doc = await optional("/router/v1/site/requests" + query({ status: "failed", limit: 100,
    since_ms: Date.now() - 86400e3 }));
  const shown = JSON.stringify(doc);
  if (shown === ctx.failedShown) return; // unchanged: keep the table (and any selection in it)
  ctx.failedShown = shown;
  if (doc.__error) {
    replace(ctx.failed, h("p", { className: "error" }, doc.__error));
    return;
  }
  const rows = doc.requests || [];
  replace(ctx.failed, errorBox(doc.node_errors), rows.length ? requestTable(rows, "failed-requests")
    : h("p", { className: "empty" }, "No failed request in the last 24 hours."));
}

export async function refresh(ctx) {
  await refreshFailed(ctx);
  const doc = await optional("/router/v1/site/load-errors" + query({ limit: 200 }));
  if (doc.__error) {
    replace(ctx.body, h("p", { className: "error" }, doc.__error));
    return;
  }
  const errors = doc.errors || [];
  ctx.clear.disabled = errors.length === 0;
  replace(ctx.body, errorBox(doc.node_errors), errors.length
    ? table(["when", "model", "config", "runtime", "took", "reason"], errors.map((e) => h("tr", { className: "load-error",
      dataset: { key: `load-error/${e.node_id}/${e.model}/${e.at_ms}` } },
      h("td", {}, new Date(e.at_ms).toLocaleDateString() + " " + clock(e.at_ms)),
      modelCell(e.public_id || e.model, e.model, e.node_id), h("td", {}, e.config_filename), h("td", {}, e.runtime), h("td", {}, duration(e.duration_ms)),
      h("td", { className: "reason-cell" }, h("div", { className: "error" }, e.reason),
        (e.log_tail || []).length ? h("details", {}, h("summary", {}, "last log lines"),
          h("pre", { className: "log" }, e.log_tail.join("\n"))) : null))), { className: "load-errors" })
    : h("p", { className: "empty" }, "No failed loads."));
}
