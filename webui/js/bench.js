// Bench: run the fixed benchmark workload against a model (POST /router/v1/benchmarks/run; the
// master runs it on the model's node), the history of results, and a chart per model of its
// headline figure over time (generation tokens/s, seconds per image, or the realtime factor).

import { get, post } from "./api.js";
import { clock, h, replace, table } from "./dom.js";
import { chart } from "./charts.js";
import { millis, modelCell, optional, rate } from "./figures.js";
import { refreshNow, showError } from "./shell.js";

const HEADLINE = {
  text: ["gen_tokens_per_s", "generation tokens/s"],
  image: ["seconds_per_image", "seconds per image"],
  stt: ["realtime_factor", "realtime factor"],
};

export function mount(container) {
  const ctx = { container, charts: new Map(), known: "" };
  ctx.model = h("select", { name: "model" });
  ctx.message = h("div", { className: "bench-message" });
  ctx.run = h("button", { type: "button", className: "apply run-bench", onclick: () => run(ctx) }, "Run");
  ctx.history = h("div", {});
  ctx.chartBox = h("div", { className: "chart-row" });
  replace(container, h("h1", {}, "Bench"),
    h("section", { id: "bench-run" }, h("div", { className: "filters" }, h("label", {}, "model ", ctx.model), ctx.run),
      h("p", { className: "empty" }, "A fixed workload (text: one streamed 64-token answer; image: one 512×512 image " +
        "at 20 steps; speech: 10 s of audio), loading the model first if needed."), ctx.message),
    h("section", { id: "bench-charts" }, h("h2", {}, "By model"), ctx.chartBox),
    h("section", { id: "bench-history" }, h("h2", {}, "History"), ctx.history));
  return ctx;
}

async function run(ctx) {
  const model = ctx.model.value;
  if (!model) return;
  ctx.run.disabled = true;
  replace(ctx.message, `running ${model}…`);
  try {
    const result = await post("/router/v1/benchmarks/run", { model });
    replace(ctx.message, h("span", { className: "ok" }, `${model} on ${result.node_id}: ${summary(result)}`));
  } catch (err) {
    replace(ctx.message, h("span", { className: "error" }, err.message));
    showError(err);
  }
  ctx.run.disabled = false;
  refreshNow();
}

function summary(result) {
  const f = result.figures || {};
  if (!result.ok) return "failed: " + (result.error || "?");
  if (result.lane === "image") return `${rate(f.seconds_per_image)} s per image, load ${millis(f.load_ms)}`;
  if (result.lane === "stt") return `realtime factor ${rate(f.realtime_factor)}, load ${millis(f.load_ms)}`;
  return `${rate(f.gen_tokens_per_s)} tok/s generation, ${rate(f.prompt_tokens_per_s)} tok/s prompt, ` +
    `TTFT ${millis(f.ttft_ms)}, load ${millis(f.load_ms)}`;
}

function results(doc) {
  if (Array.isArray(doc)) return doc;
  return doc.results || doc.benchmarks || doc.history || [];
}

function chartFor(ctx, key, lane) {
  if (!ctx.charts.has(key)) {
    const [, label] = HEADLINE[lane] || HEADLINE.text;
    const c = chart("bench-" + key.replace(/[^A-Za-z0-9_-]/g, "_"), `${key}: ${label}`, { digits: 2 });
    ctx.charts.set(key, c);
    ctx.chartBox.appendChild(c.el);
  }
  return ctx.charts.get(key);
}

export async function refresh(ctx) {
  const [inventory, doc] = await Promise.all([get("/router/v1/site/inventory"), optional("/router/v1/benchmarks")]);
  const models = [...new Set((inventory.models || []).map((m) => m.public_id))].sort();
  if (JSON.stringify(models) !== ctx.known) {
    ctx.known = JSON.stringify(models);
    const current = ctx.model.value;
    replace(ctx.model, models.map((m) => h("option", { value: m }, m)));
    if (models.includes(current)) ctx.model.value = current;
  }
  if (doc.__error) {
    replace(ctx.history, h("p", { className: "error" }, doc.__error));
    return;
  }
  const list = results(doc).slice().sort((a, b) => b.at_ms - a.at_ms);
  replace(ctx.history, list.length
    ? table(["when", "model", "workload", "result"], list.map((r) => h("tr", { className: "bench-result" },
      h("td", {}, new Date(r.at_ms).toLocaleDateString() + " " + clock(r.at_ms)),
      modelCell(r.public_id || r.model, r.model, r.node_id), h("td", {}, r.workload), h("td", { className: r.ok ? "" : "error" }, summary(r)))),
    { className: "bench" })
    : h("p", { className: "empty" }, "No benchmark has run yet."));
  const byModel = new Map();
  for (const r of list.slice().reverse()) {
    if (!r.ok) continue;
    const key = `${r.node_id}/${r.model}`;
    if (!byModel.has(key)) byModel.set(key, { lane: r.lane, rows: [] });
    byModel.get(key).rows.push(r);
  }
  for (const [key, { lane, rows }] of byModel) {
    const [field, label] = HEADLINE[lane] || HEADLINE.text;
    chartFor(ctx, key, lane).update(rows.map((r) => r.at_ms), [{ label, values: rows.map((r) => (r.figures || {})[field] ?? null) }], 0);
  }
}
