// Link picker: per lane (text, image), choose an anchor model; every model of the lane on another
// node is a candidate, labelled same/different weights, ineligible ones shown disabled with the
// reason.  The anchor lends to / borrows from the selected candidates, each with "load if
// unloaded" and "restore after borrow".  A first link to different weights is saved only after an
// explicit acknowledgement.  The lane's current links are listed and can be removed.  A standalone
// node (a site of one) has no other node to link to: the picker says links need a cluster.

import { ApiError, del, get, post, query } from "./api.js";
import { badge, h, replace, table } from "./dom.js";
import { confirm, showError } from "./shell.js";

const PATHS = { text: "/router/v1/site/text-routing-groups", image: "/router/v1/site/routing-groups" };

export function mount(container) {
  const ctx = { container, lane: "text", anchor: "", view: null, draft: null, dirty: false };
  ctx.laneBar = h("div", { className: "lanes" },
    ["text", "image"].map((lane) => h("button", { type: "button", className: "lane" + (lane === "text" ? " active" : ""),
      dataset: { lane }, onclick: () => {
        ctx.lane = lane;
        ctx.anchor = "";
        ctx.view = null;
        ctx.draft = null;
        for (const b of ctx.laneBar.querySelectorAll("button")) b.classList.toggle("active", b.dataset.lane === lane);
        load(ctx);
      } }, lane === "text" ? "Text lane" : "Image lane")));
  ctx.anchorSelect = h("select", { name: "anchor", onchange: (e) => {
    ctx.anchor = e.currentTarget.value;
    ctx.draft = null;
    load(ctx);
  } });
  ctx.editor = h("div", { className: "editor" });
  ctx.message = h("div", { className: "link-message" });
  ctx.current = h("div", { className: "current-links" });
  replace(container, h("h1", {}, "Link picker"), ctx.laneBar,
    h("section", {}, h("h2", {}, "Anchor"), h("label", {}, "model ", ctx.anchorSelect), ctx.message, ctx.editor),
    h("section", {}, h("h2", {}, "Current links of this lane"), ctx.current));
  return ctx;
}

function laneModels(lane, inventory) {
  const out = [];
  for (const r of inventory.models || []) {
    const c = r.capabilities || {};
    const id = lane === "image" ? (c.image ? r.image_id : null) : (c.llm ? r.local_id : null);
    if (id) out.push({ node_id: r.node_id, model_id: id });
  }
  out.sort((a, b) => (a.node_id + "/" + a.model_id).localeCompare(b.node_id + "/" + b.model_id));
  return out;
}

const splitAnchor = (value) => {
  const at = value.indexOf("/");
  return { node_id: value.slice(0, at), model_id: value.slice(at + 1) };
};

function draftFrom(view) {
  const draft = new Map();
  for (const c of view.candidates || []) {
    draft.set(c.node_id + "/" + c.model_id, {
      lends_to: { ...c.lends_to }, borrows_from: { ...c.borrows_from },
    });
  }
  return draft;
}

async function load(ctx) {
  try {
    const inventory = await get("/router/v1/site/inventory");
    const nodes = inventory.nodes || [];
    ctx.standalone = nodes.length > 0 && nodes.every((n) => n.role === "standalone");
    ctx.anchorSelect.disabled = ctx.standalone;
    const models = laneModels(ctx.lane, inventory);
    replace(ctx.anchorSelect, h("option", { value: "" }, "— choose a model —"),
      models.map((m) => h("option", { value: `${m.node_id}/${m.model_id}`,
        selected: `${m.node_id}/${m.model_id}` === ctx.anchor }, `${m.node_id} / ${m.model_id}`)));
    const anchor = ctx.anchor ? splitAnchor(ctx.anchor) : {};
    ctx.view = await get(PATHS[ctx.lane] + query(anchor));
    if (ctx.anchor && !ctx.draft) ctx.draft = draftFrom(ctx.view);
    render(ctx);
  } catch (err) {
    showError(err);
  }
}

function flagBox(entry, side, flag, disabled, ctx) {
  return h("label", { className: "flag" }, h("input", { type: "checkbox", name: `${side}.${flag}`,
    checked: Boolean(entry[side][flag]), disabled: disabled || !entry[side].selected,
    onchange: (e) => { entry[side][flag] = e.currentTarget.checked; } }),
  flag === "load_if_unloaded" ? "load if unloaded" : "restore after borrow");
}

function sideCell(entry, side, disabled, ctx) {
  return h("td", { className: side },
    h("label", { className: "select" }, h("input", { type: "checkbox", name: `${side}.selected`,
      checked: Boolean(entry[side].selected), disabled, onchange: (e) => {
        entry[side].selected = e.currentTarget.checked;
        render(ctx);
      } }), side === "lends_to" ? "lends to" : "borrows from"),
    flagBox(entry, side, "load_if_unloaded", disabled, ctx),
    flagBox(entry, side, "restore_after_borrow", disabled, ctx));
}

const CLUSTER_NEEDED = "Links need a cluster: a link lends work between models on two nodes, and this " +
  "node is standalone. Make it a master with slaves (or a slave of a master) to link its models.";

function render(ctx) {
  renderCurrent(ctx);
  if (ctx.standalone) {
    replace(ctx.editor, h("p", { className: "cluster-needed" }, CLUSTER_NEEDED));
    return;
  }
  if (!ctx.anchor || !ctx.view || !ctx.view.candidates) {
    replace(ctx.editor, h("p", { className: "empty" }, "choose the model whose links you want to edit"));
    return;
  }
  const anchor = ctx.view.anchor || {};
  const rows = ctx.view.candidates.map((c) => {
    const key = c.node_id + "/" + c.model_id;
    const entry = ctx.draft.get(key);
    const disabled = !c.eligible;
    return h("tr", { className: "candidate" + (disabled ? " ineligible" : ""), dataset: { candidate: key } },
      h("td", {}, c.node_id),
      h("td", {}, c.model_id),
      h("td", {}, badge(c.weights_match ? "same weights" : "different weights", c.weights_match ? "same" : "different")),
      h("td", { className: "eligibility" }, c.eligible ? badge("eligible", "ok")
        : h("span", { className: "reason" }, "not eligible: " + c.ineligible_reason)),
      sideCell(entry, "lends_to", disabled, ctx),
      sideCell(entry, "borrows_from", disabled, ctx));
  });
  replace(ctx.editor,
    anchor.eligible === false ? h("p", { className: "error" }, `this model cannot be linked: ${anchor.ineligible_reason}`) : null,
    rows.length ? table(["node", "model", "weights", "eligibility", "the anchor lends to it", "the anchor borrows from it"],
      rows, { className: "candidates" }) : h("p", { className: "empty" }, "no models of this lane on other nodes"),
    h("div", { className: "actions" },
      h("button", { type: "button", className: "save", onclick: () => save(ctx, false) }, "Save links"),
      h("button", { type: "button", className: "remove-all", onclick: () => removeAll(ctx) },
        "Remove every link of this model")));
}

function peers(ctx, side) {
  const out = [];
  for (const [key, entry] of ctx.draft) {
    if (!entry[side].selected) continue;
    const { node_id, model_id } = splitAnchor(key);
    out.push({ node_id, model_id, load_if_unloaded: Boolean(entry[side].load_if_unloaded),
      restore_after_borrow: Boolean(entry[side].restore_after_borrow) });
  }
  return out;
}

function confirmDifferentWeights(names) {
  return confirm({ title: "Link to different weights?", ok: "Confirm",
    acknowledge: "I understand: lend across different weights",
    body: [h("p", {}, "These models do not run the same weights as the anchor, so a lent request may be " +
      "answered differently than the model it names would answer it:"),
    h("ul", {}, names.map((n) => h("li", {}, n)))] });
}

async function save(ctx, acknowledged) {
  const body = { anchor: splitAnchor(ctx.anchor), lends_to: peers(ctx, "lends_to"),
    borrows_from: peers(ctx, "borrows_from") };
  if (acknowledged) body.acknowledge_different_weights = true;
  try {
    ctx.view = await post(PATHS[ctx.lane], body);
    ctx.draft = draftFrom(ctx.view);
    replace(ctx.message, h("div", { className: "ok" }, "links saved"));
    render(ctx);
  } catch (err) {
    if (err instanceof ApiError && err.code === "acknowledgement_required" && !acknowledged) {
      const names = (ctx.view.candidates || []).filter((c) => !c.weights_match && (
        ctx.draft.get(c.node_id + "/" + c.model_id).lends_to.selected
        || ctx.draft.get(c.node_id + "/" + c.model_id).borrows_from.selected))
        .map((c) => `${c.node_id} / ${c.model_id}`);
      if (await confirmDifferentWeights(names)) {
        await save(ctx, true);
      } else {
        replace(ctx.message, h("div", { className: "error" }, "not saved: the different weights were not acknowledged"));
      }
      return;
    }
    replace(ctx.message, h("div", { className: "error" }, `not saved: ${err.message}`));
  }
}

async function removeAll(ctx) {
  if (!await confirm({ title: `Remove every link of ${ctx.anchor.replace("/", " / ")}?`, ok: "Remove",
    body: "It neither lends to nor borrows from any model of this lane any more." })) return;
  try {
    const anchor = splitAnchor(ctx.anchor);
    await del(PATHS[ctx.lane] + query(anchor));
    ctx.draft = null;
    replace(ctx.message, h("div", { className: "ok" }, "every link of the model removed"));
    await load(ctx);
  } catch (err) {
    replace(ctx.message, h("div", { className: "error" }, `not removed: ${err.message}`));
  }
}

async function removeLink(ctx, link) {
  // Re-save the owner's links without this one (the other links of the owner stay as they are).
  const path = PATHS[ctx.lane];
  const name = (m) => `${m.node_id} / ${m.model_id}`;
  if (!await confirm({ title: `Remove the link ${name(link.owner)} → ${name(link.helper)}?`, ok: "Remove",
    body: `${name(link.owner)} no longer lends to ${name(link.helper)}; its other links stay.` })) return;
  try {
    const view = await get(path + query(link.owner));
    const helperKey = link.helper.node_id + "/" + link.helper.model_id;
    const keep = (side) => (view.candidates || []).filter((c) => c[side].selected
      && !(side === "lends_to" && c.node_id + "/" + c.model_id === helperKey))
      .map((c) => ({ node_id: c.node_id, model_id: c.model_id, load_if_unloaded: c[side].load_if_unloaded,
        restore_after_borrow: c[side].restore_after_borrow }));
    await post(path, { anchor: link.owner, lends_to: keep("lends_to"), borrows_from: keep("borrows_from") });
    replace(ctx.message, h("div", { className: "ok" },
      `removed ${link.owner.node_id}/${link.owner.model_id} → ${helperKey}`));
    ctx.draft = null;
    await load(ctx);
  } catch (err) {
    replace(ctx.message, h("div", { className: "error" }, `not removed: ${err.message}`));
  }
}

function renderCurrent(ctx) {
  const links = (ctx.view && ctx.view.links) || [];
  if (links.length === 0) {
    replace(ctx.current, h("p", { className: "empty" }, "no links in this lane"));
    return;
  }
  replace(ctx.current, table(["owner (lends)", "", "helper (borrows)", "load if unloaded", "restore after borrow", ""],
    links.map((l) => h("tr", { className: "link",
      dataset: { owner: `${l.owner.node_id}/${l.owner.model_id}`, helper: `${l.helper.node_id}/${l.helper.model_id}` } },
    h("td", {}, `${l.owner.node_id} / ${l.owner.model_id}`),
    h("td", {}, "→"),
    h("td", {}, `${l.helper.node_id} / ${l.helper.model_id}`),
    h("td", {}, l.load_if_unloaded ? "yes" : "no"),
    h("td", {}, l.restore_after_borrow ? "yes" : "no"),
    h("td", {}, h("button", { type: "button", className: "remove", onclick: () => removeLink(ctx, l) }, "Remove")))),
  { className: "links" }));
}

export async function refresh(ctx) {
  // The picker is edited by hand: it loads on entry and after each change, not on every tick
  // (a tick must not undo the operator's unsaved ticks).  The current links are refreshed.
  if (!ctx.view) {
    await load(ctx);
    return;
  }
  const view = await get(PATHS[ctx.lane]);
  ctx.view = { ...ctx.view, links: view.links };
  renderCurrent(ctx);
}
