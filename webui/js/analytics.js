// Analytics: site analytics filtered by period, node, model and lane; per-model and per-node
// tables of every figure, and charts of requests (and errors), tokens/s and p95 latency over the
// period. "Flush now" writes every node's buffered rows before the next flush_interval.

import { get, post, query } from "./api.js";
import { errorBox, h, replace, table } from "./dom.js";
import { chart } from "./charts.js";
import { FIGURE_HEAD, figureCells, fillSiteChoices, modelCell, optional, PERIODS } from "./figures.js";
import { act, refreshNow, showError } from "./shell.js";

const LANES = ["text", "image", "stt"];
const EVERY_MS = 5000;

function select(name, label, options, onChange) {
  return h("label", {}, label + " ", h("select", { name, onchange: (e) => onChange(e.currentTarget.value) },
    options.map(([value, text]) => h("option", { value }, text))));
}

export function mount(container) {
  const ctx = { container, filters: { period: "24h", node_id: "", model: "", lane: "" }, fetchedAt: 0, known: "" };
  const set = (name) => (value) => { ctx.filters[name] = value; ctx.fetchedAt = 0; refreshNow(); };
  ctx.nodeSelect = select("node_id", "node", [["", "all nodes"]], set("node_id"));
  ctx.modelSelect = select("model", "model", [["", "all models"]], set("model"));
  const periodSelect = select("period", "period", PERIODS.map((p) => [p, p]), set("period"));
  periodSelect.querySelector("select").value = "24h";
  ctx.flush = h("button", { type: "button", className: "flush", onclick: (e) => act({
    label: "Flush analytics", button: e.currentTarget, done: () => "Flush analytics: every node wrote its buffered rows",
    run: async () => {
      await post("/router/v1/site/analytics/flush");
      ctx.fetchedAt = 0; // read the tables again now the rows are written
    } }) }, "Flush now");
  ctx.note = h("div", {});
  ctx.requests = chart("requests", "Requests and errors");
  ctx.tokens = chart("tokens", "Generation speed", { unit: "tokens/s", digits: 1 });
  ctx.latency = chart("latency", "Latency p95", { unit: "ms", digits: 0 });
  ctx.models = h("div", { className: "wide" });
  ctx.nodes = h("div", { className: "wide" });
  replace(container,
    h("h1", {}, "Analytics"),
    h("section", { id: "analytics-filters" }, h("div", { className: "filters" }, periodSelect, ctx.nodeSelect,
      ctx.modelSelect, select("lane", "lane", [["", "all lanes"], ...LANES.map((l) => [l, l])], set("lane")),
      ctx.flush), ctx.note),
    h("section", { id: "analytics-charts" }, h("div", { className: "chart-row" },
      ctx.requests.el, ctx.tokens.el, ctx.latency.el)),
    h("section", { id: "analytics-models" }, h("h2", {}, "By model"), ctx.models),
    h("section", { id: "analytics-nodes" }, h("h2", {}, "By node"), ctx.nodes));
  return ctx;
}

export async function refresh(ctx) {
  fillSiteChoices(ctx, await get("/router/v1/site/inventory"), ctx.nodeSelect.querySelector("select"),
    ctx.modelSelect.querySelector("select"));
  if (Date.now() - ctx.fetchedAt < EVERY_MS) return;
  const doc = await optional("/router/v1/site/analytics" + query(ctx.filters));
  ctx.fetchedAt = Date.now();
  if (doc.__error) {
    replace(ctx.note, h("p", { className: "error" }, doc.__error));
    return;
  }
  replace(ctx.note, errorBox(doc.node_errors));
  const series = doc.series || [];
  const times = series.map((p) => p.t_ms);
  const values = (name) => series.map((p) => (p[name] === undefined ? null : p[name]));
  ctx.requests.update(times, [{ label: "requests", values: values("requests") },
    { label: "errors", values: values("errors") }, { label: "lent", values: values("lent") }], doc.bucket_ms);
  ctx.tokens.update(times, [{ label: "tokens/s", values: values("tokens_per_s") }], doc.bucket_ms);
  ctx.latency.update(times, [{ label: "p95", values: values("p95_ms") }], doc.bucket_ms);
  const models = doc.models || [];
  replace(ctx.models, models.length
    ? table(["model", "lane", "guardian", ...FIGURE_HEAD], models.map((m) => h("tr", { dataset: { model: m.model, nodeId: m.node_id, localId: m.local_id || m.model } },
      modelCell(m.model, m.local_id, m.node_id), h("td", {}, m.lane), h("td", { className: "num" }, m.guardian || 0),
      figureCells(m))), { className: "figures models" })
    : h("p", { className: "empty" }, "no requests in this period"));
  const nodes = doc.nodes || [];
  replace(ctx.nodes, nodes.length
    ? table(["node", "analytics", ...FIGURE_HEAD], nodes.map((n) => h("tr", { dataset: { nodeId: n.node_id } },
      h("td", {}, n.node_id), h("td", {}, n.enabled === false ? "off" : "on"), figureCells(n))), { className: "figures nodes" })
    : h("p", { className: "empty" }, "no nodes"));
}
