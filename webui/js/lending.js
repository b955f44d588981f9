// Lending tab: the folded decision log of every node (lending-decisions.js), the live tail of new
// decisions (lending-tail.js), each node's build and settings sync, the live leases with a
// countdown, the lending settings, and the guardian models (site guardians: which multimodal
// model answers image requests to each text-only model, set per model, per node or for the cluster).

import { del, get, post, query } from "./api.js";
import { badge, duration, errorBox, h, replace, table } from "./dom.js";
import { mountDecisions, pair, refreshDecisions } from "./lending-decisions.js";
import { mountTail, startTail, stopTail } from "./lending-tail.js";
import { confirm } from "./shell.js";

export function mount(container) {
  const ctx = {
    container,
    edits: new Map(), // setting key -> text being edited
    leases: [],
    fetchedAt: 0,
  };
  ctx.nodes = h("div", {});
  ctx.leaseBox = h("div", {});
  ctx.settings = h("div", {});
  ctx.settingsMessage = h("div", { className: "settings-message" });
  mountGuardians(ctx);
  replace(container,
    h("h1", {}, "Lending"),
    mountDecisions(ctx),
    mountTail(ctx),
    h("div", { className: "columns" },
      h("section", { id: "lending-nodes" }, h("h2", {}, "Nodes"), ctx.nodes),
      h("section", { id: "leases" }, h("h2", {}, "Live leases"), ctx.leaseBox)),
    h("section", { id: "settings" }, h("h2", {}, "Settings"), ctx.settingsMessage, ctx.settings),
    ctx.guardians.section);
  ctx.ticker = setInterval(() => tickLeases(ctx), 200);
  startTail(ctx);
  return ctx;
}

export function unmount(ctx) {
  clearInterval(ctx.ticker);
  stopTail(ctx);
}

// -- nodes, leases -------------------------------------------------------------------------------

function renderNodes(ctx, summary) {
  const rows = summary.nodes.map((n) => h("tr", { dataset: { nodeId: n.node_id } },
    h("td", {}, n.node_id),
    h("td", {}, n.build_version),
    h("td", { className: "fingerprint", title: "what the node reports to show it is in sync: its lending " +
      "settings and the cluster's guardians together (the settings fingerprint when no guardian is set)" },
    (n.settings_fingerprint || "").slice(0, 12)),
    h("td", {}, n.in_sync ? badge("in sync", "ok") : badge("differs", "warn"))));
  replace(ctx.nodes, table(["node", "build", "sync fingerprint (settings + guardians)", "master's settings"], rows,
    { className: "sync" }), errorBox(summary.node_errors));
  const current = ctx.nodeSelect.value;
  const names = summary.nodes.map((n) => n.node_id);
  const known = [...ctx.nodeSelect.options].map((o) => o.value).slice(1);
  if (names.join("\n") !== known.join("\n")) {
    replace(ctx.nodeSelect, h("option", { value: "" }, "all nodes"),
      names.map((n) => h("option", { value: n, selected: n === current }, n)));
  }
}

function tickLeases(ctx) {
  const elapsed = performance.now() - ctx.fetchedAt;
  for (const cell of ctx.leaseBox.querySelectorAll("td.countdown")) {
    const left = Number(cell.dataset.expiresInMs) - elapsed;
    cell.textContent = left > 0 ? duration(left) : "expired";
    cell.classList.toggle("expired", left <= 0);
  }
}

function renderLeases(ctx, leases) {
  if (leases.length === 0) {
    replace(ctx.leaseBox, h("p", { className: "empty" }, "no live leases"));
    return;
  }
  replace(ctx.leaseBox, table(["lane", "owner", "helper", "slots", "kind", "expires in"],
    leases.map((l) => h("tr", { className: "lease" },
      h("td", {}, l.lane),
      h("td", {}, pair(l.owner_node_id, l.owner_model_id)),
      h("td", {}, pair(l.helper_node_id, l.helper_model_id)),
      h("td", {}, String(l.helper_slots)),
      h("td", {}, l.probe ? badge("probe", "warn") : badge("priced", "ok")),
      h("td", { className: "countdown", dataset: { expiresInMs: String(l.expires_in_ms) } },
        duration(l.expires_in_ms)))), { className: "leases" }));
}

// -- settings ------------------------------------------------------------------------------------

function show(value) {
  return value === null || value === undefined ? "–" : String(value);
}

async function applyEdits(ctx) {
  const values = Object.fromEntries(ctx.edits);
  try {
    const doc = await post("/router/v1/site/offload/settings", { values });
    ctx.edits.clear();
    replace(ctx.settingsMessage, h("div", { className: "ok" }, `saved ${Object.keys(values).length} setting(s)`));
    renderSettings(ctx, doc, true);
  } catch (err) {
    replace(ctx.settingsMessage, h("div", { className: "error" }, `not saved: ${err.message}`));
  }
}

async function clearOverride(ctx, key) {
  const asked = key
    ? { title: `Clear the override of ${key}?`, ok: "Clear",
      body: `Every node goes back to ${key}'s value from its config file (or the default).` }
    : { title: "Clear every override?", ok: "Clear every override",
      body: "Every setting changed here goes back to its value from the config files (or the default), on every node." };
  if (!await confirm(asked)) return;
  try {
    const doc = await del("/router/v1/site/offload/settings" + query({ key }));
    ctx.edits.delete(key);
    replace(ctx.settingsMessage, h("div", { className: "ok" }, key ? `cleared ${key}` : "cleared every override"));
    renderSettings(ctx, doc, true);
  } catch (err) {
    replace(ctx.settingsMessage, h("div", { className: "error" }, `not cleared: ${err.message}`));
  }
}

function renderSettings(ctx, doc, force) {
  if (ctx.edits.size > 0 && !force) return; // keep the operator's typing
  const editable = doc.editable !== false;
  const rows = doc.entries.map((e) => {
    const editing = ctx.edits.has(e.key);
    const value = editing
      ? h("input", { type: "text", name: e.key, value: ctx.edits.get(e.key),
        oninput: (ev) => ctx.edits.set(e.key, ev.currentTarget.value) })
      : show(e.effective);
    return h("tr", { dataset: { key: e.key, source: e.source } },
      h("td", { className: "key", title: e.description || "" }, e.key,
        e.override_error ? h("div", { className: "error" }, e.override_error) : null),
      h("td", {}, e.kind || ""),
      h("td", {}, show(e.default)),
      h("td", {}, show(e.config)),
      h("td", {}, show(e.override)),
      h("td", { className: "effective" }, value),
      h("td", {}, badge(e.source, "source")),
      h("td", {},
        editing ? null : h("button", { type: "button", className: "edit", disabled: !editable, onclick: () => {
          ctx.edits.set(e.key, String(e.effective ?? ""));
          renderSettings(ctx, doc, true);
          const input = ctx.settings.querySelector(`input[name="${e.key}"]`);
          if (input) input.focus();
        } }, "Edit"),
        e.override !== undefined && e.override !== null
          ? h("button", { type: "button", className: "clear", disabled: !editable,
            onclick: () => clearOverride(ctx, e.key) }, "Clear") : null));
  });
  replace(ctx.settings,
    h("p", { className: "fingerprint", title: "of the effective lending settings below only; the nodes " +
      "table's sync fingerprint also covers the guardians" }, `settings fingerprint ${doc.fingerprint}`),
    table(["setting", "kind", "default", "config", "override", "effective", "source", ""], rows,
      { className: "settings" }),
    h("div", { className: "actions" },
      h("button", { type: "button", className: "apply", disabled: ctx.edits.size === 0,
        onclick: () => applyEdits(ctx) }, `Apply ${ctx.edits.size} change(s)`),
      h("button", { type: "button", className: "discard", disabled: ctx.edits.size === 0, onclick: () => {
        ctx.edits.clear();
        renderSettings(ctx, doc, true);
      } }, "Discard"),
      h("button", { type: "button", className: "clear-all", disabled: !editable,
        onclick: () => clearOverride(ctx, "") }, "Clear every override")));
}

// -- guardians -----------------------------------------------------------------------------------

const GUARDIANS = "/router/v1/site/guardians";
const endpoint = (node, model) => `${node}/${model}`;

function scopeTarget(setting) {
  if (setting.scope === "model") return endpoint(setting.node_id, setting.model_id);
  if (setting.scope === "node") return setting.node_id;
  return "every text-only model";
}

/** Replace a select's options only when they changed, keeping the operator's choice. */
function setOptions(select, options, placeholder) {
  const wanted = options.map(([value, text]) => value + "\t" + text);
  const known = [...select.options].slice(placeholder ? 1 : 0).map((o) => o.value + "\t" + o.textContent);
  if (select.options.length > 0 && wanted.join("\n") === known.join("\n")) return;
  const current = select.value;
  replace(select, placeholder ? h("option", { value: "" }, placeholder) : null,
    options.map(([value, text]) => h("option", { value, selected: value === current }, text)));
}

function mountGuardians(ctx) {
  const g = { doc: null, nodes: [] };
  g.message = h("div", { className: "guardian-message" });
  g.applied = h("div", { className: "guardian-applied" });
  g.settings = h("div", { className: "guardian-settings" });
  g.scope = h("select", { name: "guardian-scope", onchange: () => renderGuardianForm(ctx) },
    ["model", "node", "cluster"].map((s) => h("option", { value: s, selected: s === "cluster" }, s)));
  g.target = h("select", { name: "guardian-target" });
  g.targetLabel = h("label", {}, "for ", g.target);
  g.guardian = h("select", { name: "guardian-model" });
  g.form = h("div", { className: "filters guardian-form" },
    h("label", {}, "scope ", g.scope), g.targetLabel, h("label", {}, "guardian ", g.guardian),
    h("button", { type: "button", className: "set-guardian save", onclick: () => setGuardian(ctx) }, "Set guardian"));
  g.section = h("section", { id: "guardians" }, h("h2", {}, "Guardians"),
    h("p", { className: "empty" }, "A request with an image addressed to a text-only model goes to its guardian " +
      "(a multimodal text model); the most specific setting wins: model, then node, then cluster."),
    h("div", { className: "columns" },
      h("div", {}, h("h3", {}, "Text-only models"), g.applied),
      h("div", {}, h("h3", {}, "Settings"), g.settings, h("h3", {}, "Set a guardian"), g.form, g.message)));
  ctx.guardians = g;
}

function renderGuardianForm(ctx) {
  const g = ctx.guardians;
  const doc = g.doc || { candidates: [], text_models: [] };
  const scope = g.scope.value;
  g.targetLabel.hidden = scope === "cluster";
  if (scope === "model") {
    setOptions(g.target, doc.text_models.map((m) => [endpoint(m.node_id, m.model_id),
      `${m.node_id} / ${m.model_id}`]), "— text-only model —");
  } else if (scope === "node") {
    setOptions(g.target, g.nodes.map((n) => [n, n]), "— node —");
  }
  setOptions(g.guardian, doc.candidates.map((c) => [endpoint(c.node_id, c.model_id),
    `${c.node_id} / ${c.model_id}${c.available ? "" : " (unavailable)"}`]), "— multimodal model —");
}

function renderGuardians(ctx, doc) {
  const g = ctx.guardians;
  g.doc = doc;
  const applied = doc.text_models.map((m) => h("tr", { className: "text-model",
    dataset: { model: endpoint(m.node_id, m.model_id), scope: m.guardian ? m.guardian.scope : "" } },
  h("td", {}, m.node_id),
  h("td", {}, m.model_id),
  h("td", { className: "guardian" }, m.guardian ? endpoint(m.guardian.node_id, m.guardian.model_id) : "none"),
  h("td", {}, m.guardian ? badge(m.guardian.scope, "scope") : "")));
  replace(g.applied, applied.length
    ? table(["node", "model", "guardian", "from"], applied, { className: "guardian-applied" })
    : h("p", { className: "empty" }, "no text-only models in the cluster"));
  const rows = doc.guardians.map((s) => h("tr", { className: "guardian-setting",
    dataset: { scope: s.scope, target: s.scope === "cluster" ? "" : scopeTarget(s) } },
  h("td", {}, badge(s.scope, "scope")),
  h("td", {}, scopeTarget(s)),
  h("td", { className: "guardian" }, endpoint(s.guardian.node_id, s.guardian.model_id)),
  h("td", {}, h("button", { type: "button", className: "remove-guardian", onclick: () => removeGuardian(ctx, s) },
    "Remove"))));
  replace(g.settings, rows.length
    ? table(["scope", "applies to", "guardian", ""], rows, { className: "guardian-settings" })
    : h("p", { className: "empty" }, "no guardian set"));
  renderGuardianForm(ctx);
}

function guardianError(ctx, err) {
  // The section stays usable when the guardians API cannot answer (e.g. a master without a store).
  replace(ctx.guardians.applied, h("p", { className: "error" }, `guardians unavailable: ${err.message}`));
}

async function setGuardian(ctx) {
  const g = ctx.guardians;
  const scope = g.scope.value;
  const body = { scope };
  if (!g.guardian.value) {
    replace(g.message, h("div", { className: "error" }, "not set: choose a guardian"));
    return;
  }
  const guardian = splitEndpoint(g.guardian.value);
  body.guardian = guardian;
  if (scope !== "cluster") {
    if (!g.target.value) {
      replace(g.message, h("div", { className: "error" }, `not set: choose the ${scope}`));
      return;
    }
    if (scope === "model") Object.assign(body, splitEndpoint(g.target.value));
    else body.node_id = g.target.value;
  }
  try {
    renderGuardians(ctx, await post(GUARDIANS, body));
    replace(g.message, h("div", { className: "ok" },
      `guardian of ${scope === "cluster" ? "the cluster" : `${scope} ${g.target.value}`} set to ` +
      endpoint(guardian.node_id, guardian.model_id)));
  } catch (err) {
    replace(g.message, h("div", { className: "error" }, `not set: ${err.message}`));
  }
}

async function removeGuardian(ctx, setting) {
  const g = ctx.guardians;
  const what = `the ${setting.scope} guardian` + (setting.scope === "cluster" ? "" : ` of ${scopeTarget(setting)}`);
  if (!await confirm({ title: `Remove ${what}?`, ok: "Remove",
    body: "The text-only models it covered fall back to a less specific guardian, if one is set." })) return;
  try {
    const doc = await del(GUARDIANS + query({ scope: setting.scope, node_id: setting.node_id,
      model_id: setting.model_id }));
    renderGuardians(ctx, doc);
    replace(g.message, h("div", { className: "ok" }, `removed the ${setting.scope} guardian` +
      (setting.scope === "cluster" ? "" : ` of ${scopeTarget(setting)}`)));
  } catch (err) {
    replace(g.message, h("div", { className: "error" }, `not removed: ${err.message}`));
  }
}

function splitEndpoint(value) {
  const at = value.indexOf("/");
  return { node_id: value.slice(0, at), model_id: value.slice(at + 1) };
}

// -- refresh -------------------------------------------------------------------------------------

export async function refresh(ctx) {
  const [timings, summary, settings, guardians] = await Promise.all([
    refreshDecisions(ctx),
    get("/router/v1/site/offload/summary"),
    get("/router/v1/site/offload/settings"),
    get(GUARDIANS).catch((err) => err),
  ]);
  ctx.fetchedAt = performance.now();
  ctx.leases = summary.leases || [];
  renderNodes(ctx, summary);
  renderLeases(ctx, ctx.leases);
  renderSettings(ctx, settings, false);
  ctx.guardians.nodes = summary.nodes.map((n) => n.node_id);
  if (guardians instanceof Error) guardianError(ctx, guardians);
  else renderGuardians(ctx, guardians);
  window.routerdTimings = timings;
}
