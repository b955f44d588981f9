// Small DOM helpers: h() builds an element tree; nothing else touches innerHTML, so every value
// that came from the API is inserted as text.
//
// replace(el, ...children) makes `children` el's content by patching el in place (morphdom, vendored
// from npm at a pinned version, README "WebUI"): a refresh that draws the same page again changes only
// the text and attributes that differ, so what the operator is doing survives it — an open
// <details>, a text selection (a request ID being copied), the field being typed in, a click between
// press and release, a button whose action is in flight (aria-busy).  Elements with an `id` or a
// `data-key` (h(..., { dataset: { key } })) are matched by it, so a row keeps its place (and its
// state) when rows before it come or go; give keys unique within the patched element.  The nodes
// passed in are templates: the live elements are the old ones, so keep no reference to them (read
// the live element from the event: e.currentTarget); use swap() when you do.

import morphdom from "../vendor/morphdom/morphdom-esm.js";

/** The one listener h() adds per event type: it calls the element's current handler, which a patch
 * replaces by the new template's (morphdom copies attributes, not listeners). */
function dispatch(event) {
  const handler = event.currentTarget.routerdOn && event.currentTarget.routerdOn[event.type];
  return handler ? handler(event) : undefined;
}

function listen(el, type, handler) {
  if (!el.routerdOn) el.routerdOn = {};
  if (!(type in el.routerdOn)) el.addEventListener(type, dispatch);
  el.routerdOn[type] = handler;
}

export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      listen(el, name.slice(2).toLowerCase(), value);
    } else if (name === "dataset") {
      Object.assign(el.dataset, value);
    } else if (name === "className") {
      el.className = value;
    } else if (name in el && typeof value !== "string") {
      el[name] = value;
    } else {
      el.setAttribute(name, value === true ? "" : String(value));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else if (child instanceof Node) el.appendChild(child);
    else el.appendChild(document.createTextNode(String(child)));
  }
}

/** A field the operator may be typing in or choosing from (a focused checkbox needs no protection). */
function typing(el) {
  if (el !== document.activeElement) return false;
  if (el.tagName === "SELECT" || el.tagName === "TEXTAREA") return true;
  return el.tagName === "INPUT" && !["checkbox", "radio", "button", "submit", "reset"].includes(el.type);
}

const PATCH = {
  childrenOnly: true,
  getNodeKey: (node) => (node.nodeType === Node.ELEMENT_NODE
    ? node.getAttribute("id") || node.getAttribute("data-key") || undefined : undefined),
  onBeforeElUpdated(live, next) {
    const handlers = next.routerdOn || {};
    for (const type of Object.keys(handlers)) listen(live, type, handlers[type]);
    for (const type of Object.keys(live.routerdOn || {})) if (!(type in handlers)) live.routerdOn[type] = null;
    if (live.getAttribute("aria-busy") === "true") return false; // its action is in flight
    if (typing(live)) return false; // its value is the operator's until they leave it
    if (live.tagName === "DETAILS") next.open = live.open; // the operator opened or closed it
    if (live.tagName === "SELECT") {
      // morphdom selects the option carrying the attribute: the operator's choice while it is offered
      const kept = [...next.options].some((o) => o.value === live.value) ? live.value : next.value;
      for (const option of next.options) option.toggleAttribute("selected", option.value === kept);
    }
    return true;
  },
};

/** Line `live`'s keyed rows up with `next`'s before the patch: a row that went is removed, a row that
 * came gets an empty element of its own before the next row both have.  morphdom then patches every
 * row where it is; left alone, it would move every row after a new first one (and a moved node loses
 * the selection in it). */
function lineUp(live, next) {
  const wanted = new Set([...next.querySelectorAll("[data-key]")].map((el) => el.dataset.key));
  const have = new Map();
  for (const el of live.querySelectorAll("[data-key]")) {
    if (wanted.has(el.dataset.key)) have.set(el.dataset.key, el);
    else if (live.contains(el)) el.remove(); // not when a row it sat in went already
  }
  for (const el of next.querySelectorAll("[data-key]")) {
    if (have.has(el.dataset.key)) continue;
    let after = el.nextElementSibling;
    while (after && !have.has(after.dataset.key)) after = after.nextElementSibling;
    if (!after) continue; // a row at the end is appended, nothing moves
    const room = document.createElement(el.tagName);
    room.dataset.key = el.dataset.key;
    const anchor = have.get(after.dataset.key);
    anchor.parentNode.insertBefore(room, anchor);
    have.set(el.dataset.key, room);
  }
}

/** Make `children` the content of `el`, patching it in place (see the top of this file). */
export function replace(el, ...children) {
  const list = children.flat(Infinity);
  // A first fill, a <select>'s options (the page keeps the choice itself), or nodes that are
  // already in the document (the caller holds them): put these very nodes in.
  if (!el.firstChild || el.tagName === "SELECT" || list.some((c) => c instanceof Node && c.isConnected)) {
    return swap(el, ...list);
  }
  const next = document.createElement(el.tagName);
  append(next, list);
  lineUp(el, next);
  morphdom(el, next, PATCH);
  return el;
}

/** Make these very nodes the content of `el` (no patching): for nodes the caller keeps using. */
export function swap(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

export function table(head, rows, props) {
  return h("table", props || {},
    h("thead", {}, h("tr", {}, head.map((c) => h("th", {}, c)))),
    h("tbody", {}, rows));
}

export function badge(text, kind) {
  return h("span", { className: "badge " + (kind || text) }, text);
}

export function duration(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return "–";
  const value = Number(ms);
  if (Math.abs(value) < 1000) return `${Math.round(value)} ms`;
  if (Math.abs(value) < 60000) return `${(value / 1000).toFixed(1)} s`;
  const minutes = Math.floor(value / 60000);
  const seconds = Math.round((value % 60000) / 1000);
  if (minutes < 60) return `${minutes} min ${seconds} s`;
  return `${Math.floor(minutes / 60)} h ${minutes % 60} min`;
}

export function clock(ms) {
  if (!ms) return "–";
  const d = new Date(ms);
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

export function errorBox(errors) {
  if (!errors || errors.length === 0) return null;
  return h("div", { className: "node-errors" },
    errors.map((e) => h("div", { className: "error" }, `${e.node_id}: ${e.error}`)));
}
