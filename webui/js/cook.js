// Cook: build a model config (.kcpps) on one node from the files under its models.file_roots:
// pick the node, the files (each slot offers the files of its kind, as the node read it from the file:
// GET /cook/files gives each file's `fields`) and the settings, Preview (the config and what `routerd check` says of
// it), Apply (written into the node's models folder and rescanned: the model appears in the
// inventory). The configs Cook wrote on that node are listed with Delete.

import { del, get, post, query } from "./api.js";
import { badge, h, replace, table } from "./dom.js";
import { act, refreshNow } from "./shell.js";

const FIELDS = [
  ["model", "weights (text model)"], ["mmproj", "vision projector (mmproj)"],
  ["embeddingsmodel", "embeddings model"], ["sdmodel", "image model"],
  ["whispermodel", "whisper model"], ["ttsmodel", "TTS model"],
];

function input(name, props) {
  return h("input", { name, id: "cook-" + name, ...props });
}

export function mount(container) {
  const ctx = { container, node: "", filesKey: "", nodesKey: "" };
  ctx.nodeSelect = h("select", { name: "node_id", id: "cook-node", onchange: (e) => {
    ctx.node = e.currentTarget.value;
    ctx.filesKey = "";
    refreshNow();
  } });
  ctx.files = new Map(FIELDS.map(([name]) => [name, h("select", { name, id: "cook-" + name })]));
  ctx.id = input("id", { type: "text", placeholder: "local model ID", required: true });
  ctx.context = input("contextsize", { type: "number", min: 0, placeholder: "from the model" });
  ctx.parallel = input("parallel", { type: "number", min: 1, placeholder: "1" });
  ctx.gpulayers = input("gpulayers", { type: "number", min: -1, placeholder: "backend default" });
  ctx.extra = input("extra_args", { type: "text", placeholder: "--flashattention --threads 8" });
  ctx.replace = input("replace", { type: "checkbox" });
  ctx.rootsNote = h("p", { className: "empty" });
  ctx.result = h("div", { id: "cook-result" }, h("p", { className: "empty" }, "Preview to see the config."));
  ctx.cooked = h("div", { id: "cooked-list" });
  const row = (label, el) => h("tr", {}, h("th", {}, h("label", { htmlFor: el.id }, label)), h("td", {}, el));
  replace(container, h("h1", {}, "Cook"),
    h("p", { className: "empty" }, "Build a model config from the files a node's models.file_roots expose. " +
      "Preview shows the config and what routerd check says of it; Apply writes it on that node and rescans. " +
      "A split recipe across nodes is made on the Models page (Recipes)."),
    h("div", { className: "cook-grid" }, h("section", { id: "cook-form" },
      h("table", { className: "form" }, h("tbody", {},
        row("node", ctx.nodeSelect), row("model ID", ctx.id),
        FIELDS.map(([name, label]) => row(label, ctx.files.get(name))),
        row("context size", ctx.context), row("parallel", ctx.parallel), row("GPU layers", ctx.gpulayers),
        row("extra args", ctx.extra), row("replace an existing config", ctx.replace))),
      ctx.rootsNote,
      h("div", { className: "actions" },
        h("button", { type: "button", className: "preview", onclick: () => submit(ctx, "preview") }, "Preview"),
        h("button", { type: "button", className: "apply", onclick: () => submit(ctx, "apply") }, "Apply"))),
    h("section", { id: "cook-preview" }, h("h2", {}, "Config"), ctx.result)),
    h("section", { id: "cooked" }, h("h2", {}, "Configs Cook wrote on this node"), ctx.cooked));
  return ctx;
}

function order(ctx) {
  const body = { node_id: ctx.node, id: ctx.id.value.trim(), files: {} };
  for (const [name, el] of ctx.files) if (el.value) body.files[name] = el.value;
  const number = (el) => (el.value === "" ? undefined : Number(el.value));
  for (const [key, el] of [["contextsize", ctx.context], ["parallel", ctx.parallel], ["gpulayers", ctx.gpulayers]]) {
    const value = number(el);
    if (value !== undefined) body[key] = value;
  }
  const extra = ctx.extra.value.trim();
  if (extra) body.extra_args = extra.split(/\s+/);
  if (ctx.replace.checked) body.replace = true;
  return body;
}

function showResult(ctx, answer, applied) {
  const check = answer.check || { ok: true, errors: [] };
  replace(ctx.result,
    h("div", { className: "cook-outcome" },
      applied ? badge("applied", "ok") : badge("preview", "queued"), " ",
      check.ok ? badge("routerd check: ok", "ok") : badge("routerd check: " + check.errors.length + " problem(s)", "bad"), " ",
      h("span", {}, `${answer.node_id}: ${answer.filename}` + (answer.exists && !applied ? " (exists: tick replace to overwrite)" : "")),
      " ", (answer.model && answer.model.capabilities || []).map((c) => badge(c, "cap"))),
    check.ok ? null : h("ul", { className: "check-errors" }, check.errors.map((e) => h("li", { className: "error" }, e))),
    h("pre", { className: "kcpps" }, JSON.stringify(answer.config, null, 1)));
}

async function submit(ctx, what) {
  try {
    const answer = await post("/router/v1/site/cook/" + what, order(ctx));
    showResult(ctx, answer, what === "apply");
    if (what === "apply") ctx.filesKey = "";
  } catch (err) {
    replace(ctx.result, h("p", { className: "error cook-error" }, `${err.status} ${err.code}: ${err.message}`));
  }
  refreshNow();
}

function remove(ctx, id, button) {
  const node = ctx.node;
  return act({ label: `Delete ${id} on ${node}`, button,
    ask: { title: `Delete the config ${id} on ${node}?`, ok: "Delete",
      body: `Cook's ${id}.kcpps is removed from ${node}'s models folder and the model leaves the inventory; ` +
        "the weights files stay." },
    run: async () => {
      await del("/router/v1/site/cook/" + encodeURIComponent(id) + query({ node_id: node }));
      ctx.filesKey = "";
    } });
}

export async function refresh(ctx) {
  const inventory = await get("/router/v1/site/inventory");
  const nodes = (inventory.nodes || []).map((n) => n.node_id);
  if (JSON.stringify(nodes) !== ctx.nodesKey) {
    ctx.nodesKey = JSON.stringify(nodes);
    replace(ctx.nodeSelect, nodes.map((n) => h("option", { value: n }, n)));
    if (!nodes.includes(ctx.node)) ctx.node = nodes[0] || "";
    ctx.nodeSelect.value = ctx.node;
  }
  if (!ctx.node) return;
  let doc;
  try {
    doc = await get("/router/v1/site/cook/files" + query({ node_id: ctx.node }));
  } catch (err) {
    replace(ctx.rootsNote, h("span", { className: "error" }, err.message));
    return;
  }
  const key = JSON.stringify([ctx.node, doc.files, doc.cooked]);
  if (key === ctx.filesKey) return;
  ctx.filesKey = key;
  ctx.rootsNote.textContent = doc.file_roots
    ? `${doc.files.length} file(s) under ${doc.file_roots} file root(s) of ${doc.node_id}`
    : `${doc.node_id} has no models.file_roots: set them in its config to cook there`;
  for (const [field, el] of ctx.files) {
    const current = el.value;
    const offered = doc.files.filter((f) => !f.fields || f.fields.includes(field));
    replace(el, h("option", { value: "" }, "—"), offered.map((f) =>
      h("option", { value: f.path, dataset: { kind: f.kind || "" } }, f.detail ? `${f.path} (${f.detail})` : f.path)));
    if (offered.some((f) => f.path === current)) el.value = current;
  }
  replace(ctx.cooked, (doc.cooked || []).length
    ? table(["model ID", "files", ""], doc.cooked.map((c) => h("tr", { dataset: { id: c.id } },
      h("td", {}, c.id), h("td", {}, Object.entries(c.files).map(([k, v]) => h("div", {}, `${k}: ${v}`))),
      h("td", {}, h("button", { type: "button", className: "delete", onclick: (e) => remove(ctx, c.id, e.currentTarget) }, "Delete")))),
    { className: "cooked" })
    : h("p", { className: "empty" }, "none"));
}
