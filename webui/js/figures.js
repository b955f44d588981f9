// What the analytics pages share: number formats, the period picker and a fetch that may fail on
// its own (a node with analytics off, an API this build lacks) without failing the whole page.

import { ApiError, get } from "./api.js";
import { h } from "./dom.js";

export const PERIODS = ["1h", "24h", "7d", "30d"];

export function count(value) {
  if (value === null || value === undefined) return "–";
  const n = Number(value);
  if (Math.abs(n) >= 1e6) return (n / 1e6).toFixed(1) + " M";
  if (Math.abs(n) >= 1e4) return (n / 1e3).toFixed(1) + " k";
  return Number.isInteger(n) ? String(n) : n.toFixed(1);
}

/** A size in bytes: B, KB, MB or GB (powers of 1000). */
export function bytes(value) {
  if (value === null || value === undefined) return "–";
  const n = Number(value);
  for (const [unit, size] of [["GB", 1e9], ["MB", 1e6], ["KB", 1e3]]) {
    if (n >= size) return (n / size).toFixed(n >= 10 * size ? 0 : 1) + " " + unit;
  }
  return `${n} B`;
}

export function millis(value) {
  if (value === null || value === undefined) return "–";
  return value >= 1000 ? (value / 1000).toFixed(2) + " s" : Math.round(value) + " ms";
}

export function rate(value) {
  return value === null || value === undefined ? "–" : Number(value).toFixed(1);
}

/** A ratio well below 1 (a realtime factor: 0.0677 is 0.07, not rate()'s 0.1): two decimals. */
export function factor(value) {
  return value === null || value === undefined ? "–" : Number(value).toFixed(2);
}

export function percent(part, whole) {
  return whole ? ((100 * part) / whole).toFixed(1) + " %" : "–";
}

/** Buttons choosing a period; `onPick(period)` when one is clicked. */
export function periodPicker(periods, current, onPick) {
  const bar = h("div", { className: "lanes periods" });
  const buttons = periods.map((p) => h("button", {
    type: "button", className: p === current ? "active" : "", dataset: { period: p },
    onclick: () => {
      for (const b of buttons) b.classList.toggle("active", b === buttons[periods.indexOf(p)]);
      onPick(p);
    },
  }, p));
  buttons.forEach((b) => bar.appendChild(b));
  return bar;
}

/** `get(path)`, or `{__error: message}` when it fails with an API error (never throws those). */
export async function optional(path) {
  try {
    return await get(path);
  } catch (err) {
    if (err instanceof ApiError) return { __error: `${err.status} ${err.code}: ${err.message}` };
    throw err;
  }
}

/** Refill a <select> with `values` after its `empty` choice ("all …"), keeping the current choice
 * while it is still offered. */
function fillOptions(el, values, empty) {
  const current = el.value;
  el.replaceChildren(h("option", { value: "" }, empty), ...values.map((v) => h("option", { value: v }, v)));
  el.value = values.includes(current) ? current : "";
}

/** The node and model (public ID) filter choices of the site's inventory, refilled only when they
 * changed (`ctx.known` remembers the last). */
export function fillSiteChoices(ctx, inventory, nodeEl, modelEl) {
  const nodes = (inventory.nodes || []).map((n) => n.node_id);
  const models = [...new Set((inventory.models || []).map((m) => m.public_id).filter(Boolean))].sort();
  const known = JSON.stringify([nodes, models]);
  if (known === ctx.known) return;
  ctx.known = known;
  fillOptions(nodeEl, nodes, "all nodes");
  fillOptions(modelEl, models, "all models");
}

/** A model as every page names it: its public ID first, then where it ran, "<local ID> · <node>"
 * (the local ID left out where it is the public ID). */
export function modelCell(publicId, localId, nodeId) {
  const where = [localId && localId !== publicId ? localId : null, nodeId].filter(Boolean).join(" · ");
  return h("td", { className: "model-cell", dataset: { model: publicId || "" } }, publicId || localId || "",
    where ? h("small", { className: "model-where" }, where) : null);
}

/** The figures of a model or node row as table cells (the columns of FIGURE_HEAD). */
export const FIGURE_HEAD = ["requests", "errors", "tokens in", "tokens out", "images", "audio s", "vectors",
  "loads", "p50", "p95", "TTFT p50", "TTFT p95", "tok/s", "lent", "borrowed"];

export function figureCells(row) {
  return [count(row.requests), count(row.errors), count(row.prompt_tokens), count(row.completion_tokens),
    count(row.images), rate(row.audio_seconds), count(row.vectors),
    `${count(row.loads)}${row.load_failures ? ` (${row.load_failures} failed)` : ""}`,
    millis(row.p50_ms), millis(row.p95_ms), millis(row.ttft_p50_ms), millis(row.ttft_p95_ms),
    rate(row.tokens_per_s), count(row.lent), count(row.borrowed)].map((v) => h("td", { className: "num" }, v));
}
