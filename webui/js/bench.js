// Bench: run the fixed benchmark workload against a model on the node chosen (POST
// /router/v1/benchmarks/run: a public ID where routerd picks, or a node's local ID with its node_id;
// the master runs it on that node), the history of results, and a chart per model of its headline
// figure over time (generation tokens/s, seconds per image, or the realtime factor).

import { get, post } from "./api.js";
import { clock, h, replace, table } from "./dom.js";
import { chart } from "./charts.js";
import { factor, millis, modelCell, optional, rate } from "./figures.js";
import { describe, notify, refreshNow, showError } from "./shell.js";

const HEADLINE = {
  text: ["gen_tokens_per_s", "generation tokens/s"],
  image: ["seconds_per_image", "seconds per image"],
  stt: ["realtime_factor", "realtime factor"],
};

export function mount(container) {
  const ctx = { container, charts: new Map(), known: "", holders: new Map(), nodesKnown: "" };
  ctx.model = h("select", { name: "model", onchange: () => offerNodes(ctx) });
  ctx.node = h("select", { name: "node_id" });
  ctx.message = h("div", { className: "bench-message" });
  ctx.run = h("button", { type: "button", className: "apply run-bench", onclick: () => run(ctx) }, "Run");
  ctx.history = h("div", {});
  ctx.chartBox = h("div", { className: "chart-row" });
  replace(container, h("h1", {}, "Bench"),
    h("section", { id: "bench-run" }, h("div", { className: "filters" }, h("label", {}, "model ", ctx.model),
      h("label", {}, "on ", ctx.node), ctx.run),
      h("p", { className: "empty" }, "A fixed workload (text: one streamed 64-token answer; image: one 512×512 image " +
        "at 20 steps; speech: 10 s of audio), loading the model first if needed."), ctx.message),
    h("section", { id: "bench-charts" }, h("h2", {}, "By model"), ctx.chartBox),
    h("section", { id: "bench-history" }, h("h2", {}, "History"), ctx.history));
  return ctx;
}

/** The node choices for the chosen model: "any node" (routerd picks), then each node holding it. */
function offerNodes(ctx) {
  const holders = ctx.holders.get(ctx.model.value) || [];
  const key = JSON.stringify([ctx.model.value, holders]);
  if (key === ctx.nodesKnown) return;
  ctx.nodesKnown = key;
  const current = ctx.node.value;
  replace(ctx.node, h("option", { value: "" }, "any node"),
    holders.map((r) => h("option", { value: r.node_id }, r.local_id === ctx.model.value
      ? r.node_id : `${r.node_id} (as ${r.local_id})`)));
  if (holders.some((r) => r.node_id === current)) ctx.node.value = current;
}

async function run(ctx) {
  const model = ctx.model.value;
  if (!model) return;
  const holder = (ctx.holders.get(model) || []).find((r) => r.node_id === ctx.node.value);
  // On a chosen node the model is named by that node's local ID.
  const body = holder ? { model: holder.local_id, node_id: holder.node_id } : { model };
  ctx.run.disabled = true;
  replace(ctx.message, `running ${model}${holder ? " on " + holder.node_id : ""}…`);
  try {
    const result = await post("/router/v1/benchmarks/run", body);
    replace(ctx.message, h("span", { className: "ok" }, `${model} on ${result.node_id}: ${summary(result)}`));
  } catch (err) {
    replace(ctx.message, h("span", { className: "error" }, err.message));
    notify("error", `Bench of ${model} failed: ${describe(err)}`, "bench"); // stays until dismissed
  }
  ctx.run.disabled = false;
  refreshNow();
}

function summary(result) {
  const f = result.figures || {};
  if (!result.ok) return "failed: " + (result.error || "?");
  if (result.lane === "image") return `${rate(f.seconds_per_image)} s per image, load ${millis(f.load_ms)}`;
  if (result.lane === "stt") return `realtime factor ${factor(f.realtime_factor)}, load ${millis(f.load_ms)}`;
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
  ctx.holders = new Map();
  for (const m of inventory.models || []) {
    if (m.disabled) continue;
    for (const name of new Set([m.public_id, m.public_image_id].filter(Boolean))) {
      if (!ctx.holders.has(name)) ctx.holders.set(name, []);
      ctx.holders.get(name).push({ node_id: m.node_id, local_id: m.local_id });
    }
  }
  const models = [...new Set((inventory.models || []).map((m) => m.public_id))].sort();
  if (JSON.stringify(models) !== ctx.known) {
    ctx.known = JSON.stringify(models);
    const current = ctx.model.value;
    replace(ctx.model, models.map((m) => h("option", { value: m }, m)));
    if (models.includes(current)) ctx.model.value = current;
  }
  offerNodes(ctx);
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
