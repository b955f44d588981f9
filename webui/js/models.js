// Models page: the merged inventory by public ID, with each replica's node, local ID, weights
// (same as the first replica's or different), loaded state and load/unload actions.

import { get, post } from "./api.js";
import { badge, h, replace, table } from "./dom.js";
import { refreshNow, showError } from "./app.js";

const CAPS = ["llm", "multimodal", "embeddings", "image", "stt", "tts"];

export function mount(container) {
  const body = h("div", { className: "cards" });
  replace(container, h("h1", {}, "Models"), body);
  return { container, body };
}

async function act(action, record, button) {
  button.disabled = true;
  button.textContent = action === "load" ? "Loading…" : "Unloading…";
  try {
    await post(`/router/v1/site/nodes/${action}`, { node_id: record.node_id, model: record.local_id });
  } catch (err) {
    showError(err);
  }
  refreshNow();
}

function group(models) {
  const groups = new Map();
  for (const record of models) {
    const key = record.public_id;
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(record);
  }
  return [...groups.entries()].sort((a, b) => a[0].localeCompare(b[0]));
}

function caps(record) {
  const c = record.capabilities || {};
  const words = CAPS.filter((w) => c[w]);
  if (c.context) words.push(`context ${c.context}`);
  return words.map((w) => badge(w, "cap"));
}

function modelCard(publicId, replicas) {
  const reference = replicas[0].model_hash;
  const rows = replicas.map((r) => {
    const same = r.model_hash === reference;
    return h("tr", { dataset: { nodeId: r.node_id, localId: r.local_id } },
      h("td", {}, r.node_id),
      h("td", {}, r.local_id),
      h("td", {}, replicas.length > 1 ? badge(same ? "same weights" : "different weights",
        same ? "same" : "different") : ""),
      h("td", {}, r.image_id || ""),
      h("td", {}, r.disabled ? badge("disabled", "bad")
        : !r.available ? badge("unavailable", "bad")
          : badge(r.loaded ? "loaded" : "not loaded", r.loaded ? "ok" : "idle")),
      h("td", {}, r.loaded
        ? h("button", { type: "button", className: "unload", onclick: (e) => act("unload", r, e.currentTarget) },
          "Unload")
        : h("button", { type: "button", className: "load", disabled: r.disabled || !r.available,
          onclick: (e) => act("load", r, e.currentTarget) }, "Load")));
  });
  return h("article", { className: "card model-card", dataset: { publicId } },
    h("header", {}, h("h2", {}, publicId), caps(replicas[0])),
    table(["node", "local ID", "weights", "image ID", "state", ""], rows, { className: "replicas" }));
}

export async function refresh(ctx) {
  const inventory = await get("/router/v1/site/inventory");
  const groups = group(inventory.models || []);
  if (groups.length === 0) {
    replace(ctx.body, h("p", { className: "empty" }, "no models in the cluster"));
    return;
  }
  replace(ctx.body, groups.map(([id, replicas]) => modelCard(id, replicas)));
}
