// Models page: the merged inventory by public ID, with each replica's node, local ID, weights
// (same as the first replica's or different), loaded state, load/unload actions and what kept it
// warm since its node started (the master's affinity hits and misses, keys moved by the load bound,
// choices by load; the node's switches avoided and KV slots kept); then the split recipes (site recipes: one public model made of components on several nodes), listed,
// created from the models of the cluster (one component per lane) and deleted.

import { del, get, post, query } from "./api.js";
import { badge, h, replace, table } from "./dom.js";
import { bytes, optional } from "./figures.js";
import { act, confirm, refreshNow, showError } from "./shell.js";

const CAPS = ["llm", "multimodal", "embeddings", "image", "stt", "tts"];

// The lanes a recipe may name, and which models serve each (the server's rule: text an LLM,
// embeddings an embedding model, image an image model with an image ID, voice speech to text or
// text to speech).  No backend family of this build serves music, so it is not offered.
const LANES = [
  ["text", (c) => c.llm],
  ["embeddings", (c) => c.embeddings],
  ["image", (c, r) => c.image && Boolean(r.image_id)],
  ["voice", (c) => c.stt || c.tts],
];
const RECIPE_LANES = ["text", "embeddings", "image", "voice", "music"];
const RECIPES = "/router/v1/site/recipes";

export function mount(container) {
  const body = h("div", { className: "cards" });
  const recipes = mountRecipes();
  replace(container, h("h1", {}, "Models"), body, recipes.section);
  return { container, body, recipes };
}

function loadOrUnload(action, record, button) {
  // the result stays in a notice until dismissed; "loading…" is the runtime's own state (below)
  return act({ label: `${action === "load" ? "Load" : "Unload"} ${record.local_id} on ${record.node_id}`, button,
    run: () => post(`/router/v1/site/nodes/${action}`, { node_id: record.node_id, model: record.local_id }) });
}

// What a node's runtime is doing with a model now (site nodes/states): loading, unloading or nothing.
const BUSY = { switching: "loading…", loading: "loading…", stopping: "unloading…" };

function busyModels(states) {
  const busy = new Map();
  for (const state of (states && states.states) || []) {
    for (const rt of state.runtimes || []) {
      if (rt.model_id && BUSY[rt.state]) busy.set(`${state.node_id}/${rt.model_id}`, BUSY[rt.state]);
    }
  }
  return busy;
}

// What kept each replica warm, from the same tallies /metrics reads: the master's replica choices
// (site inventory replica_choices, by public ID and node) and each node's swap order and kept KV
// slots (its /state warm, by local ID).  Only counts above 0 are said.
function warmth(inventory, states) {
  const choices = new Map();
  for (const c of inventory.replica_choices || []) choices.set(`${c.public_id}/${c.node_id}`, c);
  const warm = new Map();
  for (const state of (states && states.states) || []) {
    for (const [localId, w] of Object.entries(state.warm || {})) warm.set(`${state.node_id}/${localId}`, w);
  }
  return (record) => warmWords(choices.get(`${record.public_id}/${record.node_id}`) || {},
    warm.get(`${record.node_id}/${record.local_id}`) || {});
}

function warmWords(c, w) {
  const n = (v) => Number(v || 0);
  const words = [];
  if (n(c.affinity_hits) + n(c.affinity_misses) > 0) {
    words.push(`affinity ${n(c.affinity_hits)} hit / ${n(c.affinity_misses)} miss`);
  }
  if (n(c.bound_moves) > 0) words.push(`${n(c.bound_moves)} moved by the load bound`);
  if (n(c.least_loaded) > 0) words.push(`${n(c.least_loaded)} by load`);
  if (n(w.swaps_avoided) + n(w.swap_batch_served) > 0) {
    words.push(`${n(w.swaps_avoided)} swaps avoided (${n(w.swap_batch_served)} served first)`);
  }
  if (n(w.kv_slots_saved) + n(w.kv_slots_restored) > 0) {
    words.push(`slots ${n(w.kv_slots_saved)} saved (${bytes(n(w.kv_bytes_saved))}) / ` +
      `${n(w.kv_slots_restored)} restored (${bytes(n(w.kv_bytes_restored))})`);
  }
  return words;
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

function modelCard(publicId, replicas, busy, warmOf) {
  const reference = replicas[0].model_hash;
  const warm = replicas.map(warmOf);
  const showWarm = warm.some((words) => words.length > 0); // the column only where something was kept warm
  const rows = replicas.map((r, i) => {
    const same = r.model_hash === reference;
    const doing = busy.get(`${r.node_id}/${r.local_id}`);
    return h("tr", { dataset: { nodeId: r.node_id, localId: r.local_id } },
      h("td", {}, r.node_id),
      h("td", {}, r.local_id),
      h("td", {}, replicas.length > 1 ? badge(same ? "same weights" : "different weights",
        same ? "same" : "different") : ""),
      h("td", {}, r.public_image_id || r.image_id || "",
        r.image_id && r.public_image_id && r.image_id !== r.public_image_id
          ? h("small", { className: "model-where" }, r.image_id) : null),
      h("td", {}, r.disabled ? badge("disabled", "bad")
        : doing ? badge(doing, "rt-loading")
          : !r.available ? badge("unavailable", "bad")
            : badge(r.loaded ? "loaded" : "not loaded", r.loaded ? "ok" : "idle")),
      h("td", {}, r.loaded
        ? h("button", { type: "button", className: "unload", disabled: Boolean(doing),
          onclick: (e) => loadOrUnload("unload", r, e.currentTarget) }, "Unload")
        : h("button", { type: "button", className: "load", disabled: r.disabled || !r.available || Boolean(doing),
          onclick: (e) => loadOrUnload("load", r, e.currentTarget) }, doing === "loading…" ? "Loading…" : "Load")),
      showWarm ? h("td", { className: "warm" }, warm[i].join(" · ")) : null);
  });
  return h("article", { className: "card model-card", dataset: { publicId, key: "model/" + publicId } },
    h("header", {}, h("h2", {}, publicId), caps(replicas[0])),
    table(["node", "local ID", "weights", "public image ID", "state", "", ...(showWarm ? ["kept warm"] : [])], rows,
      { className: "replicas" }));
}

// -- recipes -------------------------------------------------------------------------------------

function mountRecipes() {
  const r = { lanes: {} };
  r.list = h("div", { className: "recipe-list" });
  r.message = h("div", { className: "recipe-message" });
  r.id = h("input", { type: "text", name: "recipe-id", placeholder: "id", required: true });
  r.publicId = h("input", { type: "text", name: "recipe-public-id", placeholder: "defaults to the id" });
  r.publicImageId = h("input", { type: "text", name: "recipe-public-image-id",
    placeholder: "<public ID>-image" });
  r.overwrite = h("input", { type: "checkbox", name: "recipe-overwrite" });
  for (const [lane] of LANES) r.lanes[lane] = h("select", { name: `recipe-${lane}` });
  r.form = h("form", { className: "recipe-form", onsubmit: (e) => { e.preventDefault(); createRecipe(r); } },
    h("div", { className: "filters" },
      h("label", {}, "id ", r.id),
      h("label", {}, "public ID ", r.publicId),
      h("label", {}, "public image ID ", r.publicImageId)),
    h("div", { className: "filters" }, LANES.map(([lane]) => h("label", {}, lane + " ", r.lanes[lane]))),
    h("div", { className: "actions" },
      h("button", { type: "submit", className: "create-recipe save" }, "Create recipe"),
      h("label", {}, r.overwrite, " replace a recipe of the same id")));
  r.section = h("section", { id: "recipes" }, h("h2", {}, "Recipes"),
    h("p", { className: "empty" }, "A recipe is one public model made of components on several nodes: " +
      "each lane's requests go to its component."),
    r.list, h("h3", {}, "New recipe"), r.form, r.message);
  return r;
}

const endpoint = (c) => `${c.node_id}/${c.model_id}`;

function laneOptions(r, models) {
  for (const [lane, serves] of LANES) {
    const select = r.lanes[lane];
    const options = models.filter((m) => serves(m.capabilities || {}, m))
      .map((m) => endpoint({ node_id: m.node_id, model_id: m.local_id }))
      .sort();
    const known = [...select.options].slice(1).map((o) => o.value);
    if (select.options.length > 0 && options.join("\n") === known.join("\n")) continue; // keep the choice
    const current = select.value;
    select.disabled = options.length === 0;
    select.title = options.length === 0 ? `no model of the cluster serves the ${lane} lane` : "";
    replace(select, h("option", { value: "" }, "— none —"),
      options.map((value) => h("option", { value, selected: value === current }, value.replace("/", " / "))));
  }
}

function recipeRow(r, recipe) {
  const parts = RECIPE_LANES.filter((lane) => recipe[lane])
    .map((lane) => h("div", { className: "component", dataset: { lane } },
      badge(lane, "cap"), " ", `${recipe[lane].node_id} / ${recipe[lane].model_id}`));
  return h("tr", { className: "recipe", dataset: { recipeId: recipe.id } },
    h("td", {}, recipe.id),
    h("td", { className: "public-ids" }, recipe.public_id,
      recipe.public_image_id ? h("div", {}, recipe.public_image_id) : null),
    h("td", { className: "components" }, parts),
    h("td", {}, h("button", { type: "button", className: "delete-recipe",
      onclick: () => deleteRecipe(r, recipe.id) }, "Delete")));
}

function renderRecipes(r, recipes) {
  replace(r.list, recipes.length
    ? table(["id", "public IDs", "components", ""], recipes.map((recipe) => recipeRow(r, recipe)),
      { className: "recipes" })
    : h("p", { className: "empty" }, "no recipes"));
}

async function createRecipe(r) {
  const body = { id: r.id.value.trim() };
  if (r.publicId.value.trim()) body.public_id = r.publicId.value.trim();
  if (r.publicImageId.value.trim()) body.public_image_id = r.publicImageId.value.trim();
  for (const [lane] of LANES) {
    const value = r.lanes[lane].value;
    if (!value) continue;
    const at = value.indexOf("/");
    body[lane] = { node_id: value.slice(0, at), model_id: value.slice(at + 1) };
  }
  if (r.overwrite.checked) body.overwrite = true;
  try {
    const saved = await post(RECIPES, body);
    replace(r.message, h("div", { className: "ok" }, `recipe ${saved.recipe.id} saved`));
    r.overwrite.checked = false;
    await reloadRecipes(r);
  } catch (err) {
    replace(r.message, h("div", { className: "error" }, `not saved: ${err.message}`));
  }
}

async function deleteRecipe(r, id) {
  if (!await confirm({ title: `Delete the recipe ${id}?`, ok: "Delete",
    body: "Its public model leaves the cluster; the models it is made of stay." })) return;
  try {
    await del(RECIPES + query({ id }));
    replace(r.message, h("div", { className: "ok" }, `recipe ${id} deleted`));
    await reloadRecipes(r);
  } catch (err) {
    replace(r.message, h("div", { className: "error" }, `not deleted: ${err.message}`));
  }
}

async function reloadRecipes(r) {
  try {
    renderRecipes(r, (await get(RECIPES)).recipes || []);
  } catch (err) {
    showError(err);
  }
  refreshNow();
}

// -- refresh -------------------------------------------------------------------------------------

export async function refresh(ctx) {
  const [inventory, states] = await Promise.all([get("/router/v1/site/inventory"),
    optional("/router/v1/site/nodes/states")]);
  const models = inventory.models || [];
  renderRecipes(ctx.recipes, inventory.recipes || []);
  laneOptions(ctx.recipes, models);
  const groups = group(models);
  if (groups.length === 0) {
    replace(ctx.body, h("p", { className: "empty" }, "no models in the cluster"));
    return;
  }
  const busy = busyModels(states);
  const warmOf = warmth(inventory, states);
  replace(ctx.body, groups.map(([id, replicas]) => modelCard(id, replicas, busy, warmOf)));
}
