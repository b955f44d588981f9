// Errors: the recent failed model loads of every node (site load-errors), newest first, with the
// reason and the backend's last log lines; "Clear" forgets them on every node.

import { del, query } from "./api.js";
import { clock, duration, errorBox, h, replace, table } from "./dom.js";
import { optional } from "./figures.js";
import { act } from "./shell.js";

export function mount(container) {
  const ctx = { container };
  ctx.body = h("div", {});
  ctx.clear = h("button", { type: "button", className: "clear-errors", onclick: (e) => act({
    label: "Clear the failed loads", button: e.currentTarget, run: () => del("/router/v1/site/load-errors"),
    ask: { title: "Clear the failed loads?", ok: "Clear",
      body: "Every node forgets its recent failed loads and their log lines." } }) }, "Clear");
  replace(container, h("h1", {}, "Errors"),
    h("section", { id: "load-errors" }, h("div", { className: "pager" }, h("h2", {}, "Failed loads"), ctx.clear), ctx.body));
  return ctx;
}

export async function refresh(ctx) {
  const doc = await optional("/router/v1/site/load-errors" + query({ limit: 200 }));
  if (doc.__error) {
    replace(ctx.body, h("p", { className: "error" }, doc.__error));
    return;
  }
  const errors = doc.errors || [];
  ctx.clear.disabled = errors.length === 0;
  replace(ctx.body, errorBox(doc.node_errors), errors.length
    ? table(["when", "node", "model", "config", "runtime", "took", "reason"], errors.map((e) => h("tr", { className: "load-error",
      dataset: { key: `load-error/${e.node_id}/${e.model}/${e.at_ms}` } },
      h("td", {}, new Date(e.at_ms).toLocaleDateString() + " " + clock(e.at_ms)), h("td", {}, e.node_id),
      h("td", {}, e.model), h("td", {}, e.config_filename), h("td", {}, e.runtime), h("td", {}, duration(e.duration_ms)),
      h("td", { className: "reason-cell" }, h("div", { className: "error" }, e.reason),
        (e.log_tail || []).length ? h("details", {}, h("summary", {}, "last log lines"),
          h("pre", { className: "log" }, e.log_tail.join("\n"))) : null))), { className: "load-errors" })
    : h("p", { className: "empty" }, "No failed loads."));
}
